"""`orch runs` and `orch report` as a user runs them."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app


def orch(*args: str):
    return CliRunner().invoke(app, list(args))


def test_runs_as_csv_and_json(demo_store):
    result = orch("runs", "--sweep", "demo", "--tracking-uri", demo_store.uri, "--format", "csv",
                  "--metrics", "val/success_rate", "--agg", "max")
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(io.StringIO(result.stdout))
    assert len(frame) == 19 and {"run_id", "status", "task", "filter", "seed", "val/success_rate"} <= set(frame.columns)
    row = frame[frame["run_id"] == demo_store.run_ids["sokoban", "ppo", True, 1]].iloc[0]
    assert row["val/success_rate"] == pytest.approx(0.32) and row["task"] == "sokoban"

    result = orch("runs", "--sweep", "demo", "--tracking-uri", demo_store.uri, "--format", "json", "--wide",
                  "--filter", "params.seed = '0' and params.task.name = 'frozenlake'", "--metrics", "rollout/kept_*")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert len(records) == 4
    assert {"params.algorithm.name", "tags.cell", "rollout/kept_ratio", "rollout/kept_groups"} <= set(records[0])


def test_runs_history_as_parquet_and_as_a_table(demo_store, tmp_path):
    out = tmp_path / "history.parquet"
    result = orch("runs", "--sweep", "demo", "--tracking-uri", demo_store.uri, "--history", "--metrics",
                  "val/success_rate", "--format", "parquet", "--out", str(out))
    assert result.exit_code == 0, result.output
    history = pd.read_parquet(out)
    assert list(history.columns) == ["run_id", "key", "step", "timestamp", "value"]
    assert len(history) == 16 * 7
    table = orch("runs", "--experiment", "demo", "--tracking-uri", demo_store.uri, "--metrics", "timing_s/step")
    assert table.exit_code == 0 and "19 runs" in table.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["runs", "--sweep", "nope"], "unknown sweep 'nope'; valid choices: demo"),
        (["runs", "--format", "xml"], "unknown --format 'xml'; valid choices: csv, json, parquet, table"),
        (["runs", "--agg", "median"], "unknown --agg 'median'"),
        (["runs", "--format", "parquet"], "--format parquet needs --out FILE"),
        (["runs", "--filter", "params.x ~~ 1"], "bad --filter"),
        (["report", "nope"], "unknown sweep 'nope'"),
        (["report", "demo", "--format", "svg"], "unknown --format 'svg'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(demo_store, argv, message):
    result = orch(*argv, "--tracking-uri", demo_store.uri)
    assert result.exit_code == 2
    assert result.stderr.startswith("orch: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_report_command_writes_the_html(demo_store, tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_STORE", f"sqlite:///{tmp_path / 'orch.db'}")  # no state store: MLflow alone
    out = tmp_path / "out" / "report.html"
    result = orch("report", "demo", "--out", str(out), "--tracking-uri", demo_store.uri, "--bootstrap", "50",
                  "--no-rollouts")
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout
    assert "note: " in result.stderr and "failed" in result.stderr
    assert out.stat().st_size > 1_000_000  # plotly.js is inlined
    assert "Will filtering help" not in out.read_text(encoding="utf-8")  # --no-rollouts
    # the terminal says whether the collapse alert fired, where, and its measured rates (the demo's baseline runs
    # fire at step 30)
    assert "The collapse alert (collapse/alert) fired in" in result.stdout and "(first at step 30; by step: 30 in" in result.stdout
    assert "collapse alert (" in result.stdout and "false alarms" in result.stdout
