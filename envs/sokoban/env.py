"""The Sokoban environment (the setup of RAGEN-2, arXiv 2604.06268): 6×6 with one box by default, 8×8 with two as `sokoban_8x8`."""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, model_validator

from envs.base import reject_options
from envs.grid import GridConfig, GridEnv
from envs.palette import Tile
from envs.registry import register_env
from envs.sokoban import room as sym
from envs.sokoban.generate import generate_room
from envs.sokoban.room import DIRECTIONS, Room
from envs.sokoban.solver import solve
from envs.sokoban.teach import explain

STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_REWARD = -1.0
SOLVED_REWARD = 10.0


class SokobanConfig(GridConfig):
    size: int = Field(6, ge=4, le=12, description="Room side in cells, border wall included.")
    num_boxes: int = Field(1, ge=1, le=4, description="Boxes (and targets) in the room.")
    search_depth: int = Field(30, ge=1, le=1000, description="Reverse-play moves when generating a room.")
    solvable_within_budget: bool = Field(
        True, description="Only keep rooms whose optimal solution fits in max_actions moves."
    )

    @model_validator(mode="after")
    def _room_fits(self) -> SokobanConfig:
        if 2 * (self.num_boxes + 1) > (self.size - 2) ** 2:
            raise ValueError(f"num_boxes={self.num_boxes} does not fit in a {self.size}x{self.size} room")
        return self


class LargeSokobanConfig(SokobanConfig):
    size: int = Field(8, ge=4, le=12, description="Room side in cells, border wall included.")
    num_boxes: int = Field(2, ge=1, le=4, description="Boxes (and targets) in the room.")


_FLOOR = (222, 214, 196)
_TARGET = ("ring", (200, 40, 40))
_PLAYER = ("circle", (40, 90, 200))


@register_env("sokoban")
class SokobanEnv(GridEnv):
    """Push every box onto a target within the action budget."""

    config_class = SokobanConfig
    valid_actions = list(DIRECTIONS)
    answer_format = "one or more of Up, Down, Left, Right, separated by ||"
    palette = {
        sym.WALL: Tile((92, 64, 51)),
        sym.FLOOR: Tile(_FLOOR),
        sym.TARGET: Tile(_FLOOR, (_TARGET,)),
        sym.BOX: Tile(_FLOOR, (("square", (170, 110, 40)),)),
        sym.BOX_ON_TARGET: Tile(_FLOOR, (("square", (60, 160, 70)),)),
        sym.PLAYER: Tile(_FLOOR, (_PLAYER,)),
        sym.PLAYER_ON_TARGET: Tile(_FLOOR, (_TARGET, _PLAYER)),
    }

    room: Room

    @property
    def instruction(self) -> str:
        return (
            "You are solving Sokoban. You are the player on a grid and must push every box onto a target. "
            "You can only push boxes (never pull them), one at a time, and not into walls or other boxes. "
            f"Symbols: {sym.WALL} wall, {sym.FLOOR} floor, {sym.TARGET} target, {sym.BOX} box, "
            f"{sym.BOX_ON_TARGET} box on target, {sym.PLAYER} player, {sym.PLAYER_ON_TARGET} player on target. "
            "Positions are (row, column) from (0, 0) at the top-left. "
            "Actions: Up, Down, Left, Right. "
            f"Rewards: {STEP_REWARD:g} per move, +{BOX_ON_TARGET_REWARD:g} when a box reaches a target, "
            f"{BOX_OFF_TARGET_REWARD:g} when a box leaves one, +{SOLVED_REWARD:g} when all boxes are on targets."
        )

    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        reject_options(self, options, ("room",))
        if "room" in options:
            self.room = Room.from_text(options["room"])
            return
        config = self.config
        self.room = generate_room(rng, config.size, config.num_boxes, config.search_depth, rate=self._rate)

    def _rate(self, room: Room) -> int | None:
        """Generation rating: the optimal solution length (harder is better); None rejects a room whose
        solution exceeds the action budget when `solvable_within_budget` is set."""
        budget = self.config.max_actions if self.config.solvable_within_budget else None
        plan = solve(room, max_moves=budget)
        return None if plan is None else len(plan)

    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        before = self.room.boxes_on_target
        self.room, pushed = self.room.move(action)
        change = self.room.boxes_on_target - before  # a push moves one box: -1, 0 or +1
        reward = STEP_REWARD
        if change > 0:
            reward += BOX_ON_TARGET_REWARD
        elif change < 0:
            reward += BOX_OFF_TARGET_REWARD
        solved = self.room.solved
        if solved:
            reward += SOLVED_REWARD
        return (
            reward,
            solved,
            {"success": solved, "pushed": pushed, "boxes_on_target": self.room.boxes_on_target},
        )

    def render_text(self) -> str:
        return self.room.to_text()

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        plan = solve(self.room)
        return explain(self.room, plan, min(self.max_actions_per_turn, self.actions_left), rng)


@register_env("sokoban_8x8")
class LargeSokobanEnv(SokobanEnv):
    """The larger Sokoban variant: 8×8 room with two boxes."""

    config_class = LargeSokobanConfig
