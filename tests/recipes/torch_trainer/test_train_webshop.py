"""`orch train task=webshop trainer=test`: two GRPO steps of the micro model on WebShop, end to end (rollouts
through the search/click pages, the update, validation and the rollout-batch artifacts)."""

from __future__ import annotations

import math

from mlflow import MlflowClient

from recipes.config.schema import compose_train_config
from recipes.run.training import run_training


def test_two_steps_on_webshop(train_overrides) -> None:
    overrides = [*train_overrides, "filter=none", "algorithm=grpo", "task=webshop"]
    cfg = compose_train_config(overrides)
    assert cfg.task.name == "webshop" and cfg.task.env["max_turns"] == 9  # RAGEN config/_6_webshop.yaml:17
    result = run_training(cfg)
    assert (result.status, result.steps_done) == ("finished", 2), result.reason
    uri = next(o.split("=", 1)[1] for o in overrides if o.startswith("mlflow.tracking_uri="))
    mlflow = MlflowClient(uri)
    run = mlflow.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags["task"] == "webshop"
    losses = mlflow.get_metric_history(result.mlflow_run_id, "actor/pg_loss")
    assert [m.step for m in losses] == [1, 2] and all(math.isfinite(m.value) for m in losses)
    artifacts = [a.path for a in mlflow.list_artifacts(result.mlflow_run_id, "rollouts")]
    assert artifacts == ["rollouts/step_0001.parquet", "rollouts/step_0002.parquet"]
