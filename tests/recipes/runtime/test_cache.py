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


def killed_writer(root: Path) -> int:
    """The PID of a real process SIGKILLed inside its build of warm-start {"task": "sokoban"} under `root` (its
    scratch, holding the file `half-written`, left behind)."""
    import signal
    import subprocess
    import sys

    ready = root / "ready"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(ready)],
                              cwd=Path(__file__).resolve().parents[3])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():  # the event: the writer is inside its build
            assert writer.poll() is None and time.monotonic() < deadline, "the writer never began its build"
            time.sleep(0.05)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    ready.unlink()
    return writer.pid


def test_a_killed_builders_scratch_is_swept_by_the_next_builder_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Issue 60: a warm start killed mid-build (SIGKILL, the OOM killer) left `<hash>.tmp-<pid>` behind for good. The
    next builder of the key removes the scratch of a writer that is gone (its PID dead, or recycled: another start
    time; an older orch's name without the host too) and keeps a live writer's, another host's and another key's."""
    import os
    import socket

    from recipes.runtime.cache import scratch_name

    inputs = {"task": "sokoban"}
    key = input_hash(inputs)
    dead = killed_writer(tmp_path)
    root = tmp_path / "warm-start"
    (killed,) = [path.name for path in root.glob(f"{key}.tmp-*")]
    assert killed.startswith(f"{key}.tmp-{dead}-") and killed.endswith(f"@{socket.gethostname()}")
    assert (root / killed / "half-written").exists() and not (root / key).exists()
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


def _orch(argv: list[str], cache: Path | None = None) -> tuple[int, str, str]:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    result = CliRunner().invoke(app, argv, env={"ORCH_CACHE_DIR": str(cache) if cache else None})
    return result.exit_code, result.stdout, result.stderr


def test_orch_cache_lists_each_kind_and_clean_removes_only_a_dead_writers_scratch(tmp_path: Path) -> None:
    """Issue 60 item 4: `orch cache` lists the cache kind by kind with sizes and marks a killed writer's scratch;
    `orch cache clean` shows what it would remove and how many bytes, removes it with --yes (the builders' rule:
    the writer's PID gone), and keeps a live writer's scratch, another host's, the entries and a stopped warm
    start's epochs (but a dead writer's half-written epoch file inside them)."""
    import os

    from recipes.runtime.cache import scratch_name

    cache = tmp_path / "cache"
    dead = killed_writer(cache)
    root = cache / "warm-start"
    (killed,) = [path for path in root.glob("*.tmp-*")]
    (killed / "half-written").write_bytes(b"x" * 5000)
    entry = cached_folder("presets", {"preset": "tiny"}, lambda out: (out / "w").write_bytes(b"w" * 3000), cache)
    live = root / scratch_name("1" * 16, pid=os.getpid())
    elsewhere = root / scratch_name("2" * 16, pid=dead, host="node-elsewhere")
    partial = root / f"{'3' * 16}.partial"
    for folder in (live, elsewhere, partial):
        folder.mkdir()
    (partial / "epoch.pt").write_bytes(b"e" * 100)
    half_epoch = partial / f".epoch.pt.tmp-{dead}"
    half_epoch.write_bytes(b"h" * 700)

    code, out, err = _orch(["cache"], cache)
    assert code == 0 and not err, err
    assert f"cache {cache} ($ORCH_CACHE_DIR)" in out and "presets/: 1 entry, 3.0 kB" in out, out
    assert f"{entry.name}" in out and "warm-start/: 0 entries" in out, out
    assert f"{killed.name}" in out and f"scratch of a dead writer (PID {dead} gone)" in out, out
    assert f"being written by PID {os.getpid()} (kept)" in out and "written on host node-elsewhere" in out, out
    assert "a stopped warm start's epochs" in out and "2 dead writers' scratch, 5.7 kB (orch cache clean)" in out, out

    code, out, err = _orch(["cache", "clean"], cache)
    assert code == 0 and not err, err
    assert f"would remove warm-start/{killed.name}  5.0 kB" in out, out
    assert f"would remove warm-start/{partial.name}/{half_epoch.name}  700 B" in out, out
    assert "would remove 2 dead writers' scratch, 5.7 kB; run `orch cache clean --yes`" in out, out
    assert killed.exists() and half_epoch.exists()  # a dry run

    code, out, err = _orch(["cache", "clean", "--yes"], cache)
    assert code == 0 and not err and "removed 2 dead writers' scratch, 5.7 kB" in out, (out, err)
    assert not killed.exists() and not half_epoch.exists()
    assert all(path.exists() for path in (live, elsewhere, partial / "epoch.pt", entry / "w")), out
    code, out, _ = _orch(["cache", "clean", "--dir", str(cache)])
    assert code == 0 and "no dead writer's scratch: nothing to remove" in out, out


def test_orch_cache_clean_leaves_a_key_a_builder_holds(tmp_path: Path) -> None:
    """A dead writer's scratch whose key another builder has locked is left to that builder (it sweeps it under
    the lock): `orch cache clean --yes` removes nothing and says nothing is to remove; once the lock is free, it goes."""
    from recipes.runtime.cache import scratch_name

    cache = tmp_path / "cache"
    root = cache / "warm-start"
    root.mkdir(parents=True)
    key = "4" * 16
    scratch = root / scratch_name(key, pid=killed_writer(tmp_path))
    scratch.mkdir()
    with open(root / f"{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        code, out, _ = _orch(["cache", "clean", "--yes"], cache)
        assert code == 0 and "nothing to remove" in out and scratch.exists(), out
        code, out, _ = _orch(["cache"], cache)
        assert "a builder of its key runs now and removes it" in out, out
    code, out, _ = _orch(["cache", "clean", "--yes"], cache)
    assert code == 0 and "removed 1 dead writer's scratch" in out and not scratch.exists(), out


@pytest.mark.parametrize(("argv", "env_is_file", "line"), [
    (["cache", "--dir", "{file}"], False, "orch: error: --dir {file}: not a folder; give the cache folder"),
    (["cache", "clean", "--dir", "{file}", "--yes"], False, "orch: error: --dir {file}: not a folder"),
    (["cache", "clean"], True, "orch: error: $ORCH_CACHE_DIR {file}: not a folder"),
])
def test_orch_cache_refuses_a_cache_folder_that_is_a_file(tmp_path: Path, argv: list[str], env_is_file: bool,
                                                         line: str) -> None:
    file = tmp_path / "not-a-folder"
    file.write_text("x")
    code, out, err = _orch([arg.format(file=file) for arg in argv], file if env_is_file else tmp_path / "c")
    assert code == 2 and not out and len(err.splitlines()) == 1, (out, err)
    assert err.startswith(line.format(file=file)), err
    assert file.read_text() == "x" and not (tmp_path / "c").exists()


def test_orch_cache_of_an_empty_cache(tmp_path: Path) -> None:
    code, out, err = _orch(["cache"], tmp_path / "none")
    assert code == 0 and "empty: nothing built yet" in out and not err and not (tmp_path / "none").exists(), out
