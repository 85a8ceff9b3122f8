"""The Std(RV)/Mean(RV) predictor's hit rate, held out (analysis/stats/predictor_record.py), on archives whose answer is
known: planted gains against planted ratios (a hit, a miss, a gain near 0 that fell short of the gain of interest, an
unsettled one, a no call), the readings (var and std, first batch and first 3), the split, the refit, the trivial
rules, the power calculation, the record's guard and its equality with what the bench computes, and the line every
report prints beside the verdict."""

from __future__ import annotations

import html
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from analysis import names
from analysis.stats.predictor import (
    FELL_SHORT,
    HELPED,
    HIT,
    MISS,
    NO_CALL,
    UNDECIDED,
    UNSETTLED,
    gain_class,
    outcome,
)
from analysis.stats.predictor_record import (
    DELTA,
    FIT,
    HELD_OUT,
    KEPT,
    RESULTS,
    fit_thresholds,
    halves,
    hit_rate_line,
    load_record,
    make_record,
    measure,
    power_table,
    record_path,
    seeds_needed,
    tally,
    unit,
    write_record,
)
from analysis.stores.archive import write_archive
from analysis.stores.mlflow_store import RunData
from orchlib.errors import OrchError

BASE = [0.40, 0.42, 0.44]
# task -> (var ratio per step 1-3, std ratio per step 1-3, filtered successes, the planted outcome of the var-first
# reading at the shipped cuts)
TASKS = {
    "a": ([1.5, 1.5, 1.5], [0.9, 0.9, 0.9], [0.60, 0.62, 0.64], HIT),  # likely helps, +20: helped
    "b": ([0.2, 0.2, 0.2], [0.1, 0.1, 0.1], [0.60, 0.62, 0.64], MISS),  # unlikely to help, +20: helped
    "c": ([1.5, 1.2, 0.9], [1.2, 1.2, 1.2], [0.41, 0.42, 0.43], MISS),  # likely helps, 0 [-1.3, +1.3]: fell short
    "d": ([0.2, 0.3, 0.4], [0.2, 0.2, 0.2], [0.30, 0.32, 0.34], HIT),  # unlikely to help, -10: fell short
    "e": ([0.7, 0.7, 0.7], [1.1, 1.1, 1.1], [0.60, 0.62, 0.64], NO_CALL),  # uncertain
    "f": ([1.5, 1.5, 1.5], [1.5, 1.5, 1.5], [0.20, 0.45, 0.80], UNDECIDED),  # +7 [-20, +34]: unsettled
}


@pytest.mark.parametrize(
    ("verdict", "lo", "hi", "seeds", "delta", "expected"),
    [
        ("likely helps", 1.0, 5.0, 5, 0.0, HIT),
        ("likely helps", -5.0, -1.0, 5, 0.0, MISS),
        ("unlikely to help", -5.0, -1.0, 5, 0.0, HIT),
        ("unlikely to help", 1.0, 5.0, 5, 0.0, MISS),
        ("likely helps", -22.5, 2.5, 5, 0.0, UNDECIDED),  # finding 4's rule (delta 0): FrozenLake's long run spans 0
        ("likely helps", -22.5, 2.5, 5, DELTA, MISS),  # with a gain of interest of 5 points it fell short
        ("unlikely to help", -3.75, 2.52, 5, DELTA, HIT),  # Sokoban's long run: a gain near 0, decided
        ("likely helps", 0.5, 3.0, 5, DELTA, HIT),  # above 0, however small: helped
        ("likely helps", -1.0, 5.0, 5, DELTA, UNDECIDED),  # touching the gain of interest spans it
        ("unlikely to help", -5.0, 0.0, 5, 0.0, UNDECIDED),  # an interval touching 0 spans it
        ("likely helps", 1.0, 5.0, 2, DELTA, UNDECIDED),  # too few seeds for any verdict
        ("likely helps", math.nan, math.nan, 5, DELTA, UNDECIDED),
        ("uncertain", 1.0, 5.0, 5, DELTA, NO_CALL),
    ],
)
def test_the_outcome_of_one_condition(verdict, lo, hi, seeds, delta, expected):
    assert outcome(verdict, lo, hi, seeds, delta) == expected


def test_what_a_gain_shows():
    assert gain_class(0.1, 20.0, 3, DELTA) == HELPED
    assert gain_class(-20.0, 4.9, 3, DELTA) == FELL_SHORT
    assert gain_class(-20.0, 5.0, 3, DELTA) == UNSETTLED
    assert gain_class(0.1, 20.0, 2, DELTA) == UNSETTLED


