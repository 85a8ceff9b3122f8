"""Expert reasoning for FrozenLake demonstrations: where I am, where the goal and the holes are, and why the next
moves follow the shortest safe path.

The reasoning is short and dense in facts that only this lake has — every hole's coordinates, the safe path's length
and where each move lands — so that a policy imitating it must read the map: its reasoning then depends on the input
(first-turn retrieval well above chance in the MI diagnostics; the start and the goal alone are the same on every
map), which is what template collapse later destroys (RAGEN-2, arXiv 2604.06268).
"""

from __future__ import annotations

import random

from envs.frozenlake.lake import GOAL, HOLE, Lake, Pos, find, move, shortest_path
from envs.phrasing import at, plural


def explain(lake: Lake, pos: Pos, n_actions: int, slip: float, rng: random.Random) -> tuple[str, list[str]]:
    """Reasoning and the first `n_actions` moves (one if the ice is slippery) of a shortest safe path from
    `pos` (a non-terminal cell)."""
    goal = find(lake, GOAL)
    plan = shortest_path(lake, pos)
    assert plan is not None, "a non-terminal cell always keeps a path to the goal"
    holes = [(r, c) for r, row in enumerate(lake) for c, cell in enumerate(row) if cell == HOLE]
    facts = [
        rng.choice(["I am at", "Player at"]) + f" {at(pos)}, goal {at(goal)}.",
        ("Holes: " + ", ".join(at(hole) for hole in holes) + ".") if holes else "No holes.",
        rng.choice([f"Safe path: {plural(len(plan), 'step')}.", f"{plural(len(plan), 'safe step')} to go."]),
    ]
    actions = plan[: 1 if slip > 0 else n_actions]
    for action in actions:
        pos = move(lake, pos, action)
        facts.append(f"{action} to {at(pos)}.")
    if slip > 0:
        facts.append("Slippery: one move, then re-plan.")
    facts.append(rng.choice(["So", "I move"]) + " " + ", ".join(actions) + ".")
    return " ".join(facts), actions
