"""Database URLs opened read-only: what the commands that only read (`orch status`, `orch logs`, `orch runs`) use,
so that pointing one at the wrong file (an empty file, someone else's database) writes nothing in it."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from orchlib.errors import OrchError

SQLITE_PREFIX = "sqlite:///"
SQLITE_HEADER = b"SQLite format 3\x00"


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


def sqlite_tables(path: Path, where: str) -> set[str]:
    """The tables of the SQLite file `path` (an empty set for a 0-byte file), read as a first look: read-only and,
    unless a `-wal` file holds part of it, immutable (no file created beside it, no journal-mode change).
    `OrchError` (prefixed by `where`) for a file that cannot be read or is not an SQLite database."""
    try:
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError as err:
        raise OrchError(f"{where}: cannot read {path} ({err.strerror})") from None
    if not header:
        return set()
    if header != SQLITE_HEADER:
        raise OrchError(f"{where}: {path} is not an SQLite database")
    immutable = "" if Path(f"{path}-wal").exists() else "&immutable=1"
    try:
        connection = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro{immutable}", uri=True)
        try:
            return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            connection.close()
    except sqlite3.Error as err:
        raise OrchError(f"{where}: cannot read {path} as an SQLite database ({err})") from None