def sweep_data(sweep: str, tasks: dict, filtered_arm: bool = True, old: bool = False) -> tuple[RunData, pd.DataFrame]:
    """Cell runs of ``tasks`` (final validation success at step 10; predictor rows at steps 1-3 per baseline run,
    without the std ratio and with only the first step when ``old``), with the filtered arm or only the baseline."""
    runs, metrics, predictions = [], [], []
    for task, (ratios, stds, filt, _) in tasks.items():
        arms = [("none", BASE)] + ([("top_p", filt)] if filtered_arm else [])
        for strategy, successes in arms:
            for seed, success in enumerate(successes):
                run_id = f"{sweep}-{task}-{strategy}-{seed}"
                runs.append({"run_id": run_id, "run_name": run_id, "status": "FINISHED",
                             "start_time": pd.Timestamp("2026-11-27", tz="UTC") + pd.Timedelta(seconds=len(runs)),
                             "end_time": pd.Timestamp("2026-11-28", tz="UTC"), "params.model.path": "tiny",
                             f"params.{names.PARAM_TASK}": task, f"params.{names.PARAM_SEED}": str(seed),
                             f"params.{names.PARAM_FILTER_STRATEGY}": strategy,
                             f"params.{names.PARAM_FILTER_VALUE}": "0.9" if strategy == "top_p" else "1.0",
                             f"tags.{names.TAG_CELL}": run_id})
                metrics += [{"run_id": run_id, "key": names.VAL_SUCCESS, "step": step, "timestamp": step,
                             "value": value} for step, value in ((0, 0.05), (10, success))]
                if strategy == "none":
                    for step, (ratio, std) in enumerate(zip(ratios, stds, strict=True), start=1):
                        if old and step > 1:
                            break
                        row = {"run_id": run_id, "step": step, "ratio": ratio, "verdict": "", "num_prompts": 8,
                               "zero_variance_share": 0.25}
                        predictions.append(row if old else {**row, "ratio_std": std})
    data = RunData(runs=pd.DataFrame(runs), metrics=pd.DataFrame(metrics), tracking_uri="synthetic", reader="sql")
    return data, pd.DataFrame(predictions)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """docs/results in small: sweep 'mixed' archived in two sessions, sweep 'old' (first batch, var only: as
    repro_long) and sweep 'baseline_only' without filter arms."""
    root = tmp_path_factory.mktemp("results")
    data, predictions = sweep_data("mixed", TASKS)
    for session, chosen in (("session1", ["a", "b", "c"]), ("session2", ["d", "e", "f"])):
        ids = [run for run in data.runs["run_id"] if run.split("-")[1] in chosen]
        part = RunData(runs=data.runs[data.runs["run_id"].isin(ids)],
                       metrics=data.metrics[data.metrics["run_id"].isin(ids)], tracking_uri="synthetic", reader="sql")
        write_archive(part, predictions[predictions["run_id"].isin(ids)], "mixed", root / "mixed" / session)
    old, old_predictions = sweep_data("old", {"a": TASKS["a"], "d": TASKS["d"]}, old=True)
    write_archive(old, old_predictions, "old", root / "old" / "session1")
    alone, alone_predictions = sweep_data("baseline_only", {"a": TASKS["a"]}, filtered_arm=False)
    write_archive(alone, alone_predictions, "baseline_only", root / "baseline_only" / "session1")
    return root


def test_every_condition_gets_its_readings_and_its_planted_outcome(results):
    rows, skipped = measure(results)
    assert list(skipped) == ["baseline_only"]  # no filter arm: left out, and said so
    record = make_record(rows, skipped, "test")
    found = {(row["sweep"], row["task"]): row for row in record["rows"]}
    assert set(found) == {("mixed", task) for task in TASKS} | {("old", "a"), ("old", "d")}
    for task, (ratios, stds, _, planted) in TASKS.items():
        row = found[("mixed", task)]
        assert row["outcome"] == planted, task
        assert row["ratios"]["var-first"] == pytest.approx(ratios[0])
        assert row["ratios"]["var-first3"] == pytest.approx(sum(ratios) / 3)
        assert row["ratios"]["std-first"] == pytest.approx(stds[0])
    assert found[("mixed", "c")]["gain"] == pytest.approx(0.0) and found[("mixed", "c")]["shown"] == FELL_SHORT
    assert found[("mixed", "f")]["shown"] == UNSETTLED
    assert set(found[("old", "a")]["ratios"]) == {"var-first"}  # an old archive: never a guessed reading
    # the held-out counts are the planted outcomes of the held-out conditions
    split = halves(rows)
    held = [row for row in record["rows"] if split[unit(row)] == HELD_OUT]
    assert record["hits"] == sum(row["outcome"] == HIT for row in held)
    assert record["misses"] == sum(row["outcome"] == MISS for row in held)
    assert record["n"] == len(held) and record["net"] == record["hits"] - record["misses"]


