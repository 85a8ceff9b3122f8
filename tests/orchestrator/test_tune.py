"""`orch tune`: real Optuna, the real store and MLflow; trials are cells run by the debug or local executor with the
TEST-ONLY `orch-test` backend, whose `test/score` (step x (1 - |filter.value - 0.8|)) has a known optimum."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.spec import load_sweep
from orchestrator.store import Store
from orchestrator.tune import CELLS_ATTR, REUSED_ATTR, Tuner, plan_study
from tests.orchestrator.gate import Gate

STUDY = """
    name: {name}
    backend: orch-test
    base: {{trainer: test, trainer.total_steps: {steps}, filter: top_p}}
    seeds: [0, 1]
    study:
      space:
        filter.value: {space}
      objectives:
        - {{metric: test/score, reduce: {reduce}, direction: maximize}}
      sampler: {{name: {sampler}, seed: {seed}}}
      pruner: {pruner}
      trials: {trials}
      parallel: {parallel}
"""


@pytest.fixture
def make_study(sweep_file, test_backend):
    def make(name: str = "tune", steps: int = 2, space: str = "{type: float, low: 0.5, high: 1.0, step: 0.1}",
             reduce: str = "max", sampler: str = "tpe", pruner: str = "{name: none}", trials: int = 4,
             parallel: int = 1, seed: int = 0) -> Path:
        return sweep_file(STUDY.format(name=name, steps=steps, space=space, reduce=reduce, sampler=sampler,
                                       pruner=pruner, trials=trials, parallel=parallel, seed=seed), f"{name}.yaml")
    return make


def tuner(path: Path, executor: str, tracking: str, trials: int | None = None) -> Tuner:
    return Tuner(Store.open(), plan_study(load_sweep(path)), executor, tracking_uri=tracking, trials=trials)


def score_of(tracking: str, run_id: str) -> float:
    return max(m.value for m in MlflowClient(tracking).get_metric_history(run_id, "test/score"))


@pytest.fixture(params=["sqlite", "postgresql"])
def store_kind(request, monkeypatch):
    """The store (and with it the Optuna storage): SQLite in the working directory, or a fresh schema of the
    test PostgreSQL server (ORCH_TEST_POSTGRES_URL)."""
    import os

    from tests.orchestrator.races import POSTGRES_ENV, drop_postgres_schema, fresh_postgres_schema

    if request.param == "sqlite":
        yield "sqlite"
        return
    if not os.environ.get(POSTGRES_ENV):
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV}")
    url = fresh_postgres_schema(os.environ[POSTGRES_ENV])
    monkeypatch.setenv("ORCH_STORE", url)
    yield "postgresql"
    drop_postgres_schema(url)


def test_a_study_completes_and_its_best_trial_is_the_best_run_in_mlflow(make_study, tracking: str,
                                                                         store_kind: str) -> None:
    path = make_study(trials=4)
    report = tuner(path, "debug", tracking).run(poll_s=0.1)
    assert report.trials == 4 and report.states == {"COMPLETE": 4}
    store = Store.open()
    sweep = store.require_sweep("tune")
    cells = {row.digest: row for row in store.cell_rows(sweep.id)}
    assert all(row.state == "finished" and row.attempts == 1 for row in cells.values())
    # every trial's value is what its MLflow run logged; the best trial is the run with the best score
    study = tuner(path, "debug", tracking).study
    scores = {trial.number: score_of(tracking, cells[trial.user_attrs[CELLS_ATTR][0]].mlflow_run_id)
              for trial in study.trials}
    assert {trial.number: trial.values[0] for trial in study.trials} == pytest.approx(scores)
    assert study.best_trial.number == max(scores, key=scores.get)
    assert report.best[0]["params"] == study.best_trial.params
    varied = json.loads(cells[study.best_trial.user_attrs[CELLS_ATTR][0]].varied_json)
    assert varied == {"trial": study.best_trial.number, **study.best_trial.params}
    # the report's study section: Optuna's own figures and the best trial as a ready --set line
    result = CliRunner().invoke(app, ["report", "tune", "--out", "report.html", "--tracking-uri", tracking,
                                      "--no-rollouts", "--bootstrap", "10", "--store", Store.open().url])
    assert result.exit_code == 0, result.output
    page = Path("report.html").read_text()
    assert "Study (orch tune)" in page and f"--set filter.value={study.best_trial.params['filter.value']}" in page
    assert page.count("Optimization History Plot") == 1 and "Parallel Coordinate Plot" in page


def test_a_killed_study_resumes_with_the_same_trials_and_no_duplicated_cell(make_study, tracking: str) -> None:
    path = make_study(trials=5)
    first = tuner(path, "debug", tracking, trials=2).run(poll_s=0.1)  # "killed" after two trials
    assert first.trials == 2
    again = tuner(path, "debug", tracking).run(poll_s=0.1)  # `orch tune FILE` again: the same study goes on
    assert again.trials == 5 and again.states == {"COMPLETE": 5}
    store = Store.open()
    rows = store.cell_rows(store.require_sweep("tune").id)
    study = tuner(path, "debug", tracking).study
    digests = [trial.user_attrs[CELLS_ATTR][0] for trial in study.trials]
    reused = [trial.number for trial in study.trials if trial.user_attrs.get(REUSED_ATTR)]
    assert len(rows) == len(set(digests)) == 5 - len(reused)  # one cell per distinct config, none twice
    assert all(row.attempts == 1 for row in rows)


def test_a_trial_whose_config_already_ran_reuses_its_cell(make_study, tracking: str) -> None:
    path = make_study(space="{type: categorical, choices: [0.8]}", trials=3)
    report = tuner(path, "debug", tracking).run(poll_s=0.1)
    assert report.states == {"COMPLETE": 3}
    study = tuner(path, "debug", tracking).study
    assert [bool(t.user_attrs.get(REUSED_ATTR)) for t in study.trials] == [False, True, True]
    assert len({t.values[0] for t in study.trials}) == 1
    store = Store.open()
    (row,) = store.cell_rows(store.require_sweep("tune").id)
    assert row.attempts == 1


@pytest.mark.slow
def test_the_pruner_stops_a_trial_whose_intermediate_values_are_worst(make_study, tracking: str, workdir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two trials in turn (the grid sampler, seed 1: 0.8 first, then 0.2): 0.8 scores 1 per step, 0.2 scores 0.4.
    `warmup_steps: 1` protects each trial's first step; once the first trial has completed, the median pruner
    stops the second at step 2, its first step past the warm-up: its cell ends `pruned` there, and Optuna records
    it pruned. Driven by events: a job runs step k only after the tuner has seen step k - 1 (the gate), so the
    outcome does not depend on the machine's speed."""
    from optuna.trial import TrialState

    gate = Gate(workdir / "gate.json").install(monkeypatch)
    path = make_study(steps=12, space="{type: categorical, choices: [0.8, 0.2]}", sampler="grid", seed=1,
                      pruner="{name: median, startup_trials: 1, warmup_steps: 1}", trials=2)
    tune = tuner(path, "local", tracking)
    store = Store.open()

    def open_one_step_past_what_the_tuner_saw(_report) -> None:
        runs = {row.digest: row.mlflow_run_id for row in store.cell_rows(tune.sweep.id)}
        for trial in tune.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            seen = max(trial.intermediate_values, default=0)
            for digest in trial.user_attrs.get(CELLS_ATTR, []):
                if runs.get(digest):
                    gate.allow(runs[digest], seen + 1)

    report = tune.run(poll_s=0.1, on_poll=open_one_step_past_what_the_tuner_saw)
    study = tuner(path, "local", tracking).study
    assert [trial.params["filter.value"] for trial in study.trials] == [0.8, 0.2]
    assert [trial.state.name for trial in study.trials] == ["COMPLETE", "PRUNED"] and report.trials == 2
    assert sorted(study.trials[1].intermediate_values) == [1, 2]  # step 1 protected, pruned at step 2
    rows = {json.loads(row.varied_json)["filter.value"]: row
            for row in store.cell_rows(store.require_sweep("tune").id)}
    assert (rows[0.8].state, rows[0.2].state) == ("finished", "pruned")
    steps = [m.step for m in MlflowClient(tracking).get_metric_history(rows[0.2].mlflow_run_id, "test/score")]
    assert max(steps) == 2  # reported past the warm-up, stopped at the step it was pruned, before its last step


