"""The Std(RV)/Mean(RV) predictor on constructed batches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.stats.predictor import (
    RHO_GRID,
    VERDICT_HELPS,
    VERDICT_HURTS,
    VERDICT_UNCERTAIN,
    PredictorThresholds,
    predict,
    predict_frame,
    rv_ratio,
)
from orchlib.errors import OrchError


def batch_from_success_rates(rates: list[float], samples: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Binary rewards: prompt p succeeds on exactly round(rate * samples) of its samples."""
    rewards, prompts = [], []
    for prompt, rate in enumerate(rates):
        wins = round(rate * samples)
        rewards += [1.0] * wins + [0.0] * (samples - wins)
        prompts += [prompt] * samples
    return np.array(rewards), np.array(prompts)


def test_bimodal_batch_is_predicted_to_help():
    # half the prompts near 50% success (max variance), half all-fail (zero variance)
    rewards, prompts = batch_from_success_rates([0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    report = predict(rewards, prompts)
    var = np.array([np.var([1.0] * 8 + [0.0] * 8, ddof=1)] * 4 + [0.0] * 4)
    assert report.ratio["var"] == pytest.approx(var.std() / var.mean())  # = 1.0 for a half-zero batch
    assert report.zero_variance_share == 0.5
    assert report.verdict == VERDICT_HELPS


def test_uniform_batch_is_predicted_not_to_help():
    rewards, prompts = batch_from_success_rates([0.5, 0.4375, 0.5, 0.5625, 0.5, 0.5, 0.4375, 0.5625])
    report = predict(rewards, prompts)
    assert report.ratio["var"] < 0.1
    assert report.verdict == VERDICT_HURTS
    assert "0.33 hurt" in report.reason and "1.29" in report.reason


def test_verdict_thresholds_are_options():
    rewards, prompts = batch_from_success_rates([0.5, 0.25, 0.0625, 0.0625, 0.5, 0.25, 0.0625, 0.0625])
    ratio = predict(rewards, prompts).ratio["var"]
    assert 0.5 <= ratio < 1.0
    assert predict(rewards, prompts).verdict == VERDICT_UNCERTAIN
    assert predict(rewards, prompts, thresholds=PredictorThresholds(helps_above=ratio)).verdict == VERDICT_HELPS
    with pytest.raises(OrchError, match="hurts_below <= helps_above"):
        PredictorThresholds(helps_above=0.2, hurts_below=0.5)


def test_all_zero_variance_batch_has_no_ratio():
    rewards, prompts = batch_from_success_rates([0.0, 1.0, 0.0])
    report = predict(rewards, prompts)
    assert report.ratio == {"var": None, "std": None}
    assert report.verdict == VERDICT_HURTS
    assert report.to_json()["ratio"] is None
    assert rv_ratio(np.zeros(3)) is None


def test_kept_fractions_cover_grid_and_both_modes():
    rewards, prompts = batch_from_success_rates([0.5, 0.5, 0.0, 0.0], samples=8)
    report = predict(rewards, prompts)
    assert [(k.prob_mode, k.rho) for k in report.kept] == [(m, r) for m in ("linear", "softmax") for r in RHO_GRID]
    linear = [k for k in report.kept if k.prob_mode == "linear"]
    # linear drops the two zero-variance prompts: at most half is kept, and 2 equal groups need both for rho > 0.5
    assert all(k.prompts == 0.5 and k.trajectories == 0.5 for k in linear if k.rho > 0.5)
    softmax = [k for k in report.kept if k.prob_mode == "softmax"]
    assert all(k.include_zero for k in softmax) and all(k.prompts >= 0.25 for k in softmax)


def test_metric_choice_changes_the_ratio_used_and_json_reports_both():
    rewards, prompts = batch_from_success_rates([0.5, 0.125, 0.0, 0.5])
    by_std = predict(rewards, prompts, metric="std")
    by_var = predict(rewards, prompts, metric="var")
    assert by_std.ratio == by_var.ratio  # both always computed
    doc = by_std.to_json()
    assert doc["ratio"] == by_std.ratio["std"] != by_var.to_json()["ratio"]
    assert set(doc) >= {"ratio", "rv", "zero_variance_share", "kept", "verdict", "reason", "thresholds"}
    with pytest.raises(OrchError, match="valid choices: std, var"):
        predict(rewards, prompts, metric="mad")


def test_single_sample_prompts_are_rejected_with_the_source():
    with pytest.raises(OrchError, match=r"batch.jsonl \(step 3\): .*single trajectory"):
        predict([1.0, 0.0, 1.0], [0, 0, 1], source="batch.jsonl", step=3)


def test_frame_is_analysed_per_step():
    rewards, prompts = batch_from_success_rates([0.5, 0.0])
    frame = pd.concat(
        [pd.DataFrame({"prompt_id": prompts, "reward": rewards, "step": step}) for step in (1, 2)], ignore_index=True
    )
    assert [r.step for r in predict_frame(frame, "x")] == [1, 2]
    assert [r.step for r in predict_frame(frame, "x", step=2)] == [2]


def test_what_top_p_keeps_is_what_the_trainers_filter_keeps():
    """One batch, one answer: the predictor's linear row at rho 0.9 is `orch filter --strategy top_p --value 0.9`
    (the trainers' function, the configured score of conf/filter/_base.yaml), whatever score the ratio reads."""
    from pathlib import Path

    import yaml

    from analysis.stats.predictor import FILTER, predict_batch_file
    from recipes.stats.filtering import filter_groups
    from recipes.stats.rollouts import iter_steps, load_rollout_batch

    conf = yaml.safe_load((Path(__file__).parents[3] / "conf" / "filter" / "_base.yaml").read_text())
    assert FILTER.metric == conf["metric"] == "std" and FILTER.prob_mode == conf["prob_mode"]
    path = Path(__file__).parents[3] / "examples" / "sokoban_bimodal.parquet"
    frame = load_rollout_batch(path)
    for step, rows in iter_steps(frame, str(path)):
        result = filter_groups(rows["reward"].to_numpy(), rows["prompt_id"].to_numpy(), FILTER)
        for metric in ("var", "std"):
            (report,) = predict_batch_file(path, step=step, metric=metric)
            row = next(k for k in report.kept if k.prob_mode == "linear" and k.rho == FILTER.value)
            assert report.kept_metric == "std" and report.to_json()["kept_metric"] == "std"
            assert row.prompts == pytest.approx(result.keep_groups.mean()), (step, metric)
            assert row.trajectories == pytest.approx(result.keep_samples.mean()), (step, metric)


def test_the_cli_names_both_scores_and_prints_the_record_once(tmp_path):
    import json

    from typer.testing import CliRunner

    from analysis.stats.predictor_record import hit_rate_line
    from orchestrator.cli import app

    rewards, prompts = batch_from_success_rates([0.5, 0.5, 0.0, 0.0], samples=8)
    frame = pd.concat([pd.DataFrame({"prompt_id": prompts, "reward": rewards, "step": step}) for step in (1, 2)])
    path = tmp_path / "batch.csv"
    frame.to_csv(path, index=False)
    result = CliRunner().invoke(app, ["predict-filter-gain", str(path)], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert result.stdout.count(hit_rate_line()) == 1  # once per command, not per step
    assert "ranked by reward standard deviation (the trainer's filter score)" in result.stdout
    assert "RV as variance: mean / std / ratio" in result.stdout and "<- the verdict's ratio" in result.stdout
    assert "std(RV)/mean(RV) with RV the reward variance = " in result.stdout
    document = json.loads(CliRunner().invoke(app, ["predict-filter-gain", str(path), "--json"]).stdout)
    assert document["record"]["line"] == hit_rate_line() and "verdict_note" in document["record"]
    assert {report["kept_metric"] for report in document["reports"]} == {"std"}
