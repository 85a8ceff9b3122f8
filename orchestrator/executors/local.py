"""Cells as subprocesses on this machine, through submitit's LocalExecutor, started by a detached runner.

`orch sweep --cluster local` records the cells as queued and makes sure a runner serves the sweep
(`python -m orchestrator.local_runner`, one per sweep, guarded by a lock file); the runner starts as many cells
at once as the cores allow (`cpus_per_task` each, or `cluster.local_max_parallel`) and exits when none is left.
The command returns at once; `--wait` follows progress. Requeue works as on SLURM: submitit's local controller
sends SIGUSR2 before `time_min`, the job checkpoints and exits with submitit's requeue code, and the controller
starts it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from orchestrator.executors.base import CellTask, Executor, SweepContext, process_alive
from orchestrator.local_task import exit_note
from orchestrator.store import Attempt, Submission
from orchlib.errors import OrchError

RUNNER_LOCK = "runner.lock"
RUNNER_LOG = "runner.log"
RUNNER_GRACE_S = 60.0


class RunnerLock:
    """An exclusive, non-blocking lock file: held by the one runner of a sweep for as long as it runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    def acquire(self) -> bool:
        """Take the lock if free; True on success."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held open for the lifetime of the lock
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._handle = handle
        return True

    def release(self) -> None:
        """Give the lock back."""
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock (a runner is alive)."""
        if self.acquire():
            self.release()
            return False
        return True


def ensure_runner(sweep: SweepContext, timeout_s: float = 60.0) -> None:
    """Start a detached runner for the sweep unless one is alive; return once it holds its lock."""
    lock = RunnerLock(sweep.run_dir / RUNNER_LOCK)
    if lock.held_elsewhere():
        return
    log_path = sweep.run_dir / RUNNER_LOG
    with open(log_path, "a") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.local_runner", "--store", sweep.store_url, "--sweep", sweep.name],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + timeout_s
    while not lock.held_elsewhere():
        code = process.poll()
        if code is not None:
            if code == 0:  # it found nothing to do, or another runner took over meanwhile
                return
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-10:])
            raise OrchError(f"the local runner exited with code {code}:\n{tail}")
        if time.monotonic() > deadline:
            raise OrchError(f"the local runner did not start within {timeout_s:g} s (see {log_path})")
        time.sleep(0.05)


class LocalExecutor(Executor):
    """Queue cells for the sweep's local runner."""

    name = "local"

    def submit(self, tasks: list[CellTask]) -> list[Submission]:
        """The attempts are already queued in the store; the runner assigns job ids as it starts them."""
        self.sweep.run_dir.mkdir(parents=True, exist_ok=True)
        ensure_runner(self.sweep)
        return []

    def vanished(self, attempts: list[Attempt]) -> dict[int, str]:
        """While the sweep's runner lives it reaps its own jobs (with their exit code and log tail); without one,
        started jobs whose controller process is gone, and queued ones nobody is left to start."""
        if RunnerLock(self.sweep.run_dir / RUNNER_LOCK).held_elsewhere():
            return {}
        gone = {}
        for attempt in attempts:
            if attempt.job_id is None:
                # A submitter may be starting the runner right now: give it a moment.
                if time.time() - (attempt.submitted_at or 0) > RUNNER_GRACE_S:
                    gone[attempt.id] = "the local runner exited before starting this cell"
            elif not process_alive(int(attempt.job_id), attempt.host):
                how = exit_note(self.sweep.log_dir, attempt.job_id) or "exited"
                gone[attempt.id] = f"local job {attempt.job_id} {how} without reporting an end"
        return gone

    def cancel(self, attempts: list[Attempt]) -> None:
        """SIGTERM the controllers of started jobs (forwarded to the job: it checkpoints and stops)."""
        for attempt in attempts:
            if attempt.job_id and process_alive(int(attempt.job_id), attempt.host):
                try:
                    os.kill(int(attempt.job_id), signal.SIGTERM)
                except ProcessLookupError:
                    continue

    def kill(self, attempts: list[Attempt]) -> None:
        """SIGKILL the job processes (a hung or stopped process ignores SIGTERM); their controllers then end."""
        for attempt in attempts:
            if attempt.pid and process_alive(int(attempt.pid), attempt.host):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(attempt.pid), signal.SIGKILL)

    @staticmethod
    def requeue_current_job(job_id: str | None) -> None:
        """Exit with submitit's requeue code: the local controller starts the job again."""
        from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

        sys.exit(LOCAL_REQUEUE_RETURN_CODE)
