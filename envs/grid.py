"""Grid environments: text state as rows of symbols, plus an RGB image of the same grid."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from envs.base import Env, EnvConfig
from envs.palette import Tile
from envs.protocol import IMAGE_PLACEHOLDER

if TYPE_CHECKING:
    import numpy as np


class GridConfig(EnvConfig):
    """Config base of grid tasks: the state can also be shown as an image (``observation: image``)."""

    observations: ClassVar[tuple[str, ...]] = ("text", "image")


class GridEnv(Env):
    """An `Env` whose `render_text()` is rows of single-character symbols, each drawn by `palette`."""

    palette: ClassVar[dict[str, Tile]] = {}  # symbol -> how it is drawn

    def render_image(self) -> np.ndarray:
        """The current grid as an RGB image: shape (rows * TILE, cols * TILE, 3), uint8; TILE = 32 px."""
        from envs.render import paint_grid

        return paint_grid(self.render_text().split("\n"), self.palette)

    def observe(self) -> tuple[str, np.ndarray | None]:
        """(state text, None), or with ``observation: image`` (`IMAGE_PLACEHOLDER`, `render_image()`)."""
        if self.config.observation == "image":
            return IMAGE_PLACEHOLDER, self.render_image()
        return super().observe()

    def save_png(self, path: str | Path) -> Path:
        """Write `render_image()` to `path` as PNG; returns the path."""
        from envs.render import write_png

        return write_png(self.render_image(), path)