@pytest.mark.parametrize(("section", "message"), [
    ("study:\n  space: {filter.valeu: {type: float, low: 0.1, high: 0.9}}\n  objectives: [{metric: m}]\n  trials: 2",
     "study.space.filter.valeu"),
    ("study:\n  space: {filter.value: {type: float, low: 0.9, high: 0.1}}\n  objectives: [{metric: m}]\n  trials: 2",
     "needs `low` < `high`"),
    ("study:\n  space: {filter.prob_mode: {type: categorical}}\n  objectives: [{metric: m}]\n  trials: 2",
     "needs `choices`"),
    ("study:\n  space: {filter.value: {type: float, low: 0.1, high: 0.9}}\n  objectives: [{metric: a}, {metric: b}]\n"
     "  pruner: {name: median}\n  trials: 2", "pruning needs a single objective"),
    ("study:\n  space: {filter.value: {type: float, low: 0.1, high: 0.9}}\n  objectives: [{metric: m}]\n"
     "  sampler: {name: grid}\n  trials: 2", "the grid sampler needs a finite space"),
    ("study:\n  space: {filter.value: {type: float, low: 0.1, high: 0.9}}\n  objectives: [{metric: m}]\n"
     "  trials: 0", "trials"),
    ("study:\n  space: {filter.value: {type: float, low: 0.1, high: 3.0}}\n  objectives: [{metric: m}]\n  trials: 2",
     "3.0 for filter.value"),
    ("grid: {task: [sokoban]}\nstudy:\n  space: {filter.value: {type: float, low: 0.1, high: 0.9}}\n"
     "  objectives: [{metric: m}]\n  trials: 2", "remove `grid`"),
    ("study:\n  space: {filter.value: {type: float, low: 0.1, high: 0.9}}\n  objectives: [{metric: m}]\n"
     "  seeds_per_trial: 3\n  trials: 2", "3 seeds per trial"),
])
def test_a_bad_study_is_one_line_with_file_line_and_key_and_writes_nothing(sweep_file, workdir: Path, section: str,
                                                                           message: str) -> None:
    path = sweep_file(f"name: bad\nbase: {{trainer: test, filter: top_p}}\nseeds: [0]\n{section}\n", "bad.yaml")
    for args in (["--dry-run"], ["--cluster", "debug", "--wait"]):
        result = CliRunner().invoke(app, ["tune", str(path), *args])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "bad.yaml:" in lines[0] and message in lines[0], result.output
    assert sorted(p.name for p in workdir.iterdir()) == ["bad.yaml"]


