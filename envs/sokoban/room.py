"""Sokoban state and dynamics: an immutable room, one move at a time, and its text form.

Positions are (row, column) counted from 0 at the top-left. Anything outside the grid counts as wall.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchlib.errors import OrchError

Pos = tuple[int, int]

DIRECTIONS: dict[str, Pos] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"
SYMBOLS = (WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET)


def shift(pos: Pos, delta: Pos, times: int = 1) -> Pos:
    return (pos[0] + times * delta[0], pos[1] + times * delta[1])


def distance(a: Pos, b: Pos) -> int:
    """Manhattan distance in cells."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


@dataclass(frozen=True)
class Room:
    """A Sokoban position. `floor` is every walkable cell (targets included); boxes and player stand on floor."""

    height: int
    width: int
    floor: frozenset[Pos]
    targets: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos

    @property
    def solved(self) -> bool:
        return self.boxes <= self.targets

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    def move(self, direction: str) -> tuple[Room, bool]:
        """Walk or push one cell in `direction`. Returns (new room, whether a box was pushed); blocked moves
        (into a wall, or pushing a box into a wall or another box) leave the room unchanged."""
        delta = DIRECTIONS[direction]
        ahead = shift(self.player, delta)
        if ahead not in self.floor:
            return self, False
        if ahead not in self.boxes:
            return replace(self, player=ahead), False
        beyond = shift(ahead, delta)
        if beyond not in self.floor or beyond in self.boxes:
            return self, False
        return replace(self, player=ahead, boxes=(self.boxes - {ahead}) | {beyond}), True

    def symbol(self, pos: Pos) -> str:
        if pos not in self.floor:
            return WALL
        on_target = pos in self.targets
        if pos == self.player:
            return PLAYER_ON_TARGET if on_target else PLAYER
        if pos in self.boxes:
            return BOX_ON_TARGET if on_target else BOX
        return TARGET if on_target else FLOOR

    def to_text(self) -> str:
        return "\n".join(
            "".join(self.symbol((row, col)) for col in range(self.width)) for row in range(self.height)
        )

    @classmethod
    def from_text(cls, text: str) -> Room:
        """Parse the symbol grid written by `to_text` (rows separated by newlines)."""
        rows = [row.strip() for row in text.strip().split("\n")]
        if len({len(row) for row in rows}) != 1:
            raise OrchError("sokoban room: rows must all have the same length")
        cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
        bad = sorted({ch for ch in cells.values() if ch not in SYMBOLS})
        if bad:
            raise OrchError(f"sokoban room: unknown symbol {bad[0]!r}; valid choices: {' '.join(SYMBOLS)}")
        players = [pos for pos, ch in cells.items() if ch in (PLAYER, PLAYER_ON_TARGET)]
        boxes = frozenset(pos for pos, ch in cells.items() if ch in (BOX, BOX_ON_TARGET))
        targets = frozenset(
            pos for pos, ch in cells.items() if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET)
        )
        if len(players) != 1:
            raise OrchError(f"sokoban room: expected exactly one player, found {len(players)}")
        if not boxes or len(boxes) != len(targets):
            raise OrchError(
                f"sokoban room: needs as many targets as boxes (≥ 1), got {len(boxes)} boxes "
                f"and {len(targets)} targets"
            )
        return cls(
            height=len(rows),
            width=len(rows[0]),
            floor=frozenset(pos for pos, ch in cells.items() if ch != WALL),
            targets=targets,
            boxes=boxes,
            player=players[0],
        )