def test_the_split_is_by_name_balanced_and_keeps_a_baselines_arms_together(results):
    rows, _ = measure(results)
    split = halves(rows)
    assert halves(list(reversed(rows))) == split  # order of discovery does not matter
    assert abs(sum(h == FIT for h in split.values()) - sum(h == HELD_OUT for h in split.values())) <= 1
    moved = [dict(row, gain=-row["gain"]) for row in rows]  # no measured number moves a condition
    assert halves(moved) == split


def test_the_refit_moves_a_cut_only_when_the_fit_half_says_so():
    def row(shown):
        return {"shown": shown, "lo": 1.0 if shown == HELPED else -9.0, "hi": 9.0 if shown == HELPED else 1.0,
                "base_n": 3, "filt_n": 3, "gain": 5.0 if shown == HELPED else -4.0}

    agree = [row(HELPED), row(HELPED), row(FELL_SHORT), row(FELL_SHORT)]
    cuts, why = fit_thresholds([1.5, 1.6, 0.2, 0.3], agree)
    assert (cuts.hurts_below, cuts.helps_above) == (0.5, 1.0) and "net +4" in why  # the shipped cuts already fit
    disagree = [row(HELPED), row(HELPED), row(FELL_SHORT), row(FELL_SHORT)]
    cuts, _ = fit_thresholds([1.5, 1.6, 1.2, 0.3], disagree)  # 1.2 fell short: likely helps moves above it
    assert cuts.helps_above == pytest.approx(1.35) and cuts.hurts_below == pytest.approx(1.2) or cuts.hurts_below > 1.2
    few, why = fit_thresholds([1.5, 0.2], agree[1:3])
    assert (few.hurts_below, few.helps_above) == (0.5, 1.0) and "kept" in why


def test_the_trivial_rules_are_scored_on_the_same_held_out_conditions(results):
    rows, skipped = measure(results)
    record = make_record(rows, skipped, "test")
    held = [row for row in record["rows"] if row["half"] == HELD_OUT and KEPT in row["ratios"]]
    always = record["trivial"]["always likely helps"]["held_out"]
    assert always == tally(held, ["likely helps"] * len(held))
    assert record["beats"]["always likely helps"] == record["net"] - always["net"]


def test_seeds_needed_has_the_textbook_answer():
    # (1.96 + 0.8416)^2 * (10^2 + 10^2) / 10^2 = 15.7 -> 16 seeds per arm
    assert seeds_needed(10.0, 10.0, 10.0) == 16
    assert seeds_needed(0.0, 17.34, 5.0) == 95  # FrozenLake's long run: the filter arm's spread alone
    assert seeds_needed(0.1, 0.1, 10.0) == 3  # never fewer than MIN_SEEDS
    with pytest.raises(ValueError):
        seeds_needed(1.0, 1.0, 0.0)


def test_the_power_table_reads_each_arms_spread(results):
    from analysis.stats.summary import summarize
    from analysis.stores.archive import read_archives

    data, _ = read_archives(sorted((results / "mixed").iterdir()), "mixed")
    table = {row["task"]: row for row in power_table(summarize(data))}
    spread = statistics.stdev([20.0, 45.0, 80.0])  # task f's filtered arm, in points; the baseline 40, 42, 44
    assert table["f"]["sd_base"] == pytest.approx(2.0) and table["f"]["sd_filtered"] == pytest.approx(spread, abs=0.01)
    assert table["f"]["seeds_for_5"] == seeds_needed(2.0, spread, 5.0) and table["f"]["seeds"] == 3


def test_the_record_round_trips_and_refuses_counts_its_rows_do_not_give(results, tmp_path):
    rows, skipped = measure(results)
    record = make_record(rows, skipped, "python benchmarks/bench_predictor.py --record, 2026-12-02")
    path = write_record(record, tmp_path / "predictor_record.yaml")
    assert "&id" not in path.read_text()  # plain YAML, no anchors
    assert load_record(path) == record
    assert load_record(tmp_path / "absent.yaml") == {}
    text = path.read_text()
    path.write_text(text.replace(f"\nhits: {record['hits']}\n", f"\nhits: {record['hits'] + 1}\n", 1))
    with pytest.raises(OrchError, match="but its rows give"):
        load_record(path)
    path.write_text(text.replace("outcome: miss", "outcome: hit", 1))
    with pytest.raises(OrchError, match="is recorded as 'hit', but its verdict and interval give 'miss'"):
        load_record(path)


