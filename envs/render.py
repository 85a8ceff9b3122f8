"""Image rendering of symbol grids (for the image modality) and a dependency-free PNG writer."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from envs.palette import Tile
from orchlib.errors import OrchError

TILE = 32  # pixels per grid cell (square)


def _shape_masks(size: int) -> dict[str, np.ndarray]:
    """Boolean (size, size) masks of the glyph shapes drawn on a tile."""
    centre = (size - 1) / 2
    rows, cols = np.mgrid[0:size, 0:size]
    radius = np.hypot(rows - centre, cols - centre)
    inset = size // 5
    square = np.zeros((size, size), dtype=bool)
    square[inset : size - inset, inset : size - inset] = True
    diagonal = np.abs(rows - cols) <= 1
    return {
        "square": square,
        "circle": radius <= size * 0.3,
        "ring": (radius <= size * 0.42) & (radius >= size * 0.3),
        "cross": diagonal | diagonal[:, ::-1],
    }


_MASKS = _shape_masks(TILE)


def _paint_tile(tile: Tile) -> np.ndarray:
    pixels = np.empty((TILE, TILE, 3), dtype=np.uint8)
    pixels[:] = tile.background
    for shape, colour in tile.glyphs:
        pixels[_MASKS[shape]] = colour
    return pixels


def paint_grid(rows: list[str], palette: dict[str, Tile]) -> np.ndarray:
    """Render equal-length symbol rows to an RGB image of shape (len(rows)*TILE, len(rows[0])*TILE, 3), uint8."""
    tiles = {symbol: _paint_tile(tile) for symbol, tile in palette.items()}
    return np.concatenate([np.concatenate([tiles[symbol] for symbol in row], axis=1) for row in rows], axis=0)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_png(image: np.ndarray, path: str | Path) -> Path:
    """Write an (H, W, 3) uint8 RGB array as an 8-bit truecolour PNG; returns the path."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise OrchError(
            f"write_png: expected an (H, W, 3) uint8 array, got shape {image.shape} dtype {image.dtype}"
        )
    height, width, _ = image.shape
    scanlines = np.concatenate([np.zeros((height, 1), dtype=np.uint8), image.reshape(height, -1)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit depth, colour type 2 (RGB)
    png = (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(scanlines.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )
    path = Path(path)
    path.write_bytes(png)
    return path
