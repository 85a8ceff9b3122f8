"""How grid symbols are drawn: a `Tile` per symbol (a grid task's `palette`), read by `envs.render`."""

from __future__ import annotations

from dataclasses import dataclass

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Tile:
    """How one grid symbol is drawn: a background colour, then glyphs (shape name, colour) in order.
    Shapes: square, circle, ring, cross."""

    background: RGB
    glyphs: tuple[tuple[str, RGB], ...] = ()
