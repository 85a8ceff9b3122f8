"""Cells run in this process, one after another (submitit's DebugExecutor): `breakpoint()` works, and an
exception drops into the post-mortem debugger. `orch sweep --cluster debug` returns when every cell has ended."""

from __future__ import annotations

import os

import submitit

from orchestrator.executors.base import CellTask, Executor, process_alive
from orchestrator.job import CellJob
from orchestrator.states import State
from orchestrator.store import Attempt, Submission


class DebugExecutor(Executor):
    """Run each cell now, in-process; a requeue request runs it again at once."""

    name = "debug"

    def submit(self, tasks: list[CellTask]) -> list[Submission]:
        """Run every task to its end before returning."""
        self.sweep.log_dir.mkdir(parents=True, exist_ok=True)
        executor = submitit.DebugExecutor(folder=self.sweep.log_dir)
        for task in tasks:
            for _ in range(self.sweep.cluster.max_requeues + 1):
                job = executor.submit(CellJob(self.sweep.store_url, task.cell_id, self.name, self.requeue_current_job,
                                              task.attempt_id, ends_process=False))  # runs in this process
                if job.result() != State.REQUEUED:
                    break
        return []

    @classmethod
    def upfront_job_id(cls) -> str:
        """`debug-PID`: the `orch` process that runs the cells."""
        return f"debug-{os.getpid()}"

    def vanished(self, attempts: list[Attempt]) -> dict[int, str]:
        """Attempts left open by an `orch` process that is gone (the `debug-PID` job id, else the pid the job
        reported when it started; an attempt with neither has no process that could still end it)."""
        return {
            attempt.id: "the orch process running this cell (debug) exited without reporting an end"
            for attempt in attempts
            if not process_alive(_orch_pid(attempt), attempt.host)
        }

    def cancel(self, attempts: list[Attempt]) -> None:
        """Nothing runs in the background: the store marks the cells cancelled."""

    @staticmethod
    def requeue_current_job(job_id: str | None) -> None:
        """`submit` runs the cell again when it returns `requeued`."""


def _orch_pid(attempt: Attempt) -> int | None:
    job_id = attempt.job_id or ""
    return int(job_id.removeprefix("debug-")) if job_id.startswith("debug-") else attempt.pid
