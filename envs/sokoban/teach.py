"""Expert reasoning for Sokoban demonstrations: the facts of this room that justify the next optimal moves.

The reasoning is short and dense in facts that only this room has, so that a policy imitating it must read the
state: its reasoning then depends on the input (first-turn retrieval above chance in the MI diagnostics), which is
what template collapse later destroys (RAGEN-2, arXiv 2604.06268). It opens with what the grid shows up, down, left
and right of the player and of the nearest box off target (symbols copied from the state), then gives the player's,
every box's and its nearest free target's coordinates, their distance, the plan's length and where each move lands.
With the coordinates alone the tiny model's warm start never read the room (docs/training.md has the figures).
"""

from __future__ import annotations

import random

from envs.phrasing import at, plural
from envs.sokoban.room import DIRECTIONS, Pos, Room, distance, shift


def _around(room: Room, pos: Pos) -> str:
    """The symbols up, down, left and right of `pos`, as the grid shows them: '# _ X #'."""
    return " ".join(room.symbol(shift(pos, delta)) for delta in DIRECTIONS.values())


def _neighbour_facts(room: Room, rng: random.Random) -> list[str]:
    """What lies up, down, left and right of the player and of the box off target nearest to it (one box keeps
    the replies of the two-box room within 128 tokens)."""
    opening = rng.choice(["Up, down, left, right of me:", "Next to me (up, down, left, right):"])
    facts = [f"{opening} {_around(room, room.player)}."]
    loose = sorted(room.boxes - room.targets)
    if loose:
        box = min(loose, key=lambda b: (distance(room.player, b), b))
        facts.append(f"Of the {'box' if len(loose) == 1 else 'nearest box'}: {_around(room, box)}.")
    return facts


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
    facts = [*_neighbour_facts(room, rng), rng.choice(["I am at", "Player at"]) + f" {at(room.player)}.",
             *_box_facts(room, rng)]
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
