"""SLURM through submitit: one job array per resource group, split at the cluster's MaxArraySize.

Each array task runs `CellJob` (orchestrator.job). SLURM sends SIGUSR2 `cluster.signal_delay_s` before the time
limit (submitit's `--signal`); the job checkpoints and runs `scontrol requeue` on itself. Without `sacct`, the
state comes from the jobs' own reports; `vanished` asks `squeue`/`scontrol` which jobs no longer exist.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from orchestrator.executors.base import CellTask, Executor, SubmitError
from orchestrator.store import Attempt, Submission
from orchlib.errors import OrchError

if TYPE_CHECKING:
    import submitit

    from orchestrator.resources import Resources

SQUEUE_STATES_GONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                      "DEADLINE", "PREEMPTED")


def _run(command: list[str], timeout: float = 60) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise OrchError(f"`{' '.join(command)}` failed: {err}") from None
    if result.returncode != 0:
        raise OrchError(f"`{' '.join(command)}` failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def max_array_size() -> int:
    """The cluster's MaxArraySize (array indices run 0..MaxArraySize-1)."""
    for line in _run(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize":
            return int(value.strip())
    return 1001


def chunks(tasks: list[CellTask], size: int) -> list[list[CellTask]]:
    """`tasks` cut into consecutive lists of at most `size`."""
    return [tasks[start:start + size] for start in range(0, len(tasks), size)]


class SlurmExecutor(Executor):
    """Submit job arrays with submitit's SlurmExecutor."""

    name = "slurm"

    @classmethod
    def check_available(cls) -> None:
        """sbatch must exist and the controller must answer."""
        if shutil.which("sbatch") is None:
            raise OrchError("--cluster slurm: `sbatch` not found (run scripts/setup_slurm.sh for a local SLURM)")
        _run(["sinfo", "-h", "-o", "%P"], timeout=30)

    def submit(self, tasks: list[CellTask]) -> list[Submission]:
        """One sbatch per (resource group, chunk of at most MaxArraySize cells)."""
        cluster = self.sweep.cluster
        limit = max_array_size()
        if cluster.max_array_size:
            limit = min(limit, cluster.max_array_size)
        groups: dict[Resources, list[CellTask]] = {}
        for task in tasks:
            groups.setdefault(task.resources, []).append(task)
        submissions: list[Submission] = []
        for resources, group in groups.items():
            for chunk in chunks(group, limit):
                try:
                    submissions += self._submit_array(resources, chunk)
                except Exception as err:
                    message = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
                    raise SubmitError(f"sbatch failed for {len(chunk)} cell(s) ({resources.label()}): {message}",
                                      submissions) from None
        return submissions

    def _submit_array(self, resources: Resources, tasks: list[CellTask]) -> list[Submission]:
        from orchestrator.job import CellJob

        executor = self._executor(resources)
        with executor.batch():
            jobs = [executor.submit(CellJob(self.sweep.store_url, task.cell_id, self.name,
                                                      self.requeue_current_job, task.attempt_id)) for task in tasks]
        return [
            Submission(task.cell_id, task.attempt_id, str(job.job_id), str(job.paths.stdout), str(job.paths.stderr))
            for task, job in zip(tasks, jobs, strict=True)
        ]

    def _executor(self, resources: Resources) -> submitit.SlurmExecutor:
        import submitit

        cluster = self.sweep.cluster
        self.sweep.log_dir.mkdir(parents=True, exist_ok=True)
        executor = submitit.SlurmExecutor(folder=self.sweep.log_dir, python=cluster.python_command(sys.executable),
                                          max_num_timeout=cluster.max_requeues)
        parameters: dict[str, Any] = {
            "job_name": f"orch-{self.sweep.name}",
            "time": resources.time_min,
            "nodes": resources.nodes,
            "ntasks_per_node": 1,
            "cpus_per_task": resources.cpus_per_task,
            "mem": f"{int(resources.mem_gb * 1024)}MB",
            "array_parallelism": cluster.array_parallelism,
            "signal_delay_s": cluster.signal_delay_s,
            "setup": list(cluster.setup),
            "additional_parameters": dict(cluster.sbatch),
        }
        if resources.gpus_per_node:
            parameters["gpus_per_node"] = resources.gpus_per_node
        for key in ("partition", "account", "qos"):
            if getattr(cluster, key):
                parameters[key] = getattr(cluster, key)
        executor.update_parameters(**parameters)
        return executor

    def vanished(self, attempts: list[Attempt]) -> dict[int, str]:
        """Attempts whose job `squeue` no longer lists, with `scontrol`'s final state where it still knows it."""
        with_jobs = [attempt for attempt in attempts if attempt.job_id]
        if not with_jobs:
            return {}
        base_ids = sorted({attempt.job_id.split("_")[0] for attempt in with_jobs})
        listed = set()
        for line in _run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(base_ids)]).splitlines():
            job_id, _, state = line.partition("|")
            if state not in SQUEUE_STATES_GONE:
                listed.add(job_id.strip())
        return {
            attempt.id: self._final_state(attempt.job_id)
            for attempt in with_jobs
            if attempt.job_id not in listed
        }

    @staticmethod
    def _final_state(job_id: str) -> str:
        try:
            fields = dict(item.split("=", 1) for item in _run(["scontrol", "-o", "show", "job", job_id]).split()
                          if "=" in item)
        except OrchError:
            return f"SLURM job {job_id} is gone (no longer known to scontrol)"
        return f"SLURM job {job_id} ended without reporting: JobState={fields.get('JobState')} " \
               f"ExitCode={fields.get('ExitCode')} Reason={fields.get('Reason')}"

    def cancel(self, attempts: list[Attempt]) -> None:
        """`scancel` the jobs (SIGTERM, then SIGKILL after KillWait): they checkpoint and report `cancelled`."""
        job_ids = sorted({attempt.job_id for attempt in attempts if attempt.job_id})
        if job_ids:
            _run(["scancel", *job_ids])

    @staticmethod
    def requeue_current_job(job_id: str | None) -> None:
        """`scontrol requeue` this job (array task): SLURM restarts it with the same submitit pickle. A failure is
        only reported: if the job does not come back, reconciliation marks the cell lost (`orch resume`)."""
        if job_id is None:
            raise OrchError("cannot requeue: not inside a SLURM job")
        try:
            _run(["scontrol", "requeue", job_id])
        except OrchError as err:
            if "pending execution" in str(err):  # requeued from outside (`scontrol requeue`, preemption) already
                print(f"orch: job {job_id} is already being requeued by SLURM", file=sys.stderr)
            else:
                print(f"orch: {err}", file=sys.stderr)
