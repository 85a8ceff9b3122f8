"""Faults in a real torch training run (micro model, CPU): a full disk while checkpointing fails the run with
the last good checkpoint intact, and the resume that follows replays the steps logged after it, counts them in
the `resume/replayed_steps` metric and loses no step."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from recipes.backends import run_training
from recipes.checkpoint import latest_checkpoint, load_checkpoint
from recipes.config import compose_train_config
from recipes.torch_backend import REPLAYED_METRIC


def test_a_full_disk_while_checkpointing_then_a_resume_replays_and_counts_the_lost_steps(
        train_overrides, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "trainer.total_steps=5",
                 "trainer.save_every=2", "trainer.val_every=0"]
    real_save = torch.save

    def disk_full_at_step_4(state, path, *args, **kwargs):  # injected: torch.save writes part, then ENOSPC
        if isinstance(state, dict) and state.get("step") == 4:
            Path(path).write_bytes(b"\0" * 64)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(state, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_4)
    with pytest.raises(OSError, match="No space left on device"):
        run_training(compose_train_config(overrides))
    monkeypatch.setattr(torch, "save", real_save)
    latest = latest_checkpoint(tmp_path / "checkpoints")
    assert latest.name == "step_000002"  # the half-written checkpoint of step 4 is never pointed at
    run_id = load_checkpoint(latest)["mlflow_run_id"]
    mlflow = MlflowClient(next(o.split("=", 1)[1] for o in overrides if o.startswith("mlflow.tracking_uri=")))
    assert mlflow.get_run(run_id).info.status == "FAILED"
    resumed = run_training(compose_train_config(overrides))
    assert (resumed.status, resumed.steps_done, resumed.mlflow_run_id) == ("finished", 5, run_id)
    replayed = [(m.step, m.value) for m in mlflow.get_metric_history(resumed.mlflow_run_id, REPLAYED_METRIC)]
    assert replayed == [(2, 2.0)]  # steps 3 and 4 were logged, then lost with their checkpoint, and run again
    steps = sorted({m.step for m in mlflow.get_metric_history(resumed.mlflow_run_id, "actor/pg_loss")})
    assert steps == [1, 2, 3, 4, 5]  # no step lost
    assert mlflow.get_run(resumed.mlflow_run_id).data.tags["orch.replayed_steps"] == "3-4"
