"""Grid environments: text state as rows of symbols, plus an RGB image of the same grid."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from envs.base import Env

if TYPE_CHECKING:
    import numpy as np

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Tile:
    """How one grid symbol is drawn: a background colour, then glyphs (shape name, colour) in order.
    Shapes: square, circle, ring, cross."""

    background: RGB
    glyphs: tuple[tuple[str, RGB], ...] = ()


class GridEnv(Env):
    """An `Env` whose `render_text()` is rows of single-character symbols, each drawn by `palette`."""

    palette: ClassVar[dict[str, Tile]] = {}

    def render_image(self) -> np.ndarray:
        """The current grid as an RGB image: shape (rows * TILE, cols * TILE, 3), uint8; TILE = 32 px."""
        from envs.render import paint_grid

        return paint_grid(self.render_text().split("\n"), self.palette)

    def save_png(self, path: str | Path) -> Path:
        """Write `render_image()` to `path` as PNG; returns the path."""
        from envs.render import write_png

        return write_png(self.render_image(), path)
