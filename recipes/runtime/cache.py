"""A content-addressed folder cache: build once per hash of the inputs, share across runs and processes.

`cached_folder("warm-start", inputs, build)` returns `<cache>/warm-start/<hash>/`, calling `build(tmp_dir)` only
when that folder does not exist yet. Concurrent processes (a sweep starting many cells) wait on a file lock, so
exactly one builds; the folder appears atomically (rename), with `inputs.json` beside the built files. A waiter given
`should_stop` polls it while it waits (a build, such as a warm start, can take many minutes), and raises
`StopRequested` once it says so.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
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
        scratch = target.with_name(f"{target.name}.tmp-{os.getpid()}")
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
