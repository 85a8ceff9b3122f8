"""An exclusive lock between processes: a lock file taken with `flock`, waited for, released when the context
closes (or when the process dies: the kernel drops it, so a crash never leaves it held)."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold the lock on `path` (created if missing) while the context is open; yields True. Where the lock file
    cannot be created (a folder this user may not write), yields False without locking: whoever cannot write
    there cannot create what the lock guards either. With `wait=False`, `BlockingIOError` if another process
    holds it."""
    try:
        handle = open(path, "a+")  # noqa: SIM115 - held open for the lifetime of the lock
    except OSError:
        yield False
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