def test_dry_run_prints_the_space_and_first_trials_and_orch_sweep_refuses_a_study(workdir: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "sweeps" / "tune_rho.yaml"
    result = CliRunner().invoke(app, ["tune", str(shipped), "--dry-run", "--profile", "cpu"])
    assert result.exit_code == 0, result.output
    assert "filter.value: float in [0.5, 1] step 0.02" in result.output
    assert "trial 0: filter.value=" in result.output and "dry run: nothing written" in result.output
    refused = CliRunner().invoke(app, ["sweep", str(shipped), "--dry-run"])
    assert refused.exit_code == 2 and "run it with `orch tune FILE`" in refused.output
    assert list(workdir.iterdir()) == []


@pytest.mark.slow
def test_a_background_tuner_killed_mid_trial_is_resumed_and_adopts_the_running_cell(make_study, tracking: str,
                                                                                     monkeypatch) -> None:
    """`orch tune FILE` (no --wait) tunes in the background; kill -9 it while a trial's cell runs; `orch tune
    FILE --wait` continues the same study: the running cell is adopted (one attempt), every trial ends once."""
    import os
    import signal
    import time

    monkeypatch.setenv("ORCH_TEST_STEP_S", "0.4")
    path = make_study(steps=6, trials=3)
    started = CliRunner().invoke(app, ["tune", str(path), "--tracking-uri", tracking])
    assert started.exit_code == 0 and "tuning in the background" in started.output, started.output
    pid = int(started.output.split("(pid ")[1].split(",")[0])
    store = Store.open()
    deadline = time.monotonic() + 120
    while not (store.sweep("tune") and store.counts(store.require_sweep("tune").id).get("running")):
        assert time.monotonic() < deadline, (Path(".orch/sweeps/tune/tuner.log").read_text()
                                             if Path(".orch/sweeps/tune/tuner.log").exists() else "no log")
        time.sleep(0.2)
    again = CliRunner().invoke(app, ["tune", str(path), "--wait"])  # the first tuner holds the study: refused
    assert again.exit_code == 2 and "another `orch tune` runs it" in again.output
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    resumed = CliRunner().invoke(app, ["tune", str(path), "--wait", "--tracking-uri", tracking])
    assert resumed.exit_code == 0, resumed.output
    assert "3 trials (3 complete)" in resumed.output and "use it: --set filter.value=" in resumed.output
    rows = store.cell_rows(store.require_sweep("tune").id)
    assert all(row.state == "finished" and row.attempts == 1 for row in rows)
    assert len(rows) == len({row.digest for row in rows}) <= 3
