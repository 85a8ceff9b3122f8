"""A content-addressed folder cache: build once per hash of the inputs, share across runs and processes.

`cached_folder("warm-start", inputs, build)` returns `<cache>/warm-start/<hash>/`, calling `build(tmp_dir)` only
when that folder does not exist yet. Concurrent processes (a sweep starting many cells) wait on a file lock, so
exactly one builds; the folder appears atomically (rename), with `inputs.json` beside the built files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
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


def cached_folder(kind: str, inputs: dict[str, Any], build: Callable[[Path], None], root: Path) -> Path:
    """The folder for `inputs` under `root/kind`, built by `build(folder)` if missing (process-safe)."""
    target = root / kind / input_hash(inputs)
    if (target / INPUTS_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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
