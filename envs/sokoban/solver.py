"""Optimal Sokoban solver: breadth-first search over (player, boxes) states, counting every move."""

from __future__ import annotations

from collections import deque

from envs.sokoban.room import DIRECTIONS, Pos, Room, shift


def solve(room: Room, max_moves: int | None = None) -> list[str] | None:
    """A shortest action sequence that puts every box on a target ([] if already solved), or None if there is
    none within `max_moves` moves (unbounded when None). Ties are broken by the order of `DIRECTIONS`."""
    start = (room.player, room.boxes)
    if room.solved:
        return []
    parent: dict[tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str]] = {}
    frontier = deque([(start, 0)])
    seen = {start}
    floor, targets = room.floor, room.targets
    while frontier:
        (player, boxes), depth = frontier.popleft()
        if max_moves is not None and depth >= max_moves:
            continue
        for name, delta in DIRECTIONS.items():
            ahead = shift(player, delta)
            if ahead not in floor:
                continue
            if ahead in boxes:
                beyond = shift(ahead, delta)
                if beyond not in floor or beyond in boxes:
                    continue
                next_boxes = (boxes - {ahead}) | {beyond}
            else:
                next_boxes = boxes
            state = (ahead, next_boxes)
            if state in seen:
                continue
            seen.add(state)
            parent[state] = ((player, boxes), name)
            if next_boxes <= targets:
                return _path(parent, start, state)
            frontier.append((state, depth + 1))
    return None


def _path(parent: dict, start: tuple, end: tuple) -> list[str]:
    actions = []
    while end != start:
        end, action = parent[end]
        actions.append(action)
    return actions[::-1]
