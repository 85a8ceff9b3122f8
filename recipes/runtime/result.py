"""How a training run ended: what every trainer backend returns, `orch train` turns into its exit code and a
sweep's job into the cell's state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["finished", "preempted", "stopped", "failed"]


@dataclass(frozen=True)
class TrainResult:
    """How a training run ended.

    status: finished (all steps done) | preempted (stop requested; checkpoint saved, resume later) |
        stopped (the run decided to stop early, e.g. too many empty filtered batches) | failed.
    steps_done: the last completed step (the checkpointed one when preempted).
    mlflow_run_id: the MLflow run that holds the metrics.
    reason: one human-readable line.
    """

    status: Status
    steps_done: int
    mlflow_run_id: str
    reason: str = ""
