"""Database URLs opened read-only: what the commands that only read (`orch status`, `orch logs`, `orch runs`) use,
so that pointing one at the wrong file (an empty file, someone else's database) writes nothing in it."""

from __future__ import annotations

from urllib.parse import quote

SQLITE_PREFIX = "sqlite:///"
_RO_QUERY = "?mode=ro&uri=true"


def readonly_url(url: str) -> str:
    """`url` with SQLite's read-only URI mode (`file:PATH?mode=ro`: SQLite creates no file, no table, no journal
    mode change); any other URL unchanged (the caller makes its sessions read-only)."""
    path = sqlite_path(url)
    if path is None or path == ":memory:":
        return url
    return f"{SQLITE_PREFIX}file:{quote(path)}{_RO_QUERY}"


def sqlite_path(url: str) -> str | None:
    """The file of an `sqlite:///PATH` URL, None for other URLs."""
    return url[len(SQLITE_PREFIX):] if url.startswith(SQLITE_PREFIX) else None
