"""Expert reasoning for FrozenLake demonstrations: where I am, where the goal and nearby holes are, and why
the next moves follow the shortest safe path."""

from __future__ import annotations

import random

from envs.frozenlake.lake import ACTIONS, GOAL, HOLE, Lake, Pos, find, move, shortest_path
from envs.phrasing import at, plural


def explain(lake: Lake, pos: Pos, n_actions: int, slip: float, rng: random.Random) -> tuple[str, list[str]]:
    """Reasoning and the first `n_actions` moves (one if the ice is slippery) of a shortest safe path from
    `pos` (a non-terminal cell)."""
    goal = find(lake, GOAL)
    plan = shortest_path(lake, pos)
    assert plan is not None, "a non-terminal cell always keeps a path to the goal"
    gap = abs(goal[0] - pos[0]) + abs(goal[1] - pos[1])
    facts = [
        rng.choice(["I am at", "The player is at", "My position is"]) + f" {at(pos)}.",
        rng.choice(
            [
                f"The goal is at {at(goal)}, {plural(gap, 'step')} away in a straight count.",
                f"The goal sits at {at(goal)}; the Manhattan distance is {gap}.",
            ]
        ),
    ]
    holes = [a for a in ACTIONS if (cell := move(lake, pos, a)) != pos and lake[cell[0]][cell[1]] == HOLE]
    if holes:
        facts.append("Moving " + " or ".join(holes) + " would drop me into a hole.")
    else:
        facts.append(rng.choice(["No hole is next to me.", "All my neighbouring cells are safe."]))
    facts.append(
        rng.choice(
            [
                f"The shortest safe path needs {plural(len(plan), 'step')}.",
                f"Avoiding holes, the goal is {plural(len(plan), 'step')} away.",
            ]
        )
    )
    actions = plan[: 1 if slip > 0 else n_actions]
    for action in actions:
        nxt = move(lake, pos, action)
        facts.append(f"{action} takes me from {at(pos)} to {at(nxt)}.")
        pos = nxt
    if slip > 0:
        facts.append("The ice is slippery, so I take one move and re-plan after seeing where I land.")
    facts.append(rng.choice(["So I move", "Next:", "I choose"]) + " " + ", ".join(actions) + ".")
    return " ".join(facts), actions
