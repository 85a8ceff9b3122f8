"""`RunTracker` while its store is down: metrics are buffered (training goes on), written in order once the store
answers, `store_down` turns true after `mlflow.outage_s`, and a stopped run keeps the rest beside its checkpoint for
the next attempt. The real-server cases (a cut TCP link) are in `tests/orchestrator/test_sweep_executors.py`."""

from __future__ import annotations

from pathlib import Path

import recipes.run.tracking
from recipes.run.tracking import PENDING_FILE, RunTracker


class Flaky:
    """An MLflow client whose writes fail while `down`."""

    def __init__(self) -> None:
        self.down = False
        self.written: list[tuple[str, int]] = []

    def log_batch(self, run_id: str, metrics=()) -> None:
        if self.down:
            raise ConnectionError("connection refused")
        self.written.extend((metric.key, metric.step) for metric in metrics)


def tracker(outage_s: float) -> RunTracker:
    made = RunTracker.__new__(RunTracker)
    made.client, made.run_id, made.outage_s = Flaky(), "run", outage_s
    made.pending, made.outage_since, made.outage_error, made._next_try = [], None, "", 0.0
    return made


def test_metrics_are_buffered_while_the_store_is_down_and_written_in_order_after(monkeypatch) -> None:
    monkeypatch.setattr(recipes.run.tracking, "RETRY_S", 0.0)
    run = tracker(outage_s=3600)
    run.log_metrics({"a": 1.0}, 1)
    run.client.down = True
    run.log_metrics({"a": 2.0}, 2)
    run.log_metrics({"a": 3.0}, 3)
    assert len(run.pending) == 2 and run.outage_since is not None and not run.store_down
    assert "connection refused" in run.outage_error
    run.client.down = False
    run.log_metrics({"a": 4.0}, 4)
    assert run.client.written == [("a", 1), ("a", 2), ("a", 3), ("a", 4)] and run.pending == []
    assert run.outage_since is None


def test_a_long_outage_asks_the_run_to_stop_and_the_next_attempt_writes_what_it_kept(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    monkeypatch.setattr(recipes.run.tracking, "RETRY_S", 0.0)
    run = tracker(outage_s=0.0)
    run.client.down = True
    run.log_metrics({"a": 1.0, "b": 1.0}, 1)
    assert run.store_down  # past mlflow.outage_s: the trainer checkpoints and stops at its step boundary
    assert run.spill(tmp_path) == tmp_path / PENDING_FILE
    again = tracker(outage_s=3600)
    assert again.take_spilled(tmp_path) == 2
    assert again.client.written == [("a", 1), ("b", 1)] and not (tmp_path / PENDING_FILE).exists()


def test_spilled_metrics_stay_on_disk_while_the_store_is_still_down(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(recipes.run.tracking, "RETRY_S", 0.0)
    run = tracker(outage_s=3600)
    run.client.down = True
    run.log_metrics({"a": 1.0}, 1)
    run.spill(tmp_path)
    again = tracker(outage_s=3600)
    again.client.down = True
    assert again.take_spilled(tmp_path) == 1 and (tmp_path / PENDING_FILE).exists() and len(again.pending) == 1


def test_a_metric_mlflow_refuses_is_raised_not_buffered_as_an_outage(tmp_path: Path) -> None:
    """An invalid metric name is MLflow's INVALID_PARAMETER_VALUE: raised at once, with MLflow's reason, instead of
    waiting out `outage_s` and stopping the run as if the store were down."""
    import pytest
    from mlflow.exceptions import MlflowException

    run = RunTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "x", run_id=None)
    with pytest.raises(MlflowException, match="Names may only contain"):
        run.log_metrics({"eval/pass@2": 0.5}, 1)
    assert run.outage_since is None
