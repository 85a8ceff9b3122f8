"""The tiny-scale reproduction's verdicts (analysis/stats/science.py) and the report's first screen (analysis/reports/answers.py)
on synthetic sweeps written to a real SQLite MLflow store, each built so its answers are known:

* ``story`` -- the paper's story (4 seeds per arm, Sokoban): without the filter MI-ZScore-EMA and retrieval fall
  from step 8, entropy stays flat, success declines from step 20 (MI first: lead 8 steps), the alert fires at step
  16; with top-p both MI and success stay high; the baseline's first rollout batch is bimodal (ratio 1.29).
* ``against`` -- the opposite (4 seeds per arm, FrozenLake): MI flat, entropy falls by half, the filter lowers
  success (-20 points) although the first batch is bimodal ("likely helps").
* ``few`` -- 2 seeds per arm and the MI diagnostics off (``hooks=[]``): every finding inconclusive.
* ``one-seed`` -- ``against``'s FrozenLake with one seed per arm: not testable yet.
* ``plain`` -- one run per task, no filter, no diagnostics, no rollout batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.stats import science
from analysis.stats.science import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

STEPS = range(0, 25, 4)
MI_STEPS = (1, *range(4, 25, 4))
CHANCE = 1 / 32
ENTROPY_JITTER = (0.02, 0.0, 0.03, 0.01)  # uncorrelated with the seeds' success order


def _story(filtered: bool, seed: int) -> dict[str, list[tuple[int, float]]]:
    jitter = 0.01 * seed
    base_success = {0: 0.1, 4: 0.2, 8: 0.3, 12: 0.4, 16: 0.35, 20: 0.25, 24: 0.1}
    base_mi = {1: 2.0, 4: 2.0, 8: 1.6, 12: 1.2, 16: 0.8, 20: 0.5, 24: 0.4}
    return {
        "val/success_rate": [(s, (0.5 if filtered and s >= 12 else base_success[min(s, 12) if filtered else s]) + jitter)
                             for s in STEPS],
        "collapse/trajectory/mi_zscore_ema": [(s, (2.0 if filtered else base_mi[s]) + jitter) for s in MI_STEPS],
        "collapse/trajectory/retrieval_acc": [(s, 0.3 if filtered or s < 8 else max(0.05, 0.3 - 0.02 * s))
                                              for s in MI_STEPS],
        "collapse/trajectory/retrieval_chance": [(s, CHANCE) for s in MI_STEPS],
        "collapse/trajectory/num_samples": [(s, 32.0) for s in MI_STEPS],
        "collapse/alert": [(s, 1.0 if not filtered and s >= 16 else 0.0) for s in MI_STEPS],
        "actor/entropy": [(s, 1.0 + 0.001 * s + ENTROPY_JITTER[seed] * (1 if filtered else -1)) for s in range(1, 25)],
    }


def _against(filtered: bool, seed: int) -> dict[str, list[tuple[int, float]]]:
    jitter = 0.01 * seed
    return {
        "val/success_rate": [(s, (0.3 if filtered else 0.5) + jitter) for s in STEPS],
        "collapse/trajectory/mi_zscore_ema": [(s, 1.0 + jitter) for s in MI_STEPS],
        "collapse/trajectory/retrieval_acc": [(s, 0.2) for s in MI_STEPS],
        "collapse/trajectory/retrieval_chance": [(s, CHANCE) for s in MI_STEPS],
        "collapse/alert": [(s, 0.0) for s in MI_STEPS],
        "actor/entropy": [(s, 2.0 - 0.05 * s + jitter) for s in range(1, 25)],
    }


def _no_diagnostics(filtered: bool, seed: int) -> dict[str, list[tuple[int, float]]]:
    return {"val/success_rate": [(s, 0.2 + 0.1 * filtered + 0.01 * seed) for s in STEPS],
            "actor/entropy": [(s, 1.0) for s in range(1, 25)]}


def _bimodal_batch(step: int) -> pd.DataFrame:
    """8 prompts x 8 samples; prompts 0-2 alternate rewards 0 / 10, the rest all 0: std(RV)/mean(RV) = 1.29."""
    return pd.DataFrame([{"prompt_id": f"p{p}", "reward": (10.0 if p < 3 else 0.0) * (k % 2), "step": step, "sample": k}
                         for p in range(8) for k in range(8)])


@dataclass(frozen=True)
class Sweeps:
    uri: str
    root: Path


def _write_sweep(client, root: Path, name: str, task: str, filters: tuple[bool, ...], seeds: range, metrics,
                 hooks: str, batches: bool) -> None:
    from mlflow.entities import Metric, Param

    experiment = client.create_experiment(name, artifact_location=(root / name).as_uri())
    client.create_run(experiment, run_name=name, tags={"sweep": name, "orch.role": "sweep"})
    for filtered in filters:
        for seed in seeds:
            setting = "top_p" if filtered else "none"
            run = client.create_run(experiment, run_name=f"{task}-{setting}-{seed}", tags={
                "sweep": name, "cell": f"{task}-{setting}-{seed}", "seed": str(seed), "task": task}).info.run_id
            params = {"task.name": task, "algorithm.name": "ppo", "model.name": "tiny", "seed": str(seed),
                      "filter.name": setting, "filter.strategy": setting, "filter.value": "0.9" if filtered else "1.0",
                      "hooks": hooks}
            logged = [Metric(key, value, 1_700_000_000_000 + step, step)
                      for key, points in metrics(filtered, seed).items() for step, value in points]
            client.log_batch(run, metrics=logged, params=[Param(k, v) for k, v in params.items()])
            if batches and not filtered:
                local = root / f"{name}-{seed}" / "step_0000.parquet"
                local.parent.mkdir()
                _bimodal_batch(0).to_parquet(local, index=False)
                client.log_artifact(run, str(local), "rollouts")
            client.set_terminated(run, "FINISHED")


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> Sweeps:
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("science")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    _write_sweep(client, root, "story", "sokoban", (False, True), range(4), _story, "['collapse']", True)
    _write_sweep(client, root, "against", "frozenlake", (False, True), range(4), _against, "['collapse']", True)
    _write_sweep(client, root, "few", "sokoban", (False, True), range(2), _no_diagnostics, "[]", False)
    _write_sweep(client, root, "one-seed", "frozenlake", (False, True), range(1), _against, "['collapse']", False)
    for task in ("sokoban", "frozenlake"):
        _write_sweep(client, root, f"plain-{task}", task, (False,), range(1), _no_diagnostics, "[]", False)
    return Sweeps(uri, root)


def _load(sweeps: Sweeps, *names: str):
    from analysis.stats.summary import summarize
    from analysis.stores.mlflow_store import RunQuery, load_runs

    frames = [load_runs(RunQuery(sweep=name), sweeps.uri, reader="sql") for name in names]
    from analysis.stores.mlflow_store import RunData

    data = RunData(runs=pd.concat([f.runs for f in frames], ignore_index=True),
                   metrics=pd.concat([f.metrics for f in frames], ignore_index=True),
                   tracking_uri=sweeps.uri, reader="sql")
    return data, summarize(data)


def _predictions(sweeps: Sweeps, summary: pd.DataFrame) -> pd.DataFrame:
    from analysis.stats.predictor import predictions
    from analysis.stores import rollout_artifacts

    baseline = summary.loc[~summary["filtered"].astype(bool), "run_id"]
    return predictions(rollout_artifacts.load_batches(sweeps.uri, list(baseline)))[0]


def _verdicts(sweeps: Sweeps, name: str, with_batches: bool = True) -> dict[str, str]:
    data, summary = _load(sweeps, name)
    found = science.science(data, summary, _predictions(sweeps, summary) if with_batches else None)
    assert not found.reason
    assert len({f.key for f in found.findings}) == len(found.findings)  # one task, one filter setting
    return {f.key: f.verdict for f in found.findings} | {f"{f.key} evidence": f.evidence for f in found.findings}


def test_the_papers_story_is_reproduced(sweeps):
    verdicts = _verdicts(sweeps, "story")
    assert [verdicts[key] for key in ("1a", "1b", "2", "3", "4")] == [REPRODUCED] * 5, verdicts
    # the judge's ordering path (issue 56): scored on the runs where both declined, the decline rule's rate beside
    assert "MI first in 4 of 4 runs where both declined" in verdicts["1b evidence"]
    assert "mean lead +8.0 [+8.0, +8.0] steps" in verdicts["1b evidence"]
    assert "calibration runs with nothing to detect" in verdicts["1b evidence"]
    assert "the judge's direction path errs in up to" in verdicts["1a evidence"]  # its measured rate, where read
    assert "ratio 1.29 over 4 baseline runs: likely helps" in verdicts["4 evidence"]


def test_the_opposite_story_is_not_reproduced(sweeps):
    verdicts = _verdicts(sweeps, "against")
    assert verdicts["1a"] == NOT_REPRODUCED  # MI held, entropy fell
    assert verdicts["1b"] == INCONCLUSIVE and "at least 3 runs where both declined are needed" in verdicts["1b evidence"]
    assert verdicts["2"] == NOT_REPRODUCED and "success -20.0" in verdicts["2 evidence"]
    assert verdicts["4"] == NOT_REPRODUCED  # "likely helps", yet the filter hurt


def test_too_few_seeds_and_no_diagnostics_are_inconclusive(sweeps):
    verdicts = _verdicts(sweeps, "few", with_batches=False)
    assert {verdicts[key] for key in ("1a", "1b", "2", "3", "4")} == {INCONCLUSIVE}
    assert "the MI diagnostics were off" in verdicts["1a evidence"]
    assert "fewer than 3 seeds in an arm" in verdicts["2 evidence"]
    assert "not read (--no-rollouts)" in verdicts["4 evidence"]


def test_a_task_one_seed_short_is_left_untested_while_a_complete_task_is_tested(sweeps):
    """A long sweep lands task by task: Sokoban's verdicts must not wait for FrozenLake's second seed."""
    data, summary = _load(sweeps, "story", "one-seed")
    found = science.science(data, summary, _predictions(sweeps, summary))
    assert not found.reason
    assert {f.scope.split(" · ")[0] for f in found.findings} == {"sokoban"}
    assert [f.verdict for f in found.findings] == [REPRODUCED] * 5
    assert found.untested == ["frozenlake: every filter setting needs at least 2 seeds with results; none has 1"]

    alone = science.science(*_load(sweeps, "one-seed"))
    assert alone.reason == "frozenlake: every filter setting needs at least 2 seeds with results; none has 1"
    assert not alone.findings


def test_the_post_hoc_trend_test_reads_both_arms_beside_the_unchanged_verdicts(sweeps):
    """The story's baseline MI falls (2.0 -> 0.4) and its filtered MI is flat; entropy rises 2% in both arms (held).
    The pre-registered verdicts are the same as without the trend test; its lines never start with 'finding'."""
    from analysis import names
    from analysis.stats import trend

    data, summary = _load(sweeps, "story")
    found = science.science(data, summary, _predictions(sweeps, summary))
    assert [f.verdict for f in found.findings] == [REPRODUCED] * 5
    arms = found.trends["sokoban", "base"]
    assert list(arms) == ["none", "top_p"]  # the baseline first
    assert arms["none"][names.MI_ZSCORE_EMA].verdict == trend.FELL
    assert arms["top_p"][names.MI_ZSCORE_EMA].verdict == trend.NO_TREND
    assert {arm[names.ENTROPY].level for arm in arms.values()} == {trend.HELD}
    lines = science.trend_lines(found.trends)
    assert lines[0].startswith("post-hoc: trend test (read after the runs, not a pre-registered rule")
    assert f"at most {trend.FALSE_POSITIVE_RATE:.2%} of seeded trials" in lines[0]
    assert lines[1].startswith("post-hoc: trend test [sokoban] MI-ZScore-EMA -- none: fell -")
    assert "; top_p: no trend detected +0% [+0%, +0%] over steps 1-24 (4 runs: no trend detected 4)" in lines[1]
    assert "held (margin +-15%)" in lines[3]

    against = science.science(*_load(sweeps, "against"))
    entropy = against.trends["frozenlake", "base"]["none"][names.ENTROPY]
    assert (entropy.verdict, entropy.level) == (trend.FELL, trend.CHANGED)  # 1.95 -> 0.8


def test_interval_rules():
    assert science.side(*science.mean_interval([0.5, 0.6, 0.7, 0.55])[1:], 0.3) == "clears"
    assert science.side(*science.mean_interval([0.1, 0.0, 0.05])[1:], 0.3) == "misses"
    assert science.side(*science.delta_interval([1.0, 5.0, 3.0], [0.0, 6.0, 2.0])[1:], 0.0) == "spans"
    delta, lo, hi = science.delta_interval([1.0, 2.0], [3.0, 5.0])
    assert delta == pytest.approx(2.5) and lo <= delta <= hi


def _first_screen(report) -> str:
    return "\n".join(block for block in report.sections[0].blocks if isinstance(block, str))


def test_first_screen_answers_the_three_questions(sweeps, tmp_path):
    from analysis.reports.report import build_report

    report = build_report("story", sweeps.uri, n_boot=50)
    text = _first_screen(report)
    assert report.sections[0].title.startswith("The answers")
    assert sum(not isinstance(block, str) for block in report.sections[0].blocks) == 3  # one figure each
    assert "sokoban: final success 11.5% without the filter, 51.5% with top_p (+40.0 points" in text
    assert "4 vs 4 seeds): it helped." in text
    assert "MI-ZScore-EMA declined (at or below 70% of its running peak twice in a row) in 4 of 4 runs" in text
    assert "median lead 8 steps" in text and "fired in 4 of 4 runs (first at step 16; by step: 16 in 4 runs)" in text
    assert "Trend over training (post-hoc: trend test, made after the runs" in text
    assert "sokoban, filter none: MI-ZScore-EMA: fell -" in text and "Mean fall" not in text
    assert "sokoban, filter top_p: MI-ZScore-EMA: no trend detected" in text
    assert "std(RV)/mean(RV) = 1.29 on the first rollout batch (mean of 4 baseline runs): likely helps" in text
    assert [f.verdict for f in report.science.findings].count(REPRODUCED) == 5


def test_first_screen_says_why_when_the_diagnostics_were_off(sweeps, tmp_path):
    from analysis.reports.report import build_report

    report = build_report("few", sweeps.uri, n_boot=50)
    text = _first_screen(report)
    assert "Cannot tell: the MI diagnostics were off: no run had the collapse hook (run with hooks=[collapse])" in text
    assert "Cannot say: no baseline run dumped a rollout batch" in text
    assert "2 vs 2 seeds): fewer than 3 seeds per side, so no verdict." in text


def test_a_sweep_without_seeds_or_filters_still_reports(sweeps, tmp_path):
    from mlflow import MlflowClient

    from analysis.reports.report import build_report
    from orchestrator.cli import app

    client = MlflowClient(tracking_uri=sweeps.uri)  # both plain sweeps under one sweep tag
    for task in ("sokoban", "frozenlake"):
        for run in client.search_runs([client.get_experiment_by_name(f"plain-{task}").experiment_id]):
            client.set_tag(run.info.run_id, "sweep", "plain")
    report = build_report("plain", sweeps.uri, n_boot=50)
    text = _first_screen(report)
    assert "Cannot say: every run with results ran without the filter" in text
    assert "Cannot tell: the MI diagnostics were off" in text
    assert report.science.reason == "the sweep needs finished runs both without and with the filter"
    assert not any("Findings over seeds" in section.title for section in report.sections)

    out = tmp_path / "plain.html"
    result = CliRunner().invoke(app, ["report", "plain", "--out", str(out), "--tracking-uri", sweeps.uri,
                                      "--store", f"sqlite:///{tmp_path / 'orch.db'}", "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    assert "Did filtering help here?" in out.read_text(encoding="utf-8")
    assert "the paper's findings were not tested" in result.stderr


def test_report_command_prints_the_verdicts(sweeps, tmp_path):
    from orchestrator.cli import app

    result = CliRunner().invoke(app, ["report", "story", "--out", str(tmp_path / "r.html"), "--tracking-uri",
                                      sweeps.uri, "--store", f"sqlite:///{tmp_path / 'orch.db'}", "--bootstrap", "20"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("finding ")]
    assert [line.split("]")[1].split(":")[0].strip() for line in lines] == [REPRODUCED] * 5
    assert lines[0].startswith("finding 1a [sokoban] reproduced")
    post_hoc = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("post-hoc: trend test")]
    assert len(post_hoc) == 4  # the header, then MI-ZScore-EMA, retrieval excess and entropy with both arms
