"""Per-run settings and results read from MLflow runs."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.stats.summary import (
    distinguishing_keys,
    metric_stats,
    metric_summary,
    settings,
    summarize,
    variant_without,
)


def test_summary_of_the_demo_sweep(demo_store, demo_data):
    summary = summarize(demo_data).set_index("run_id")
    assert len(summary) == 18  # cells only: the parent run is left out
    assert demo_store.parent_run not in summary.index
    run = summary.loc[demo_store.run_ids["frozenlake", "grpo", True, 1]]
    assert (run["task"], run["algorithm"], run["model"], run["seed"]) == ("frozenlake", "grpo", "tiny", 1)
    assert (run["variant"], run["filter"], bool(run["filtered"]), run["rho"]) == ("grpo", "top_p", True, 0.9)
    assert run["peak_success"] == pytest.approx(54.0) and run["final_success"] == pytest.approx(27.0)
    assert run["peak_step"] == 30 and run["steps"] == 60
    assert run["step_time"] == pytest.approx(7.0) and run["kept_ratio"] == pytest.approx(0.5)
    assert (run["kept_groups"], run["total_groups"], run["kept_samples"]) == pytest.approx((4.0, 8.0, 32.0))
    assert (run["rv_chosen_min"], run["rv_chosen_max"]) == pytest.approx((0.45, 0.45))
    assert (run["prompts"], run["samples"]) == (8, 8)
    baseline = summary.loc[demo_store.run_ids["sokoban", "ppo", False, 0]]
    assert (baseline["filter"], bool(baseline["filtered"]), baseline["rho"]) == ("none", False, 1.0)


def test_cells_without_params_take_their_setting_from_the_sweep_tags(demo_store, demo_data):
    summary = summarize(demo_data).set_index("run_id")
    scheduled = summary.loc[demo_store.scheduled_run]  # never started: only the sweep engine's tags
    assert (scheduled["status"], scheduled["task"], scheduled["variant"], scheduled["seed"]) == (
        "SCHEDULED", "frozenlake", "grpo", 2
    )
    assert scheduled["filter"] == "none" and not scheduled["filtered"]
    assert pd.isna(scheduled["peak_success"])
    failed = summary.loc[demo_store.failed_run]
    assert (failed["status"], failed["filter"], bool(failed["filtered"])) == ("FAILED", "top_p", True)


def test_variant_is_the_smallest_set_of_keys_that_tells_settings_apart():
    config = pd.DataFrame({
        "task.name": ["a", "a", "b", "b", "a", "a"],
        "algorithm.name": ["ppo", "grpo", "ppo", "grpo", "ppo", "ppo"],
        "algorithm.clip": ["0.28", "0.2", "0.28", "0.2", "0.28", "0.28"],  # follows algorithm.name
        "task.env.turns": ["5", "5", "4", "4", "5", "5"],  # follows task.name
        "model.path": ["m/3B", "m/3B", "m/3B", "m/3B", "m/7B", None],  # None: unknown, not a value
    })
    keys = distinguishing_keys(config, ["task.name"], ["algorithm.name", "algorithm.clip", "task.env.turns", "model.path"])
    assert keys == ["algorithm.name", "model.path"]


def test_model_path_labels_the_model_and_variant_without_drops_a_key():
    runs = pd.DataFrame({
        "run_id": ["r1", "r2", "r3", "r4"],
        "run_name": ["a", "b", "c", "d"],
        "status": ["FINISHED"] * 4,
        "params.task.name": ["frozenlake"] * 4,
        "params.model.name": ["hf", "hf", "tiny", "hf"],
        "params.model.path": ["/models/Qwen2.5-0.5B/", "/models/Qwen2.5-7B", "None", "/models/Qwen2.5-0.5B/"],
        "params.task.env.slip": ["0.0", "0.2", "0.2", "0.2"],
        "params.filter.strategy": ["top_p", "none", "top_p", "top_p"],
        "params.filter.value": ["0.95", "1.0", "1.0", "0.9"],
        "params.filter.name": ["top_p", "none", "top_p", "top_p"],
        "params.seed": ["0", "0", "1", "1"],
    })
    frame = settings(runs).set_index("run_id")
    assert list(frame["model"]) == ["Qwen2.5-0.5B", "Qwen2.5-7B", "tiny", "Qwen2.5-0.5B"]
    assert list(frame["slip"]) == [0.0, 0.2, 0.2, 0.2]
    assert list(frame["filtered"]) == [True, False, False, True]  # top_p with rho 1.0 keeps everything
    assert list(frame["rho"]) == [0.95, 1.0, 1.0, 0.9]
    assert list(frame["filter"]) == ["top_p value=0.95", "none", "none", "top_p value=0.9"]
    assert list(frame["variant"]) == ["Qwen2.5-0.5B, 0.0", "Qwen2.5-7B, 0.2", "tiny, 0.2", "Qwen2.5-0.5B, 0.2"]
    assert list(variant_without(frame, ("task.env.slip",))) == ["Qwen2.5-0.5B", "Qwen2.5-7B", "tiny", "Qwen2.5-0.5B"]


def test_metric_stats_and_summary(demo_store, demo_data):
    run_id = demo_store.run_ids["sokoban", "ppo", False, 0]
    stats = metric_stats(demo_data, "val/success_rate").loc[run_id]
    assert stats["peak"] == pytest.approx(0.20) and stats["peak_step"] == 30
    assert stats["last"] == pytest.approx(0.10) and stats["n"] == 7
    assert stats["final"] == pytest.approx((0.20 * (5 / 6) + 0.20 * (2 / 3) + 0.10) / 3)  # mean of the last 3
    wide = metric_summary(demo_data, ["actor/entropy", "not/logged"], "mean")
    assert list(wide.columns) == ["actor/entropy"]
    assert wide.loc[run_id, "actor/entropy"] == pytest.approx(1.0 + 0.01 * 30.5)
    with pytest.raises(Exception, match="unknown summary statistic"):
        metric_summary(demo_data, ["actor/entropy"], "median")


def test_tail_means_are_pandas_tail_means_bit_for_bit():
    """metric_stats' final (summary._tail_means, every run at once) is each run's Series.tail(TAIL).mean(), bit for
    bit: NaN left out, runs shorter than the tail, all-NaN tails, negative zeros."""
    import numpy as np

    from analysis.stats.summary import TAIL, _tail_means

    rng = np.random.default_rng(6)
    sizes = [1, 2, 3, 5, 8, 2, 4]
    runs = np.repeat([f"run-{i}" for i in range(len(sizes))], sizes)
    values = rng.normal(size=runs.size) * 1e3
    values[[1, 4, 9]] = np.nan
    values[-4:] = [-0.0, -0.0, -0.0, -0.0]
    values[sizes[0] + sizes[1]:sizes[0] + sizes[1] + 3] = np.nan  # a run of NaN only
    history = pd.DataFrame({"run_id": runs, "step": np.arange(runs.size), "value": values})
    expected = history.groupby("run_id", sort=False)["value"].apply(lambda v: v.tail(TAIL).mean()).to_numpy()
    found = _tail_means(history)
    assert np.array_equal(found, expected, equal_nan=True)
    assert (np.signbit(found) == np.signbit(expected)).all()
