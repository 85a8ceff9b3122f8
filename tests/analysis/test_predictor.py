"""The Std(RV)/Mean(RV) predictor on constructed batches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.predictor import (
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
