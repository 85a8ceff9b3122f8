"""The content-addressed folder cache (recipes/runtime/cache.py): one build per inputs, and a waiter that honours a stop."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

import pytest

from recipes.runtime.cache import cached_folder, input_hash
from recipes.runtime.stop import StopRequested


def test_a_process_waiting_for_another_build_stops_when_asked(tmp_path: Path) -> None:
    """Issue 45: a job waiting on the lock of a warm start another job is training (minutes) ends on a stop within
    one poll, instead of waiting the build out; the build is not attempted."""
    inputs = {"task": "countdown"}
    (tmp_path / "warm-start").mkdir()
    built: list[Path] = []
    with open(tmp_path / "warm-start" / f"{input_hash(inputs)}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another build holds the lock (a separate open file: flock conflicts)
        started = time.monotonic()
        with pytest.raises(StopRequested, match="waiting for another process to build warm-start"):
            cached_folder("warm-start", inputs, built.append, tmp_path,
                          should_stop=lambda: time.monotonic() - started > 0.3)
        assert time.monotonic() - started < 2 and not built
    folder = cached_folder("warm-start", inputs, lambda out: (out / "w").write_text("x"), tmp_path,
                           should_stop=lambda: False)  # lock free: built once, then found
    assert (folder / "w").read_text() == "x"
    assert cached_folder("warm-start", inputs, built.append, tmp_path) == folder and not built
