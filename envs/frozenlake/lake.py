"""FrozenLake maps and dynamics: random solvable maps, slip transition probabilities, shortest paths.

A map is a tuple of rows over gymnasium's letters (S start, F frozen, H hole, G goal), so it can be handed to
`gymnasium.make("FrozenLake-v1", desc=...)` unchanged. Positions are (row, column) from (0, 0) top-left.
Actions follow gymnasium's numbering: 0 Left, 1 Down, 2 Right, 3 Up.
"""

from __future__ import annotations

import random
from collections import deque

from orchlib.errors import OrchError

Pos = tuple[int, int]
Lake = tuple[str, ...]

START, FROZEN, HOLE, GOAL = "S", "F", "H", "G"
ACTIONS = ("Left", "Down", "Right", "Up")  # index = gymnasium action id
DELTAS: dict[str, Pos] = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
MAX_ATTEMPTS = 10_000


def find(lake: Lake, letter: str) -> Pos:
    """Position of the first cell holding `letter` (row-major)."""
    return next((r, c) for r, row in enumerate(lake) for c, ch in enumerate(row) if ch == letter)


def is_terminal(lake: Lake, pos: Pos) -> bool:
    return lake[pos[0]][pos[1]] in (HOLE, GOAL)


def move(lake: Lake, pos: Pos, action: str) -> Pos:
    """The cell reached by moving one step in `action`'s direction; moving off the map stays put."""
    row, col = pos[0] + DELTAS[action][0], pos[1] + DELTAS[action][1]
    if 0 <= row < len(lake) and 0 <= col < len(lake[0]):
        return (row, col)
    return pos


def direction_probs(action: str, slip: float) -> list[tuple[str, float]]:
    """Where an intended move goes: `action` with 1 - slip, each perpendicular direction with slip / 2."""
    index = ACTIONS.index(action)
    return [
        (action, 1.0 - slip),
        (ACTIONS[(index - 1) % 4], slip / 2),
        (ACTIONS[(index + 1) % 4], slip / 2),
    ]


def transition_probs(lake: Lake, pos: Pos, action: str, slip: float) -> dict[Pos, float]:
    """Next-cell distribution of taking `action` at `pos` (terminal cells are absorbing); zero entries omitted."""
    if is_terminal(lake, pos):
        return {pos: 1.0}
    probs: dict[Pos, float] = {}
    for direction, p in direction_probs(action, slip):
        if p > 0:
            target = move(lake, pos, direction)
            probs[target] = probs.get(target, 0.0) + p
    return probs


def sample_direction(rng: random.Random, action: str, slip: float) -> str:
    """Draw the direction actually taken, with the probabilities of `direction_probs`."""
    u = rng.random()
    for direction, p in direction_probs(action, slip):
        if u < p:
            return direction
        u -= p
    return action  # only reached through float rounding when u is within 1e-16 of 1


def shortest_path(lake: Lake, start: Pos) -> list[str] | None:
    """Fewest actions from `start` to the goal over non-hole cells without slipping, or None if unreachable.
    Ties are broken by the order of `ACTIONS`."""
    parent: dict[Pos, tuple[Pos, str]] = {}
    frontier = deque([start])
    seen = {start}
    while frontier:
        pos = frontier.popleft()
        if lake[pos[0]][pos[1]] == GOAL:
            path = []
            while pos != start:
                pos, action = parent[pos]
                path.append(action)
            return path[::-1]
        if is_terminal(lake, pos):
            continue
        for action in ACTIONS:
            nxt = move(lake, pos, action)
            if nxt not in seen:
                seen.add(nxt)
                parent[nxt] = (pos, action)
                frontier.append(nxt)
    return None


def check_lake(rows: list[str] | tuple[str, ...]) -> Lake:
    """Validate a hand-written map: equal-length rows of S/F/H/G with exactly one S and one G."""
    lake = tuple(rows)
    letters = "".join(lake)
    if not lake or len({len(row) for row in lake}) != 1 or set(letters) - {START, FROZEN, HOLE, GOAL}:
        raise OrchError("frozenlake map: rows must be equal-length strings over S, F, H, G")
    if letters.count(START) != 1 or letters.count(GOAL) != 1:
        raise OrchError("frozenlake map: needs exactly one S (start) and one G (goal)")
    return lake


def generate_lake(rng: random.Random, size: int, p_frozen: float) -> Lake:
    """A size×size map, start top-left and goal bottom-right, every other cell frozen with probability
    `p_frozen` else a hole, redrawn until the goal is reachable from the start."""
    for _ in range(MAX_ATTEMPTS):
        rows = [[FROZEN if rng.random() < p_frozen else HOLE for _ in range(size)] for _ in range(size)]
        rows[0][0], rows[-1][-1] = START, GOAL
        lake = tuple("".join(row) for row in rows)
        if shortest_path(lake, (0, 0)) is not None:
            return lake
    raise OrchError(
        f"frozenlake: no {size}x{size} map with a path after {MAX_ATTEMPTS} draws; raise p_frozen"
    )
