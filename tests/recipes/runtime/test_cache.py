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


WRITER = """
import sys, time
from pathlib import Path
from recipes.runtime.cache import cached_folder

def build(folder):
    (folder / "half-written").write_text("x")
    Path(sys.argv[2]).write_text("building")  # the test kills us now
    time.sleep(600)

cached_folder("warm-start", {"task": "sokoban"}, build, Path(sys.argv[1]))
"""


def test_a_killed_builders_scratch_is_swept_by_the_next_builder_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Issue 60: a warm start killed mid-build (SIGKILL, the OOM killer) left `<hash>.tmp-<pid>` behind for good. The
    next builder of the key removes the scratch of a writer that is gone (its PID dead, or recycled: another start
    time; an older orch's name without the host too) and keeps a live writer's, another host's and another key's."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from recipes.runtime.cache import scratch_name

    inputs = {"task": "sokoban"}
    key = input_hash(inputs)
    ready = tmp_path / "ready"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(ready)],
                              cwd=Path(__file__).resolve().parents[3])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():  # the event: the writer is inside its build
            assert writer.poll() is None and time.monotonic() < deadline, "the writer never began its build"
            time.sleep(0.05)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    root = tmp_path / "warm-start"
    (killed,) = [path.name for path in root.glob(f"{key}.tmp-*")]
    assert killed.startswith(f"{key}.tmp-{writer.pid}-") and killed.endswith(f"@{socket.gethostname()}")
    assert (root / killed / "half-written").exists() and not (root / key).exists()
    dead = writer.pid
    left = {
        "old name, dead PID": f"{key}.tmp-{dead}",
        "recycled PID": f"{key}.tmp-1-999999999@{socket.gethostname()}",  # PID 1 runs, since another time
        "live PID": scratch_name(key, pid=1),
        "another host": scratch_name(key, pid=dead, host="node-elsewhere"),
        "another key": scratch_name("0" * 16, pid=dead),
    }
    for name in left.values():
        (root / name).mkdir()
    assert os.getpid() != dead
    folder = cached_folder("warm-start", inputs, lambda out: (out / "w").write_text("y"), tmp_path)
    assert (folder / "w").read_text() == "y"
    kept = {path.name for path in root.glob("*.tmp-*")}
    assert kept == {left["live PID"], left["another host"], left["another key"]}, kept
