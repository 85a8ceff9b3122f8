"""Expert reasoning for Sokoban demonstrations: the facts of this room that justify the next optimal moves.

The reasoning is short and dense in facts that only this room has — the player's, every box's and its nearest free
target's coordinates, their distance, the plan's length and where each move lands — so that a policy imitating it
must read the state: its reasoning then depends on the input (first-turn retrieval well above chance in the MI
diagnostics), which is what template collapse later destroys (RAGEN-2, arXiv 2604.06268).
"""

from __future__ import annotations

import random

from envs.phrasing import at, plural
from envs.sokoban.room import Room, distance


def _box_facts(room: Room, rng: random.Random) -> list[str]:
    free_targets = sorted(room.targets - room.boxes)
    facts = []
    for box in sorted(room.boxes):
        if box in room.targets:
            facts.append(f"Box {at(box)} is on a target.")
            continue
        target = min(free_targets, key=lambda t: (distance(box, t), t))
        gap = distance(box, target)
        facts.append(rng.choice([f"Box {at(box)}, target {at(target)}, {gap} apart.",
                                 f"Box {at(box)} is {gap} from target {at(target)}."]))
    return facts


def _move_fact(room: Room, action: str) -> tuple[Room, str]:
    after, pushed = room.move(action)
    if not pushed:
        return after, f"{action} to {at(after.player)}."
    box_to = next(iter(after.boxes - room.boxes))
    landing = " on target" if box_to in room.targets else ""
    return after, f"{action} pushes the box to {at(box_to)}{landing}."


def explain(room: Room, plan: list[str] | None, n_actions: int, rng: random.Random) -> tuple[str, list[str]]:
    """Reasoning and the first `n_actions` moves of `plan` (an optimal solution of `room`, or None if the room
    can no longer be solved)."""
    facts = [rng.choice(["I am at", "Player at"]) + f" {at(room.player)}.", *_box_facts(room, rng)]
    if plan is None:
        facts.append("A box is stuck; I just move.")
        return " ".join(facts), ["Up"]
    actions = plan[:n_actions]
    facts.append(rng.choice([f"Plan: {plural(len(plan), 'move')}.", f"{plural(len(plan), 'move')} to solve."]))
    for action in actions:
        room, fact = _move_fact(room, action)
        facts.append(fact)
    facts.append(rng.choice(["So", "I play"]) + " " + ", ".join(actions) + ".")
    return " ".join(facts), actions
