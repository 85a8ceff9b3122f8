"""The FrozenLake environment (the setup of RAGEN-2, arXiv 2604.06268): 4×4 random map, holes end the episode, optional slip."""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from envs.base import reject_options
from envs.frozenlake.lake import (
    ACTIONS,
    FROZEN,
    GOAL,
    HOLE,
    START,
    Lake,
    check_lake,
    find,
    generate_lake,
    move,
    sample_direction,
)
from envs.frozenlake.teach import explain
from envs.grid import GridConfig, GridEnv
from envs.palette import Tile
from envs.registry import register_env

GOAL_REWARD = 1.0

# Text symbols of the state shown to the agent.
PLAYER, ICE, HOLE_SYMBOL, GOAL_SYMBOL, PLAYER_IN_HOLE, PLAYER_ON_GOAL = "P", "_", "O", "G", "X", "√"
_TEXT = {START: ICE, FROZEN: ICE, HOLE: HOLE_SYMBOL, GOAL: GOAL_SYMBOL}
_ON = {START: PLAYER, FROZEN: PLAYER, HOLE: PLAYER_IN_HOLE, GOAL: PLAYER_ON_GOAL}


class FrozenLakeConfig(GridConfig):
    size: int = Field(4, ge=2, le=12, description="Map side in cells.")
    p_frozen: float = Field(
        0.9, gt=0.0, le=1.0, description="Probability that a cell is frozen (not a hole)."
    )
    slip: float = Field(
        0.0, ge=0.0, le=1.0, description="Probability a move goes perpendicular instead (slip/2 each side)."
    )


_ICE = (200, 228, 245)
_PLAYER = ("circle", (200, 50, 50))


@register_env("frozenlake")
class FrozenLakeEnv(GridEnv):
    """Walk from the start to the goal across the ice without falling into a hole."""

    config_class = FrozenLakeConfig
    valid_actions = list(ACTIONS)
    answer_format = "one or more of Left, Down, Right, Up, separated by ||"
    palette = {
        ICE: Tile(_ICE),
        HOLE_SYMBOL: Tile((30, 40, 80)),
        GOAL_SYMBOL: Tile(_ICE, (("square", (230, 190, 40)),)),
        PLAYER: Tile(_ICE, (_PLAYER,)),
        PLAYER_IN_HOLE: Tile((30, 40, 80), (("cross", (200, 50, 50)),)),
        PLAYER_ON_GOAL: Tile(_ICE, (("square", (230, 190, 40)), _PLAYER)),
    }

    lake: Lake
    pos: tuple[int, int]

    @property
    def instruction(self) -> str:
        slippery = (
            f" The ice is slippery: with probability {self.config.slip:g} a move goes to one of the two "
            "perpendicular directions instead."
            if self.config.slip > 0
            else ""
        )
        return (
            "You are playing FrozenLake. Walk from your position to the goal without stepping into a hole; "
            "a hole ends the game. "
            f"Symbols: {PLAYER} player, {ICE} frozen ice, {HOLE_SYMBOL} hole, {GOAL_SYMBOL} goal, "
            f"{PLAYER_IN_HOLE} player in a hole, {PLAYER_ON_GOAL} player on the goal. "
            "Positions are (row, column) from (0, 0) at the top-left. "
            "Actions: Left, Down, Right, Up; moving off the map leaves you in place. "
            f"Reward: {GOAL_REWARD:g} for reaching the goal, 0 otherwise.{slippery}"
        )

    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        reject_options(self, options, ("lake",))
        if "lake" in options:
            self.lake = check_lake(options["lake"])
        else:
            self.lake = generate_lake(rng, self.config.size, self.config.p_frozen)
        self.pos = find(self.lake, START)

    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        direction = sample_direction(self.rng, action, self.config.slip)
        self.pos = move(self.lake, self.pos, direction)
        cell = self.lake[self.pos[0]][self.pos[1]]
        success = cell == GOAL
        info = {"success": success, "direction": direction, "slipped": direction != action}
        return (GOAL_REWARD if success else 0.0), cell in (HOLE, GOAL), info

    def render_text(self) -> str:
        return "\n".join(
            "".join((_ON if (r, c) == self.pos else _TEXT)[ch] for c, ch in enumerate(row))
            for r, row in enumerate(self.lake)
        )

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        n_actions = min(self.max_actions_per_turn, self.actions_left)
        return explain(self.lake, self.pos, n_actions, self.config.slip, rng)