def test_the_line_names_the_score_the_reading_and_the_comparison(results):
    rows, skipped = measure(results)
    record = make_record(rows, skipped, "test")
    line = hit_rate_line(record)
    assert line.startswith("Predictor on orch's own runs (held-out half, RV as var, first batch, a gain of interest 5")
    assert f"{record['n']} held-out conditions, {record['decided']} decided" in line
    assert "docs/statistics.md#the-predictor-tested" in line and "\n" not in line
    assert "not measured yet" in hit_rate_line({})


def test_the_shipped_record_is_what_the_bench_computes():
    shipped = load_record()
    rows, skipped = measure(RESULTS)
    assert make_record(rows, skipped, shipped["source"]) == shipped, (
        "analysis/stats/predictor_record.yaml is stale: python benchmarks/bench_predictor.py --record")
    # --record writes the checkout's own file, the one load_record reads (after the move to analysis/stats/ it wrote
    # a stray analysis/predictor_record.yaml)
    assert record_path(Path(__file__).resolve().parents[3]) == record_path()


def test_reports_print_the_line_beside_the_verdict(results, monkeypatch):
    from analysis.reports.answers import predictor
    from analysis.reports.report import build_report
    from analysis.stats import predictor_record
    from analysis.stats.science import filter_effect
    from analysis.stats.summary import summarize
    from analysis.stores.archive import read_archives

    monkeypatch.setattr(predictor_record, "RECORD", Path("/nonexistent/predictor_record.yaml"))
    expected = hit_rate_line({})
    data, predictions = read_archives(sorted((results / "mixed").iterdir()), "mixed")
    summary = summarize(data)
    answer = predictor(summary, filter_effect(summary), predictions)
    assert answer.words[-1] == expected and "likely helps" in answer.words[0]

    report = build_report("mixed", archives=sorted((results / "mixed").iterdir()), n_boot=50)
    for title in ("The answers", "Will filtering help"):  # the first screen and Table 8's section
        section = next(s for s in report.sections if s.title.startswith(title))
        assert any(isinstance(block, str) and html.escape(expected) in block for block in section.blocks), title


def test_orch_report_prints_the_line_after_finding_4(results, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from analysis.stats import predictor_record
    from orchestrator.cli import app

    monkeypatch.setattr(predictor_record, "RECORD", Path("/nonexistent/predictor_record.yaml"))
    archives = [arg for folder in sorted((results / "mixed").iterdir()) for arg in ("--archive", str(folder))]
    result = CliRunner().invoke(app, ["report", "mixed", *archives, "--out", str(tmp_path / "r.html"),
                                      "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.stdout.splitlines()]
    last_4 = max(i for i, line in enumerate(lines) if line.startswith("finding 4 "))
    assert lines[last_4 + 1] == hit_rate_line({})


def test_the_paper_report_prints_the_line_in_the_predictor_section(results, monkeypatch):
    from analysis.reports import report
    from analysis.stats import predictor_record
    from analysis.stores import mlflow_store
    from analysis.stores.archive import read_archives

    monkeypatch.setattr(predictor_record, "RECORD", Path("/nonexistent/predictor_record.yaml"))
    data, predictions = read_archives(sorted((results / "mixed").iterdir()), "mixed")

    def load_runs(query, uri=None, progress=None):  # only the predictor's sweep (table4) has run
        if query.sweep != "table4":
            raise OrchError(f"no sweep {query.sweep}")
        return data

    monkeypatch.setattr(mlflow_store, "load_runs", load_runs)
    first = predictions.sort_values("step").drop_duplicates("run_id")  # what the store's first batches give
    monkeypatch.setattr(report, "_first_batches", lambda data, summary, progress: ({}, first, []))
    built = report.build_paper_report("synthetic", n_boot=50)
    predictor = next(s for s in built.sections if "Std(RV)/Mean(RV) predictor" in s.title)
    assert any(isinstance(block, str) and html.escape(hit_rate_line({})) in block for block in predictor.blocks)
    others = [s for s in built.sections if s is not predictor]
    assert not any("Predictor hit rate" in block for s in others for block in s.blocks if isinstance(block, str))
