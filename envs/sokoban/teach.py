"""Expert reasoning for Sokoban demonstrations: the facts of this room that justify the next optimal moves."""

from __future__ import annotations

import random

from envs.phrasing import at, plural
from envs.sokoban.room import Room, distance


def _box_facts(room: Room, rng: random.Random) -> list[str]:
    free_targets = sorted(room.targets - room.boxes)
    facts = []
    for box in sorted(room.boxes):
        if box in room.targets:
            facts.append(f"The box at {at(box)} is already on a target.")
            continue
        target = min(free_targets, key=lambda t: (distance(box, t), t))
        gap = distance(box, target)
        facts.append(
            rng.choice(
                [
                    f"A box is at {at(box)} and the nearest free target is {at(target)}, {plural(gap, 'step')} away.",
                    f"There is a box at {at(box)}; the closest empty target is {at(target)} ({plural(gap, 'step')}).",
                    f"Box {at(box)} still has to travel {plural(gap, 'step')} to the target at {at(target)}.",
                ]
            )
        )
    return facts


def _move_fact(room: Room, action: str) -> tuple[Room, str]:
    after, pushed = room.move(action)
    if not pushed:
        return after, f"{action} walks me from {at(room.player)} to {at(after.player)}."
    box_from = after.player
    box_to = next(iter(after.boxes - room.boxes))
    landing = ", onto the target" if box_to in room.targets else ""
    return after, f"{action} pushes the box from {at(box_from)} to {at(box_to)}{landing}."


def explain(room: Room, plan: list[str] | None, n_actions: int, rng: random.Random) -> tuple[str, list[str]]:
    """Reasoning and the first `n_actions` moves of `plan` (an optimal solution of `room`, or None if the room
    can no longer be solved)."""
    opening = rng.choice(["I am at", "The player stands at", "My position is"])
    facts = [f"{opening} {at(room.player)}.", *_box_facts(room, rng)]
    if plan is None:
        facts.append("A box is stuck, so the puzzle cannot be solved any more; I just move.")
        return " ".join(facts), ["Up"]
    actions = plan[:n_actions]
    facts.append(
        rng.choice(
            [
                f"The shortest solution from here takes {plural(len(plan), 'move')}.",
                f"Solving this optimally needs {plural(len(plan), 'move')}.",
                f"A plan of {plural(len(plan), 'move')} finishes the puzzle.",
            ]
        )
    )
    for action in actions:
        room, fact = _move_fact(room, action)
        facts.append(fact)
    facts.append(rng.choice(["So I play", "Next moves:", "I will go"]) + " " + ", ".join(actions) + ".")
    return " ".join(facts), actions
