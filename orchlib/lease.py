"""One writer per folder, across hosts: an exclusive-create lease file renewed by its holder.

`flock` (`orchlib.locks`) is not enough for the folders a cluster shares: on NFS a lock may not reach the server,
and a lock held by a process on another node cannot be asked whether its holder lives. A lease works everywhere a
file can be created: the holder creates `<folder>/.orch-writer.json` exclusively (a hard link to its scratch
record: atomic on NFSv3+ and every local file system), writes who it is (host, PID, the process's start time, a token), and renews it every
`lease_s / 4` seconds from a thread of its own, so a writer that is slow (a long step, a long checkpoint) but alive
keeps it. The record is written to a scratch file first and published by `link`, so a lease file is never seen
half-written. Another process finds the lease and judges it:

- held by a live process on this host (same PID *and* start time, so a recycled PID is not mistaken for it), or
  renewed less than `lease_s` ago by another host: **in use** — refused, or waited for;
- held by a dead process on this host, or not renewed for `lease_s` by another host (its node died, or the
  holder froze): **stale** — taken over.

A take-over happens under a short-lived second exclusive file (`.orch-writer.json.takeover`) and re-reads the lease
before removing it, so two processes judging one stale lease never both win. A holder that finds its lease taken
(it froze for longer than `lease_s`) sets `lost`; its owner must stop writing.

Clocks: a lease from another host is judged by the renewal time it wrote, so hosts' clocks must agree to well
within `lease_s` (the default, 120 s, is far beyond what NTP leaves).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

LEASE_FILE = ".orch-writer.json"
LEASE_S = 120.0
TAKEOVER_STALE_S = 30.0  # a take-over file older than this was left by a process that died mid take-over


class InUseError(RuntimeError):
    """The folder has a live writer; the message names it (PID, host, since when)."""


def process_start_time(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (field 22 of /proc/PID/stat), or None when it does
    not run. With the PID it names one process: a PID the kernel recycled has another start time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


class WriterLease:
    """The lease on one folder (see the module docstring).

    Args:
        folder: the folder to hold (created when missing, on acquire).
        what: how messages name it, e.g. "config key trainer.checkpoint_dir".
        lease_s: a lease not renewed for this long by another host is stale.
        host, pid: who this process is (tests simulate another host with them).
    """

    def __init__(self, folder: Path, what: str = "folder", lease_s: float = LEASE_S, host: str | None = None,
                 pid: int | None = None) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LEASE_FILE
        self.what = what
        self.lease_s = float(lease_s)
        self.host = host or socket.gethostname()
        self.pid = pid or os.getpid()
        self.token = uuid.uuid4().hex
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._created: list[Path] = []

    # -- taking and giving back -------------------------------------------------------------------------------
    def acquire(self, wait_s: float = 0.0, should_stop: Callable[[], bool] | None = None,
                on_wait: Callable[[str], None] | None = None, poll_s: float = 1.0) -> bool:
        """Hold the lease. A live holder: `InUseError` at once (`wait_s` 0), or after waiting up to `wait_s` for
        it to end (`on_wait` is told once, with who holds it). Returns False when `should_stop` said stop while
        waiting (nothing held). Starts the renewing thread."""
        missing = [path for path in (self.folder, *self.folder.parents) if not path.exists()]
        self.folder.mkdir(parents=True, exist_ok=True)
        self._created = missing  # removed again by `release` if still empty: a refused run leaves no folder
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            holder = self._try_take()
            if holder is None:
                self._start_renewing()
                return True
            if time.monotonic() >= deadline:
                raise InUseError(f"{self.what}: {self.folder} is in use by {describe(holder)}; wait for it to end, "
                                 "or use another folder")
            if on_wait and not told:
                on_wait(f"{self.folder} is in use by {describe(holder)}; waiting up to {wait_s:.0f} s for it to end")
                told = True
            if should_stop is not None and should_stop():
                return False
            time.sleep(poll_s)

    def release(self) -> None:
        """Stop renewing and remove the lease file if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._ours():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for folder in self._created:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty (the run wrote there), or gone
                break
        self._created = []

    def __enter__(self) -> WriterLease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- the file ---------------------------------------------------------------------------------------------
    def _record(self) -> dict[str, Any]:
        now = time.time()
        return {"host": self.host, "pid": self.pid, "start": process_start_time(self.pid) if self.pid == os.getpid()
                else None, "token": self.token, "since": now, "renewed": now}

    def _try_take(self) -> dict[str, Any] | None:
        """Create the lease, or take over a stale one; None when held now, else the live holder's record."""
        if self._create():
            return None
        holder = read_lease(self.path)
        if holder is None:  # gone meanwhile, or caught before its holder wrote it: look again
            time.sleep(0.05)
            holder = read_lease(self.path)
            if holder is None:
                return self._take_over(None)
        if not self.is_stale(holder):
            return holder
        return self._take_over(holder)

    def _create(self) -> bool:
        """Publish our record as the lease if there is none: written whole to a scratch file, then hard-linked to
        the lease's name (`link` fails if the name exists, atomically, NFS included), so no reader ever sees a lease
        file without its record."""
        scratch = self.path.with_name(f"{self.path.name}.{self.token}")
        with open(scratch, "w") as handle:
            json.dump(self._record(), handle)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(scratch, self.path)
        except FileExistsError:
            return False
        finally:
            scratch.unlink(missing_ok=True)
        return True

    def _take_over(self, judged: dict[str, Any] | None) -> dict[str, Any] | None:
        """Remove the stale lease `judged` and create ours, under the take-over file; None on success, else the
        record that holds it now."""
        guard = self.path.with_name(self.path.name + ".takeover")
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - guard.stat().st_mtime > TAKEOVER_STALE_S:
                    guard.unlink()
            return read_lease(self.path) or {"host": "?", "pid": "?", "note": "being taken over"}
        os.close(fd)
        try:
            now = read_lease(self.path)
            if now is not None and (judged is None or now.get("token") != judged.get("token")):
                return now if not self.is_stale(now) else self._replace()
            return self._replace()
        finally:
            with contextlib.suppress(FileNotFoundError):
                guard.unlink()

    def _replace(self) -> dict[str, Any] | None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        return None if self._create() else (read_lease(self.path) or {"host": "?", "pid": "?"})

    def is_stale(self, holder: dict[str, Any]) -> bool:
        """Whether `holder`'s lease may be taken over (see the module docstring)."""
        if holder.get("host") == self.host and isinstance(holder.get("pid"), int):
            start = process_start_time(holder["pid"])
            return start is None or (holder.get("start") is not None and start != holder["start"])
        return time.time() - float(holder.get("renewed", 0)) > self.lease_s

    def _ours(self) -> bool:
        record = read_lease(self.path)
        return record is not None and record.get("token") == self.token

    # -- renewing ---------------------------------------------------------------------------------------------
    def _start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="orch-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 4):
            self.renew()

    def renew(self) -> bool:
        """Write a fresh renewal time if the lease is still ours; else set `lost` (and return False)."""
        record = read_lease(self.path)
        if record is None or record.get("token") != self.token:
            self.lost = True
            self._stop.set()
            return False
        record["renewed"] = time.time()
        scratch = self.path.with_name(f"{self.path.name}.{self.token}")
        try:
            scratch.write_text(json.dumps(record))
            os.replace(scratch, self.path)
        except OSError:  # a full disk or a lost mount: the lease ages; the next renewal tries again
            with contextlib.suppress(OSError):
                scratch.unlink()
        return True


def read_lease(path: Path) -> dict[str, Any] | None:
    """The record in lease file `path`, or None when there is none (or it is being written)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe(holder: dict[str, Any]) -> str:
    """`PID 123 on node1 (since 2026-11-25 21:03:00, renewed 12 s ago)`."""
    text = f"PID {holder.get('pid')} on {holder.get('host')}"
    if isinstance(holder.get("since"), (int, float)):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        text += f" (since {since}, renewed {max(0.0, time.time() - float(holder.get('renewed', 0))):.0f} s ago)"
    return text
