"""Peak re-evaluation (issue 28 item 2): the torch trainer keeps each run's best checkpoint by validation success
beside the latest ones; `orch eval --sweep S --best` re-evaluates every finished cell's best checkpoint as the
cells of sweep `S.eval` (stored, resumable, on the sweep executors, never counted as training cells), and
`orch report S` uses those numbers, saying so and from which step each came."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.engine import submit_plan, wait
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchestrator.store import Store
from recipes.runtime.checkpoint import BEST_DIR
from tests.orchestrator.conftest import MICRO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("recipes.torch_trainer.backend") is None, reason="no torch backend"),
]



def history(tracking: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((item.step, item.value) for item in MlflowClient(tracking).get_metric_history(run_id, key))


def test_best_checkpoints_are_kept_reevaluated_as_a_sweep_and_reported(workdir: Path, tracking: str) -> None:
    spec = {"name": "evs", "backend": "torch", "base": {**MICRO, "trainer.val_size": 4, "trainer.total_steps": 3},
            "grid": {"task": ["frozenlake", "countdown"]}, "seeds": [1]}
    path = workdir / "evs.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    store = Store.open()
    submit_plan(build_plan(load_sweep(path)), store, "local", tracking_uri=tracking)
    assert wait(store, "evs", poll_s=1, timeout_s=900) == {"finished": 2}
    sweep = store.require_sweep("evs")
    client = MlflowClient(tracking)
    best_steps = {}
    for row in store.cell_rows(sweep.id):
        run = client.get_run(row.mlflow_run_id)
        validated = [(step, value) for step, value in history(tracking, row.mlflow_run_id, "val/success_rate")
                     if step >= 1]
        peak = max(value for _, value in validated)
        first_at_peak = min(step for step, value in validated if value == peak)
        assert run.data.tags["orch.best_step"] == str(first_at_peak)  # the earliest step that reached the peak
        best = Path(sweep.run_dir) / "checkpoints" / row.digest / BEST_DIR
        assert sorted(p.name for p in best.glob("step_*")) == [f"step_{first_at_peak:06d}"]  # only the best kept
        best_steps[row.digest] = first_at_peak

    runner = CliRunner()
    command = ["eval", "--sweep", "evs", "--best", "--episodes", "4", "--samples", "2", "--pass-k", "2",
               "--cluster", "local", "--wait", "--tracking-uri", tracking]
    done = runner.invoke(app, command)
    assert done.exit_code == 0, done.output
    evaluation = store.require_sweep("evs.eval")
    assert store.counts(evaluation.id) == {"finished": 2}
    assert store.counts(sweep.id) == {"finished": 2}  # the training sweep has no more cells than it had
    experiment = client.get_experiment_by_name("evs.eval")
    runs = client.search_runs([experiment.experiment_id], "tags.cell != ''")
    assert {run.data.tags["orch.eval.source_cell"]: int(run.data.tags["orch.eval.step"]) for run in runs} == best_steps
    for run in runs:
        assert 0.0 <= run.data.metrics["eval/success_rate"] <= 1.0 and "eval/pass_at_2" in run.data.metrics
        assert run.data.params["evaluation.episodes"] == "4"
        step = int(run.data.tags["orch.eval.step"])
        assert [a.path for a in client.list_artifacts(run.info.run_id, "rollouts")] == [
            f"rollouts/step_{step:04d}.parquet"]

    again = runner.invoke(app, command)  # only what is missing: nothing
    assert again.exit_code == 0 and "submitted 0" in again.output, again.output

    from analysis.reports.report import build_report
    from orchestrator.api import sweep_cells, sweep_study

    report = build_report("evs", tracking, cells=sweep_cells("evs", store.url), study=sweep_study("evs", store.url),
                          rollouts=False, n_boot=50)
    note = next(line for line in report.notes if "re-evaluation" in line)
    assert "Peak success of 2 of 2 runs" in note and "4 validation episodes" in note
    from analysis.reports.report import render_html

    assert "best checkpoint (step" in render_html(report)  # the cells table says where each peak came from


def test_bad_evaluation_requests_exit_2_with_one_line(workdir: Path) -> None:
    runner = CliRunner()
    cases = [
        (["eval"], "give either SOURCE or --sweep NAME"),
        (["eval", "abc", "--sweep", "s"], "give either SOURCE or --sweep NAME"),
        (["eval", "abc", "--best"], "--best, --wait, --dry-run and --store go with --sweep"),
        (["eval", "--sweep", "s", "--task", "sokoban"], "--task goes with SOURCE"),
        (["eval", "--sweep", "nope", "--best"], "no orch store here"),
        (["eval", "--sweep", "s", "--samples", "1", "--pass-k", "2"], "--pass-k 2 needs --samples >= 2"),
        (["eval", "--sweep", "s", "--engine", "vllm"], "--engine vllm goes with SOURCE"),
        (["eval", "--sweep", "s", "--temperature", "0"], "--temperature 0 (greedy) goes with SOURCE"),
        (["eval", "abc", "--engine", "sglang"], "--engine 'sglang': choose one of torch, vllm"),
        (["eval", "abc", "--engine", "vllm"], "--engine vllm needs vLLM in this interpreter"),  # .venv has none
    ]
    for args, expected in cases:
        done = runner.invoke(app, args)
        lines = done.output.strip().splitlines()
        assert done.exit_code == 2 and len(lines) == 1 and expected in lines[0], (args, done.output)
    trained = runner.invoke(app, ["train", "trainer=test", "evaluation.source=/nowhere"])
    assert trained.exit_code == 2 and "config key evaluation.source" in trained.output, trained.output
    assert not (workdir / ".orch").exists()  # nothing written
