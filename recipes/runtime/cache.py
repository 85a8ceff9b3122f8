"""A content-addressed folder cache: build once per hash of the inputs, share across runs and processes.

`cached_folder("warm-start", inputs, build)` returns `<cache>/warm-start/<hash>/`, calling `build(tmp_dir)` only
when that folder does not exist yet. Concurrent processes (a sweep starting many cells) wait on a file lock, so
exactly one builds; the folder appears atomically (rename), with `inputs.json` beside the built files. A waiter given
`should_stop` polls it while it waits (a build, such as a warm start, can take many minutes), and raises
`StopRequested` once it says so.

A builder writes into a scratch folder beside the target, `<hash>.tmp-<pid>-<start>@<host>` (its PID, the PID's start
time and its host: `scratch_name`), renamed into place when the build is done. A builder killed meanwhile (SIGKILL,
the OOM killer, a node lost) leaves its scratch behind; the next builder of that key sweeps it, under the key's lock,
when its writer is dead: a PID of this host that no longer runs, or runs with another start time (the kernel recycled
it). A scratch of a live process is kept, and so is one of another host (a PID names a process only on its own
host). A scratch from before the host was in the name (`<hash>.tmp-<pid>`) is judged as this host's by its PID.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

INPUTS_FILE = "inputs.json"


def cache_root(configured: str | None = None) -> Path:
    """`configured`, else `$ORCH_CACHE_DIR`, else `~/.cache/orch`."""
    return Path(configured or os.environ.get("ORCH_CACHE_DIR") or Path.home() / ".cache" / "orch").expanduser()


def input_hash(inputs: Any) -> str:
    """Stable 16-hex-digit hash of JSON-serialisable `inputs` (key order does not matter)."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


LOCK_POLL_S = 0.5  # how often a process waiting for another's build polls its stop request


def cached_folder(kind: str, inputs: dict[str, Any], build: Callable[[Path], None], root: Path,
                  should_stop: Callable[[], bool] | None = None) -> Path:
    """The folder for `inputs` under `root/kind`, built by `build(folder)` if missing (process-safe). While another
    process builds it, this one waits, polling `should_stop` every `LOCK_POLL_S` (`StopRequested` once it is true)."""
    target = root / kind / input_hash(inputs)
    if (target / INPUTS_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        _lock(lock, should_stop, f"{kind} {target.name}")
        if (target / INPUTS_FILE).is_file():  # built by another process while we waited
            return target
        sweep_dead_scratch(target)
        scratch = target.with_name(scratch_name(target.name))
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        try:
            build(scratch)
            (scratch / INPUTS_FILE).write_text(json.dumps(inputs, sort_keys=True, indent=1, default=str))
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


_SCRATCH = re.compile(r"^(?P<key>.+)\.tmp-(?P<pid>\d+)(?:-(?P<start>\d+)@(?P<host>.+))?$")


def scratch_name(key: str, pid: int | None = None, host: str | None = None) -> str:
    """The scratch folder of a build of `key` by process `pid` (this one) of `host` (this one): `<key>.tmp-<pid>-
    <start>@<host>`, the PID's start time naming one process where PIDs are recycled (module docstring)."""
    from orchlib.lease import process_start_time

    pid = os.getpid() if pid is None else pid
    return f"{key}.tmp-{pid}-{process_start_time(pid) or 0}@{host or socket.gethostname()}"


def scratch_writer_dead(name: str, host: str | None = None) -> bool:
    """Whether the scratch folder `name` (`scratch_name`) was left by a writer that is gone: its PID runs no more on
    this host (`host`, default this one), or runs with another start time. False for a live writer, a scratch of
    another host, and a name that is no scratch."""
    from orchlib.lease import process_start_time

    found = _SCRATCH.match(name)
    if found is None or (found["host"] is not None and found["host"] != (host or socket.gethostname())):
        return False
    started = process_start_time(int(found["pid"]))
    return started is None or (found["start"] not in (None, "0") and found["start"] != started)


def sweep_dead_scratch(target: Path) -> list[Path]:
    """Remove the scratch folders of `target`'s key whose writer is dead (`scratch_writer_dead`); the folders
    removed. Call it holding the key's lock: a live writer of this host would hold it."""
    removed = []
    for path in target.parent.glob(f"{target.name}.tmp-*"):
        if path.is_dir() and scratch_writer_dead(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _lock(lock: Any, should_stop: Callable[[], bool] | None, what: str) -> None:
    """An exclusive lock on `lock`; without `should_stop`, a plain blocking wait."""
    if should_stop is None:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return
    from recipes.runtime.stop import StopRequested

    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if should_stop():
                raise StopRequested(f"stop requested while waiting for another process to build {what}") from None
            time.sleep(LOCK_POLL_S)
