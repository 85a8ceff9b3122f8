"""`orch train task=deepcoder trainer=test` end to end: rollouts whose answers run in the sandbox, the update,
validation and the MLflow run (the micro model writes mostly unparsable code; the task's plumbing is the point)."""

from __future__ import annotations

from typer.testing import CliRunner

from orchestrator.cli import app


def test_orch_train_runs_on_deepcoder(train_overrides) -> None:
    result = CliRunner().invoke(app, ["train", *train_overrides, "task=deepcoder", "algorithm=grpo", "filter=none"])
    assert result.exit_code == 0, result.output
    assert "finished: completed 2 steps" in result.output
