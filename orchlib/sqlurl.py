"""Database URLs opened read-only: what the commands that only read (`orch status`, `orch logs`, `orch runs`) use,
so that pointing one at the wrong file (an empty file, someone else's database) writes nothing in it."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

SQLITE_PREFIX = "sqlite:///"


def readonly_url(url: str, first_look: bool = False) -> str:
    """`url` with SQLite's read-only URI mode (`file:PATH?mode=ro`: SQLite creates no table and changes no journal
    mode, though reading a WAL-mode file creates its `-shm`/`-wal` files); any other URL unchanged (the caller
    makes its sessions read-only). `first_look`, for a file that may not be ours: immutable too (no lock, no file
    created), unless a `-wal` file beside it holds part of its content (then those files exist already)."""
    path = sqlite_path(url)
    if path is None or path == ":memory:":
        return url
    immutable = first_look and not Path(f"{path}-wal").exists()
    return f"{SQLITE_PREFIX}file:{quote(path)}?mode=ro{'&immutable=1' if immutable else ''}&uri=true"


def sqlite_path(url: str) -> str | None:
    """The file of an `sqlite:///PATH` URL, None for other URLs."""
    return url[len(SQLITE_PREFIX):] if url.startswith(SQLITE_PREFIX) else None
