"""Look inside an SQLite file without writing to it (no journal-mode change, no WAL, no schema): whether it is an
SQLite database at all, and which tables it has. Used before a database is opened for real, so that a command
given someone else's file, an empty file or a text file says so instead of turning it into its own database."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from orchlib.errors import OrchError

SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_tables(path: Path, where: str) -> set[str]:
    """The tables of the SQLite file `path` (an empty set for a 0-byte file), read-only; `OrchError` (prefixed by
    `where`) for a file that cannot be read or is not an SQLite database."""
    try:
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError as err:
        raise OrchError(f"{where}: cannot read {path} ({err.strerror})") from None
    if not header:
        return set()
    if header != SQLITE_HEADER:
        raise OrchError(f"{where}: {path} is not an SQLite database")
    try:
        connection = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            connection.close()
    except sqlite3.Error as err:
        raise OrchError(f"{where}: cannot read {path} as an SQLite database ({err})") from None
