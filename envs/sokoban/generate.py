"""Room generation by reverse play: carve a room, start from the solved position, then walk the player
backwards, sometimes pulling a box. Every pull is the reverse of a legal push, so the result is solvable.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from envs.sokoban.room import DIRECTIONS, Pos, Room, distance, shift
from orchlib.errors import OrchError

FLOOR_FRACTION = 0.6  # share of the interior (inside the border wall) carved into floor
TURN_PROBABILITY = 0.35  # chance that the carving walk changes direction at each step
PULL_PROBABILITY = 0.8  # chance of pulling a box that is behind the player on a reverse move
MAX_ATTEMPTS = 500  # fresh rooms tried before giving up


def _carve(rng: random.Random, size: int) -> frozenset[Pos]:
    """Floor cells of a size×size room (border is wall), carved by a random walk with occasional turns."""
    interior = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    wanted = max(3, round(FLOOR_FRACTION * len(interior)))
    pos = rng.choice(interior)
    floor = {pos}
    heading = rng.choice(list(DIRECTIONS.values()))
    while len(floor) < wanted:
        if rng.random() < TURN_PROBABILITY:
            heading = rng.choice(list(DIRECTIONS.values()))
        ahead = shift(pos, heading)
        if 1 <= ahead[0] <= size - 2 and 1 <= ahead[1] <= size - 2:
            pos = ahead
            floor.add(pos)
    return frozenset(floor)


def _reverse_walk(
    rng: random.Random, floor: frozenset[Pos], targets: list[Pos], player: Pos, steps: int
) -> list[tuple[tuple[int, int], Pos, tuple[Pos, ...]]]:
    """Reverse-play `steps` random moves from the solved position. Returns the distinct visited positions with
    at least one box off target as (score, player, boxes); higher score = boxes further from their targets."""
    boxes = list(targets)
    seen: set[tuple[Pos, tuple[Pos, ...]]] = set()
    visited = []
    for _ in range(steps):
        moves = [d for d in DIRECTIONS.values() if (a := shift(player, d)) in floor and a not in boxes]
        if not moves:
            break
        delta = rng.choice(moves)
        ahead = shift(player, delta)
        behind = shift(player, delta, -1)
        if behind in boxes and rng.random() < PULL_PROBABILITY:
            boxes[boxes.index(behind)] = player
        player = ahead
        state = (player, tuple(boxes))
        off_target = sum(box not in targets for box in boxes)
        if off_target and state not in seen:
            seen.add(state)
            displacement = sum(distance(box, home) for box, home in zip(boxes, targets, strict=True))
            visited.append(((off_target, displacement), player, tuple(boxes)))
    return visited


def generate_room(
    rng: random.Random,
    size: int,
    num_boxes: int,
    search_depth: int,
    rate: Callable[[Room], int | None],
    candidates_per_room: int = 8,
) -> Room:
    """An unsolved size×size room with `num_boxes` boxes, solvable by construction, drawn from `rng`.

    The `candidates_per_room` positions of a reverse walk of `search_depth` moves with the most boxes off
    target and the furthest displaced are rated by `rate` (e.g. optimal solution length, None = reject); the
    best rated wins (ties: the more displaced). Raises OrchError after MAX_ATTEMPTS rooms without success.
    """
    for _ in range(MAX_ATTEMPTS):
        floor = _carve(rng, size)
        cells = sorted(floor)
        if len(cells) < num_boxes + 2:
            continue
        picked = rng.sample(cells, num_boxes + 1)
        targets, player = picked[:num_boxes], picked[num_boxes]
        visited = _reverse_walk(rng, floor, targets, player, search_depth)
        visited.sort(key=lambda entry: entry[0], reverse=True)
        best: tuple[int, Room] | None = None
        for _, player_pos, boxes in visited[:candidates_per_room]:
            room = Room(size, size, floor, frozenset(targets), frozenset(boxes), player_pos)
            rating = rate(room)
            if rating is not None and (best is None or rating > best[0]):
                best = (rating, room)
        if best is not None:
            return best[1]
    raise OrchError(
        f"sokoban: no acceptable {size}x{size} room with {num_boxes} boxes after {MAX_ATTEMPTS} attempts; "
        "raise search_depth or max_actions, or lower num_boxes"
    )
