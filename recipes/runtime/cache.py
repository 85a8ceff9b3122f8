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

`cache_contents(root)` lists what the cache holds, kind by kind (`orch cache`); `clean_cache(root)` removes the
scratch of dead writers by that same rule (`writer_state`), each under its key's lock when no builder holds it, and
nothing else (`orch cache clean`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


DEAD, LIVE, ELSEWHERE = "dead", "live", "another host"  # a scratch's writer (`writer_state`)


def writer_state(name: str, host: str | None = None) -> str | None:
    """The writer of the scratch folder or file `name` (`scratch_name`): `DEAD` when its PID runs no more on this
    host (`host`, default this one) or runs with another start time (recycled), `LIVE` when it runs, `ELSEWHERE` for
    a scratch of another host (a PID names a process only on its own host); None for a name that is no scratch."""
    from orchlib.lease import process_start_time

    found = _SCRATCH.match(name)
    if found is None:
        return None
    if found["host"] is not None and found["host"] != (host or socket.gethostname()):
        return ELSEWHERE
    started = process_start_time(int(found["pid"]))
    dead = started is None or (found["start"] not in (None, "0") and found["start"] != started)
    return DEAD if dead else LIVE


def scratch_writer_dead(name: str, host: str | None = None) -> bool:
    """Whether the scratch folder `name` (`scratch_name`) was left by a writer that is gone (`writer_state` is
    `DEAD`). False for a live writer, a scratch of another host, and a name that is no scratch."""
    return writer_state(name, host) == DEAD


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


@dataclass(frozen=True)
class CacheItem:
    """One thing in the cache: an entry (`<kind>/<hash>/`), a stopped warm start's resumable state
    (`<hash>.partial/`), or a writer's scratch (`<hash>.tmp-...`, also a scratch file inside a `.partial`), with its
    size in bytes. `writer` is a scratch's `writer_state`; `busy`, whether a builder holds its key's lock now."""

    kind: str
    path: Path
    size: int
    what: str  # "entry", "partial", "scratch" or "other"
    writer: str | None = None
    busy: bool = False

    @property
    def writer_pid(self) -> int | None:
        """A scratch's writer's PID (None for anything else)."""
        found = _SCRATCH.match(self.path.name) if self.what == "scratch" else None
        return int(found["pid"]) if found else None

    @property
    def writer_host(self) -> str | None:
        """A scratch's writer's host (None for anything else, and for a name from before the host was in it)."""
        found = _SCRATCH.match(self.path.name) if self.what == "scratch" else None
        return found["host"] if found else None

    @property
    def removable(self) -> bool:
        """A dead writer's scratch whose key no builder holds: what `clean_cache` removes."""
        return self.what == "scratch" and self.writer == DEAD and not self.busy


def cache_contents(root: Path) -> list[CacheItem]:
    """Everything under `root` (`cache_root()`), kind by kind (its sub-folders: warm-start, presets, conf-trees, ...)
    and name by name; the keys' lock files are left out."""
    items: list[CacheItem] = []
    if not root.is_dir():
        return items
    for kind_dir in sorted(path for path in root.iterdir() if path.is_dir()):
        for path in sorted(kind_dir.iterdir()):
            if path.suffix == ".lock" and path.is_file():
                continue
            writer = writer_state(path.name)
            if writer is not None:
                items.append(CacheItem(kind_dir.name, path, _size(path), "scratch", writer, _key_busy(path)))
            elif path.name.endswith(".partial") and path.is_dir():
                inner = [child for child in sorted(path.iterdir()) if writer_state(child.name) is not None]
                items.append(CacheItem(kind_dir.name, path, _size(path) - sum(map(_size, inner)), "partial"))
                items += [CacheItem(kind_dir.name, child, _size(child), "scratch", writer_state(child.name),
                                    _key_busy(path)) for child in inner]
            else:
                items.append(CacheItem(kind_dir.name, path, _size(path),
                                       "entry" if (path / INPUTS_FILE).is_file() or path.is_file() else "other"))
    return items


def clean_cache(root: Path, remove: bool = False) -> list[CacheItem]:
    """The scratch of dead writers under `root` (`CacheItem.removable`), removed with `remove`, each under its key's
    lock taken without waiting (a key a builder holds meanwhile is left to that builder, which sweeps it itself).
    A live writer's scratch, another host's, an entry and a partial state are never touched."""
    gone = []
    for item in cache_contents(root):
        if not item.removable:
            continue
        if not remove:
            gone.append(item)
            continue
        with _key_lock(item.path) as held:
            if held and writer_state(item.path.name) == DEAD:
                if item.path.is_dir():
                    shutil.rmtree(item.path, ignore_errors=True)
                else:
                    item.path.unlink(missing_ok=True)
                if not item.path.exists():
                    gone.append(item)
    return gone


def _key_of(path: Path) -> Path:
    """The lock file of the key a scratch (or a scratch inside `<hash>.partial/`) belongs to."""
    if path.parent.name.endswith(".partial"):
        return path.parent.with_name(path.parent.name.removesuffix(".partial") + ".lock")
    name = path.name.removesuffix(".partial")
    found = _SCRATCH.match(name)
    return path.with_name(f"{found['key'] if found else name}.lock")


def _key_busy(path: Path) -> bool:
    """Whether a builder holds the lock of `path`'s key now (no lock file: none does)."""
    with _key_lock(path) as held:
        return not held


@contextlib.contextmanager
def _key_lock(path: Path) -> Iterator[bool]:
    """`with _key_lock(path) as held`: the lock of `path`'s key taken without waiting, `held` false when another
    process holds it. A missing lock file is not created: no builder holds it."""
    lock = _key_of(path)
    try:
        file = open(lock, "r+")  # noqa: SIM115 (closed below)
    except FileNotFoundError:
        yield True
        return
    except OSError:
        yield False
        return
    with file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the file releases the lock


def _size(path: Path) -> int:
    """Bytes under `path` (a file or a folder, symlinks not followed; files vanishing meanwhile count 0)."""
    if not path.is_dir() or path.is_symlink():
        try:
            return path.lstat().st_size
        except OSError:
            return 0
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total
