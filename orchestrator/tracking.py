"""MLflow bookkeeping of a sweep: one experiment, a parent run for the sweep, a child run per cell.

The orchestrator creates every run before submitting (so jobs never race to create them); a job attaches to its
cell's run through the config key `mlflow.run_id`, and a resumed attempt attaches to the same run again. Child
runs start in status SCHEDULED; the trainer moves them to RUNNING and ends them.

Tracking URI: `--tracking-uri`, else `recipes.run.tracking.default_tracking_uri` (`$MLFLOW_TRACKING_URI`, else
`sqlite:///<cwd>/mlflow.db`, absolute, so that jobs started in another directory write to the same file). For many
concurrent jobs run `orch mlflow serve` and point the sweep at `http://127.0.0.1:5000` (see docs/sweeps.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PARENT_ROLE = "sweep"
CHILD_ROLE = "cell"
MAX_TAG = 5000


@dataclass(frozen=True)
class ChildRun:
    """What the child run of one cell is tagged with."""

    cell_id: int
    digest: str
    seed: int
    axis: str | None
    varied: dict[str, Any]


def _client(uri: str) -> Any:
    import logging

    from recipes.run.tracking import mlflow_client

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow_client(uri)


def ensure_sweep_runs(uri: str, sweep: str, parent_run_id: str | None, params: dict[str, Any]) -> tuple[str, str]:
    """The experiment named after the sweep and its parent run (created, or the existing one reused).

    Returns (experiment_id, parent_run_id).
    """
    from recipes.run.tracking import ensure_lookup_indexes, experiment_of

    client = _client(uri)
    ensure_lookup_indexes(uri)  # how `orch runs --sweep` and `orch report` find the sweep's runs among a lab's
    experiment = experiment_of(client, sweep, tags={"orch.sweep": sweep})
    experiment_id = experiment.experiment_id
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment_id)
    if parent_run_id:
        try:
            run = client.get_run(parent_run_id)
            if run.info.lifecycle_stage == "active" and run.info.experiment_id == experiment_id:
                if run.info.status != "RUNNING":
                    client.update_run(parent_run_id, status="RUNNING")
                return experiment_id, parent_run_id
        except Exception:  # a run deleted, or from another tracking server: make a new one
            pass
    run = client.create_run(experiment_id, run_name=sweep, tags={"sweep": sweep, "orch.role": PARENT_ROLE})
    for key, value in params.items():
        client.log_param(run.info.run_id, key, str(value)[:MAX_TAG])
    return experiment_id, run.info.run_id


def discard_run(uri: str, run_id: str) -> None:
    """Delete a run nobody uses (a parent run that lost the race to be the sweep's)."""
    _client(uri).delete_run(run_id)


def create_child_runs(uri: str, sweep: str, experiment_id: str, parent_run_id: str,
                      cells: Sequence[ChildRun]) -> dict[int, str]:
    """A SCHEDULED child run per cell, tagged with sweep, cell digest, seed, axis and the varied keys."""
    client = _client(uri)
    run_ids = {}
    for cell in cells:
        tags = {"mlflow.parentRunId": parent_run_id, "sweep": sweep, "cell": cell.digest, "seed": str(cell.seed),
                "orch.role": CHILD_ROLE}
        if cell.axis:
            tags["axis"] = cell.axis
        for key, value in cell.varied.items():
            tags.setdefault(key, str(value)[:MAX_TAG])
        name = ",".join(f"{key}={value}" for key, value in cell.varied.items() if key != "axis") or cell.digest
        run = client.create_run(experiment_id, run_name=name[:200], tags=tags)
        client.update_run(run.info.run_id, status="SCHEDULED")
        run_ids[cell.cell_id] = run.info.run_id
    return run_ids


def end_runs(uri: str, run_ids: Sequence[str], status: str) -> None:
    """Mark runs ended (FINISHED, FAILED or KILLED) unless they already ended."""
    if not run_ids:
        return
    client = _client(uri)
    for run_id in run_ids:
        try:
            if client.get_run(run_id).info.status in ("RUNNING", "SCHEDULED"):
                client.set_terminated(run_id, status=status)
        except Exception:  # a run removed by hand: nothing to end
            continue
