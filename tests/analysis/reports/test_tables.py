"""Table builders on constructed runs with known answers, and the published Table 4 and Table 5 numbers of RAGEN-2 (arXiv 2604.06268)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import paper
from analysis.reports import tables

TASKS = paper.TABLE4_TASKS
# RAGEN-2 (arXiv 2604.06268) Table 4, from the paper map (the one place published numbers live): baseline peak per
# task, filter delta per task, published (avg baseline, avg delta).
PUBLISHED_TABLE4 = paper.TABLE4
ROUNDING = 0.05 + 1e-9  # the paper prints one decimal


def published_cells(overrides: dict | None = None) -> pd.DataFrame:
    """One baseline and one filtered 'run' per published cell (peak success = the published numbers)."""
    rows = []
    for variant, (base, delta, _, _) in {**PUBLISHED_TABLE4, **(overrides or {})}.items():
        for task, b, d in zip(TASKS, base, delta, strict=True):
            if b is None:
                continue
            rows.append({"variant": variant, "task": task, "filter": "none", "filtered": False, "peak_success": b})
            rows.append({"variant": variant, "task": task, "filter": "top_p", "filtered": True, "peak_success": b + d})
    frame = pd.DataFrame(rows)
    frame["filtered"] = frame["filtered"].astype("boolean")
    return frame


def test_table4_reproduces_the_published_averages():
    long = tables.table4(published_cells())
    averages = long[long["task"] == tables.AVERAGE].set_index("variant")
    assert set(averages.index) == set(PUBLISHED_TABLE4)
    for variant, (base, delta, avg_base, avg_delta) in PUBLISHED_TABLE4.items():
        row = averages.loc[variant]
        assert abs(row["delta"] - avg_delta) <= ROUNDING, variant
        if avg_base is not None:
            assert abs(row["base_mean"] - avg_base) <= ROUNDING, variant
        cells = long[(long["variant"] == variant) & (long["task"] != tables.AVERAGE)]
        assert len(cells) == sum(b is not None for b in base)
        by_task = cells.set_index("task")["delta"]
        for task, d in zip(TASKS, delta, strict=True):
            if d is not None:
                assert by_task[task] == pytest.approx(d, abs=1e-9), (variant, task)


def test_table4_per_task_cells_are_the_published_ones():
    long = tables.table4(published_cells()).set_index(["variant", "task"])
    assert long.loc[("PPO Qwen2.5-3B", "Sokoban"), "base_mean"] == pytest.approx(12.9)
    assert long.loc[("PPO Qwen2.5-3B", "Sokoban"), "delta"] == pytest.approx(16.0)
    assert long.loc[("Qwen2.5-VL-3B, image input", "FrozenLake"), "delta"] == pytest.approx(59.5)
    assert ("Qwen2.5-VL-3B, image input", "Countdown") not in long.index


def test_the_other_grpo_frozenlake_report_does_not_give_the_published_average():
    minus = {"GRPO": ([12.1, 70.9, 91.2, 95.7], [9.0, -3.0, 1.2, 2.2], 67.5, 3.7)}
    long = tables.table4(published_cells(minus))
    grpo = long[(long["variant"] == "GRPO") & (long["task"] == tables.AVERAGE)]
    assert grpo["delta"].item() == pytest.approx(2.35)  # vs the published +3.7


def test_format_table4_layout():
    wide = tables.format_table4(tables.table4(published_cells()))
    assert list(wide.columns) == sorted(TASKS) + ["avg"]  # tasks in the table's (sorted) order, then avg
    assert wide.loc["PPO Qwen2.5-3B", "Sokoban"] == "12.9 (+16.0)"
    assert wide.loc["PPO Qwen2.5-3B", "avg"] == "67.6 (+6.9)"
    assert wide.loc["Qwen2.5-VL-3B, text input", "Countdown"] == "–"


def test_table4_from_the_demo_sweep_aggregates_seeds_and_flags_nothing_missing(demo_data):
    from analysis.stats.summary import summarize

    long = tables.table4(summarize(demo_data)).set_index(["variant", "task"])
    row = long.loc[("ppo", "sokoban")]
    assert (row["base_mean"], row["filt_mean"], row["delta"]) == pytest.approx((21.0, 31.0, 10.0))
    assert row["base_std"] == pytest.approx(math.sqrt(2.0))  # seeds 20 and 22: sample std
    assert (row["base_n"], row["filt_n"]) == (2, 2)  # the failed seed-2 run has no results
    assert long.loc[("grpo", "frozenlake"), "delta"] == pytest.approx(-3.0)
    assert long.loc[("ppo", "avg"), "delta"] == pytest.approx(6.0)
    assert tables.missing_pairs(tables.table4(summarize(demo_data)).reset_index(drop=True)) == []


def test_missing_pairs_names_the_cells_without_a_counterpart():
    cells = published_cells()
    cells = cells[~((cells["variant"] == "DAPO") & (cells["task"] == "Countdown") & cells["filtered"])]
    notes = tables.missing_pairs(tables.table4(cells))
    assert notes == ["DAPO, Countdown: no filtered run with results (top_p)"]


def _budget_runs() -> pd.DataFrame:
    # RAGEN-2 (arXiv 2604.06268) Table 5 from the paper map: (prompts, samples) -> success no-filter, filter; step
    # time no-filter, filter
    single_success, _, single_time, _ = paper.TABLE5[(128, 1)]
    rows = [{"prompts": 128, "samples": 1, "filtered": False, "peak_success": single_success, "step_time": single_time}]
    for (prompts, samples), (s0, s1, t0, t1) in paper.TABLE5.items():
        if s1 is None:
            continue
        rows.append({"prompts": prompts, "samples": samples, "filtered": False, "peak_success": s0, "step_time": t0})
        rows.append({"prompts": prompts, "samples": samples, "filtered": True, "peak_success": s1, "step_time": t1})
    frame = pd.DataFrame(rows).assign(task="sokoban", variant="ppo", seed=0)
    frame["filter"] = np.where(frame["filtered"], "top_p", "none")
    frame["filtered"] = frame["filtered"].astype("boolean")
    frame[["prompts", "samples"]] = frame[["prompts", "samples"]].astype("Int64")
    return frame


def test_table5_reproduces_the_published_step_time_changes():
    table = tables.table5(_budget_runs()).set_index("budget")
    assert table.loc["64×2", "time_change_pct"] == pytest.approx(-29.3, abs=0.05)
    assert table.loc["32×4", "time_change_pct"] == pytest.approx(-41.4, abs=0.05)
    assert table.loc["8×16", "time_change_pct"] == pytest.approx(-26.1, abs=0.05)
    assert table.loc["8×16", "delta"] == pytest.approx(8.0)
    single = table.loc["128×1"]
    assert single["base_mean"] == pytest.approx(23.6) and single["filt_n"] == 0 and np.isnan(single["time_change_pct"])


def _setting_runs() -> pd.DataFrame:
    # Table 6 / 7 shaped runs: two seeds per setting with known values
    rows = []
    for setting, (rv_lo, rv_hi, success, mi, entropy, kept) in {
        "quartile=1": (4.4, 5.6, 21.0, 0.95, 2.0, 2.0),
        "quartile=4": (0.0, 0.1, 11.0, 0.73, 1.9, 2.0),
    }.items():
        for seed, shift in ((0, -1.0), (1, 1.0)):
            rows.append({
                "task": "sokoban", "variant": "ppo", "filter": setting, "seed": seed,
                "rv_chosen_min": rv_lo, "rv_chosen_max": rv_hi, "peak_success": success + shift,
                "collapse/trajectory/mi_est": mi, "actor/entropy": entropy,
                "kept_groups": kept, "total_groups": 8.0, "kept_samples": kept * 16,
            })
    return pd.DataFrame(rows)


def test_table6_and_table7_per_setting_mean_std_n():
    t6 = tables.table6(_setting_runs()).set_index("filter")
    assert t6.loc["quartile=1", "peak_success_mean"] == pytest.approx(21.0)
    assert t6.loc["quartile=1", "peak_success_std"] == pytest.approx(math.sqrt(2.0))
    assert t6.loc["quartile=4", "rv_chosen_max_mean"] == pytest.approx(0.1)
    assert t6.loc["quartile=4", "collapse/trajectory/mi_est_mean"] == pytest.approx(0.73)
    assert t6.loc["quartile=1", "actor/entropy_n"] == 2
    t7 = tables.table7(_setting_runs()).set_index("filter")
    assert t7.loc["quartile=1", "kept_samples_mean"] == pytest.approx(32.0)
    assert "collapse/trajectory/mi_est_mean" in t7.columns


def test_rho_curve_counts_no_filter_as_rho_one():
    runs = pd.DataFrame({
        "task": "sokoban", "variant": "ppo",
        "rho": [1.0, 1.0, 0.9, 0.9, 0.6, np.nan],
        "peak_success": [10.0, 12.0, 20.0, 24.0, 8.0, 99.0],  # the NaN-rho run (another strategy) is left out
    })
    curve = tables.rho_curve(runs).set_index("rho")
    assert list(curve.index) == [0.6, 0.9, 1.0]
    assert curve.loc[0.9, "mean"] == pytest.approx(22.0) and curve.loc[0.9, "n"] == 2
    assert np.isnan(curve.loc[0.6, "std"])


def test_slip_curve_pairs_filter_and_no_filter_per_slip_rate():
    rows = []
    for slip, base, gain in ((0.0, 60.0, 5.0), (0.2, 40.0, 3.0), (1.0, 5.0, 0.0)):
        for filtered in (False, True):
            rows.append({"task": "frozenlake", "slip": slip, "filtered": filtered, "filter": "top_p" if filtered else "none",
                         "peak_success": base + (gain if filtered else 0.0), "cfg.task.env.slip": str(slip)})
    frame = pd.DataFrame(rows).assign(variant=lambda f: f["cfg.task.env.slip"])
    frame["filtered"] = frame["filtered"].astype("boolean")
    curve = tables.slip_curve(frame).set_index("slip")
    assert curve.loc[0.2, "delta"] == pytest.approx(3.0)
    assert curve.loc[1.0, "delta"] == pytest.approx(0.0)
    assert set(curve["variant"]) == {"base"}  # the slip key is the x-axis, not part of the variant


def test_table8_puts_the_predictor_beside_the_realised_gain(demo_data):
    from analysis.stats.predictor import predictions
    from analysis.stats.summary import summarize
    from analysis.stores.rollout_artifacts import load_batches

    summary = summarize(demo_data)
    predicted, notes = predictions(load_batches(demo_data.tracking_uri, list(summary["run_id"])))
    assert notes == []
    assert set(predicted["step"]) == {0}  # which="first"
    t8 = tables.table8(summary, predicted, tables.table4(summary)).set_index(["variant", "task"])
    sokoban = t8.loc[("ppo", "sokoban")]
    assert sokoban["ratio_mean"] == pytest.approx(math.sqrt(5 / 3)) and sokoban["ratio_n"] == 2
    assert sokoban["verdict"] == "likely helps" and sokoban["gain"] == pytest.approx(10.0) and sokoban["agrees"]
    frozen = t8.loc[("ppo", "frozenlake")]
    assert frozen["ratio_mean"] == pytest.approx(0.0) and frozen["verdict"] == "unlikely to help"
    assert frozen["gain"] == pytest.approx(2.0) and not frozen["agrees"]
    assert t8.loc[("grpo", "frozenlake"), "agrees"]  # unlikely to help, and it hurt (-3)


def test_local_rollout_batches_are_read_as_mlflows_client_reads_them(demo_data):
    """Batches read straight from the runs' local artifact folders (artifact_uris, issue 60) are those MLflow's
    client lists and downloads: the same steps and frames; a remote URI goes through the client."""
    import pandas as pd

    from analysis.stores.rollout_artifacts import _local_steps, dumped_steps, load_batches, local_folder
    from recipes.run.tracking import mlflow_client

    runs = list(demo_data.runs["run_id"])
    uris = dict(zip(demo_data.runs["run_id"], demo_data.runs["artifact_uri"], strict=True))
    client = mlflow_client(demo_data.tracking_uri)
    for run_id in runs:
        assert _local_steps(local_folder(uris[run_id])) == dumped_steps(client, run_id)
    local = load_batches(demo_data.tracking_uri, runs, which="all", artifact_uris=uris)
    through_client = load_batches(demo_data.tracking_uri, runs, which="all")
    assert local.keys() == through_client.keys() and local
    for run_id, frame in local.items():
        pd.testing.assert_frame_equal(frame, through_client[run_id])
    assert local_folder("s3://bucket/artifacts") is None and local_folder("mlflow-artifacts:/1/x") is None
