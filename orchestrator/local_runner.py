"""The detached process that runs a sweep's queued cells on this machine (`--cluster local`).

    python -m orchestrator.local_runner --store URL --sweep NAME

One runner per sweep (a lock file in the sweep's folder). It loops: reap ended jobs (a job that ended without
reporting is marked lost if a signal killed it, failed otherwise, with how it ended and the end of its log; see
`orchestrator.local_task`), stop jobs whose cell was cancelled, start queued cells while
CPU cores are free, and exit once nothing is queued or running.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.executors.local import RUNNER_LOCK, LocalExecutor, RunnerLock
from orchestrator.local_task import exit_note
from orchestrator.resources import Resources
from orchestrator.spec import ClusterSettings
from orchestrator.states import State
from orchestrator.store import Attempt, Store, Submission

POLL_S = 0.5
LOG_TAIL_LINES = 20


@dataclass
class _Running:
    job: Any  # submitit LocalJob
    cell_id: int
    attempt_id: int  # the attempt the job was submitted for (for a restart: the requeued attempt it continues)
    cpus: int
    resources: Resources  # what the job was given (a restart gets the same)
    stopping: bool = False
    restart: bool = False  # submitted by the runner to continue a requeued attempt


class LocalRunner:
    """Start queued local cells of one sweep within the machine's cores."""

    def __init__(self, store: Store, sweep_name: str) -> None:
        self.store = store
        self.sweep = store.require_sweep(sweep_name)
        self.cluster = ClusterSettings.model_validate(json.loads(self.sweep.cluster_json))
        self.log_dir = Path(self.sweep.run_dir) / "jobs"
        self.cores = os.cpu_count() or 1
        self.running: dict[int, _Running] = {}

    def run(self, lock: RunnerLock) -> None:
        """Serve the sweep until nothing is queued or running (the lock is held on entry)."""
        while True:
            self._reap()
            self._stop_cancelled()
            queued = self.store.queued_attempts(self.sweep.id, "local")
            self._start(queued)
            if not self.running and not queued:
                lock.release()
                # A submitter that queued cells while we held the lock relies on us: look once more.
                if self.store.queued_attempts(self.sweep.id, "local") and lock.acquire():
                    continue
                return
            time.sleep(POLL_S)

    def _start(self, queued: list[Attempt]) -> None:
        for attempt in queued:
            if self.cluster.local_max_parallel and len(self.running) >= self.cluster.local_max_parallel:
                return
            resources = Resources.model_validate(json.loads(attempt.resources_json))
            cpus = min(resources.cpus_per_task, self.cores)
            used = sum(item.cpus for item in self.running.values())
            if self.running and used + cpus > self.cores:
                continue
            job = self._submit(attempt.cell_id, attempt.id, resources)
            self.store.assign_jobs([Submission(attempt.cell_id, attempt.id, str(job.job_id),
                                               str(job.paths.stdout), str(job.paths.stderr))])

    def _submit(self, cell_id: int, attempt_id: int, resources: Resources, restart: bool = False) -> Any:
        """Start the cell's job under a submitit controller of its own (time limit, signal, restarts); returns it."""
        import submitit

        from orchestrator.job import CellJob

        cpus = min(resources.cpus_per_task, self.cores)
        python = shlex.quote(sys.executable)
        executor = submitit.LocalExecutor(folder=self.log_dir, max_num_timeout=self.cluster.max_requeues,
                                          python=f"{python} -m orchestrator.local_task {python}")
        executor.update_parameters(timeout_min=resources.time_min, signal_delay_s=self.cluster.signal_delay_s)
        os.environ["ORCH_CPUS"] = str(cpus)  # the job inherits it: its trainer uses this many threads
        job = executor.submit(CellJob(self.store.url, cell_id, LocalExecutor.name, LocalExecutor.requeue_current_job,
                                      attempt_id))
        self.running[attempt_id] = _Running(job, cell_id, attempt_id, cpus, resources, restart=restart)
        return job

    def _reap(self) -> None:
        for item in [item for item in self.running.values() if item.job.done()]:
            del self.running[item.attempt_id]
            unreported = self.store.open_attempts(self.sweep.id, str(item.job.job_id))
            if item.restart and not unreported:
                # a restart that ended before its job opened an attempt: the requeued attempt it was to continue
                unreported = {row.id: row.state for row in self.store.attempts_by_id([item.attempt_id])
                              if row.state == State.REQUEUED}
                if unreported:
                    self._lost_or_failed(item, list(unreported))
                continue
            waiting = [attempt for attempt, state in unreported.items() if state == State.REQUEUED]
            for attempt in waiting:
                # It checkpointed and recorded its requeue, but submitit's controller ended instead of restarting
                # it: the controller restarts a job at most 6 times whatever its `max_num_timeout` (submitit
                # local.py, Controller.run's max_retry), or the job was still exiting when the time limit came
                # (signal_delay_s after the signal) and was killed. Either way its checkpoint is written: restart it
                # under a new controller; the restart counts against cluster.max_requeues (Store.job_started).
                self._submit(item.cell_id, attempt, item.resources, restart=True)
            unreported = [attempt for attempt in unreported if attempt not in waiting]
            if unreported:
                self._lost_or_failed(item, unreported)

    def _lost_or_failed(self, item: _Running, attempts: list[int]) -> None:
        """End the attempts of a job that ended without reporting: lost when a signal killed it (kill -9, the OOM
        killer), so a plain `orch resume` runs it again; any other silent exit is the job's own failure."""
        how = exit_note(self.log_dir, str(item.job.job_id)) or "exited"
        state = State.LOST if how.startswith("killed") else State.FAILED
        reason = f"local job {item.job.job_id} {how} without reporting an end\n{_tail(item.job.paths.stderr)}"
        self.store.end_attempts(attempts, state, reason.strip())

    def _stop_cancelled(self) -> None:
        if not self.running:
            return
        states = self.store.cell_states([item.cell_id for item in self.running.values()])
        for item in self.running.values():
            if states.get(item.cell_id) == State.CANCELLED and not item.stopping:
                # SIGTERM to submitit's controller, which forwards it: the job checkpoints and stops.
                os.kill(int(item.job.job_id), signal.SIGTERM)
                item.stopping = True


def _tail(path: Path) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve one sweep, unless another runner already does."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--sweep", required=True)
    args = parser.parse_args(argv)
    store = Store.open(args.store, create=False)
    runner = LocalRunner(store, args.sweep)
    lock = RunnerLock(Path(runner.sweep.run_dir) / RUNNER_LOCK)
    if not lock.acquire():
        return 0
    runner.run(lock)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
