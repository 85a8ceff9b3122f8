"""The one interface every executor implements, and what it is given."""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from orchestrator.store import Attempt, Submission
from orchlib.errors import OrchError

if TYPE_CHECKING:
    from orchestrator.resources import Resources
    from orchestrator.spec import ClusterSettings


class SubmitError(OrchError):
    """Submission failed part-way: `submitted` holds what did reach the cluster."""

    def __init__(self, message: str, submitted: list[Submission]) -> None:
        super().__init__(message)
        self.submitted = submitted


@dataclass(frozen=True)
class CellTask:
    """A cell to run: its store ids, identity and resources."""

    cell_id: int
    attempt_id: int
    digest: str
    resources: Resources


@dataclass
class SweepContext:
    """The sweep the tasks belong to (its cluster settings are parsed on first use: `orch status` needs none)."""

    name: str
    sweep_id: int
    store_url: str
    run_dir: Path
    cluster_json: str

    @cached_property
    def cluster(self) -> ClusterSettings:
        """The sweep's cluster settings."""
        from orchestrator.spec import ClusterSettings

        return ClusterSettings.model_validate_json(self.cluster_json)

    @property
    def log_dir(self) -> Path:
        """Where submitit writes job pickles and logs."""
        return self.run_dir / "jobs"


class Executor(ABC):
    """Runs cells somewhere. Jobs report their own state to the store; the executor only submits, tells which
    jobs vanished, cancels, and requeues from inside a job."""

    name: ClassVar[str] = ""

    def __init__(self, sweep: SweepContext) -> None:
        self.sweep = sweep

    @classmethod
    def check_available(cls) -> None:
        """Raise `OrchError` when this executor cannot run here (called before anything is written); by default
        it always can."""
        return None

    @classmethod
    def upfront_job_id(cls) -> str | None:
        """The job id of every task, when it is known before submitting (in-process executors); else None."""
        return None

    @abstractmethod
    def submit(self, tasks: list[CellTask]) -> list[Submission]:
        """Start or enqueue `tasks` (their attempts are already recorded as queued)."""

    @abstractmethod
    def vanished(self, attempts: list[Attempt]) -> dict[int, str]:
        """Among open attempts of this executor, those whose job no longer exists: {attempt id: what is known}."""

    @abstractmethod
    def cancel(self, attempts: list[Attempt]) -> None:
        """Stop the jobs of these open attempts (the store marks their cells cancelled)."""

    def kill(self, attempts: list[Attempt]) -> None:
        """Stop the jobs of these attempts, which may not answer a signal (hung: see `cluster.stall`); by default
        as `cancel` does (SLURM's scancel kills after KillWait)."""
        self.cancel(attempts)

    @staticmethod
    @abstractmethod
    def requeue_current_job(job_id: str | None) -> None:
        """Called inside a job that checkpointed on preemption: have it run again (the next attempt resumes)."""


def process_alive(pid: int | None, host: str | None) -> bool:
    """Whether process `pid` runs on this host (unknowable elsewhere: then assume it does)."""
    if pid is None:
        return False
    if host and host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True
