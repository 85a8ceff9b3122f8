"""The Std(RV)/Mean(RV) predictor's own hit rate (analysis/predictor_record.py): the outcome rule, the comparisons of
archived sweeps whose answer is known (a hit, a miss, an undecided, a sweep without filter arms), the record's
round trip and its guard against hand edits, and the line every report prints beside the predictor's verdict."""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd
import pytest

from analysis import names
from analysis.archive import write_archive
from analysis.mlflow_store import RunData
from analysis.predictor import HIT, MISS, NO_CALL, UNDECIDED, outcome
from analysis.predictor_record import hit_rate_line, load_record, make_record, measure, tally, write_record
from orchlib.errors import OrchError

# (task, baseline ratio on the first batch, baseline final successes, filtered final successes) per seed 0-3
TASKS = {
    "sokoban": (1.5, [0.10, 0.12, 0.11, 0.13], [0.30, 0.32, 0.31, 0.33]),  # likely helps, helped: a hit
    "frozenlake": (0.2, [0.40, 0.42, 0.41, 0.43], [0.50, 0.52, 0.51, 0.53]),  # unlikely to help, helped: a miss
    "countdown": (1.5, [0.20, 0.30, 0.20, 0.30], [0.10, 0.35, 0.15, 0.30]),  # likely helps, -2.5 [spans 0]
}


@pytest.mark.parametrize(
    ("verdict", "lo", "hi", "seeds", "expected"),
    [
        ("likely helps", 1.0, 5.0, 5, HIT),
        ("likely helps", -5.0, -1.0, 5, MISS),
        ("unlikely to help", -5.0, -1.0, 5, HIT),
        ("unlikely to help", 1.0, 5.0, 5, MISS),
        ("likely helps", -22.5, 2.5, 5, UNDECIDED),  # FrozenLake's long run
        ("unlikely to help", -5.0, 0.0, 5, UNDECIDED),  # an interval touching 0 spans it
        ("likely helps", 1.0, 5.0, 2, UNDECIDED),  # too few seeds for any verdict
        ("likely helps", math.nan, math.nan, 5, UNDECIDED),
        ("uncertain", 1.0, 5.0, 5, NO_CALL),
    ],
)
def test_the_outcome_of_one_comparison(verdict, lo, hi, seeds, expected):
    assert outcome(verdict, lo, hi, seeds) == expected


def sweep_data(sweep: str, tasks: dict, filtered_arm: bool = True) -> tuple[RunData, pd.DataFrame]:
    """Cell runs of ``tasks`` (final validation success at step 10, a predictor row per baseline run), with the
    filtered arm or only the baseline."""
    runs, metrics, predictions = [], [], []
    for task, (ratio, base, filt) in tasks.items():
        arms = [("none", base)] + ([("top_p", filt)] if filtered_arm else [])
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
                    predictions.append({"run_id": run_id, "step": 10, "ratio": ratio, "verdict": "",
                                        "num_prompts": 8, "zero_variance_share": 0.0})
    data = RunData(runs=pd.DataFrame(runs), metrics=pd.DataFrame(metrics), tracking_uri="synthetic", reader="sql")
    return data, pd.DataFrame(predictions)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """docs/results in small: sweep 'mixed' archived in two sessions, sweep 'baseline_only' without filter arms."""
    root = tmp_path_factory.mktemp("results")
    data, predictions = sweep_data("mixed", TASKS)
    for session, chosen in (("session1", ["sokoban"]), ("session2", ["frozenlake", "countdown"])):
        ids = [run for run in data.runs["run_id"] if run.split("-")[1] in chosen]
        part = RunData(runs=data.runs[data.runs["run_id"].isin(ids)],
                       metrics=data.metrics[data.metrics["run_id"].isin(ids)], tracking_uri="synthetic", reader="sql")
        write_archive(part, predictions[predictions["run_id"].isin(ids)], "mixed", root / "mixed" / session)
    alone, alone_predictions = sweep_data("baseline_only", {"sokoban": TASKS["sokoban"]}, filtered_arm=False)
    write_archive(alone, alone_predictions, "baseline_only", root / "baseline_only" / "session1")
    return root


def test_every_archived_sweep_with_both_arms_gives_its_comparisons(results):
    rows, skipped = measure(results)
    assert list(skipped) == ["baseline_only"]  # no filter arm: left out, and said so
    found = {row["task"]: row for row in rows}
    assert {row["sweep"] for row in rows} == {"mixed"} and set(found) == set(TASKS)
    assert found["sokoban"]["verdict"] == "likely helps" and found["sokoban"]["outcome"] == HIT
    assert found["sokoban"]["gain"] == pytest.approx(20.0) and found["sokoban"]["lo"] > 0
    assert found["frozenlake"]["verdict"] == "unlikely to help" and found["frozenlake"]["outcome"] == MISS
    countdown = found["countdown"]
    assert countdown["outcome"] == UNDECIDED and countdown["gain"] == pytest.approx(-2.5)
    assert countdown["lo"] < 0 < countdown["hi"] and countdown["ratio"] == pytest.approx(1.5)
    assert countdown["base_n"] == countdown["filt_n"] == countdown["ratio_runs"] == 4
    counts = tally(rows)
    assert (counts["n"], counts["decided"], counts["hits"], counts["misses"]) == (4 - 1, 2, 1, 1)
    assert counts["undecided"] == 1 and counts["against"] == 1  # countdown: 'likely helps', point estimate -2.5
    assert counts["wilson"][0] < 0.5 < counts["wilson"][1]


def test_the_record_round_trips_and_refuses_counts_its_rows_do_not_give(results, tmp_path):
    rows, skipped = measure(results)
    path = write_record(make_record(rows, skipped, "python benchmarks/bench_predictor.py --record, 2026-11-28"),
                        tmp_path / "predictor_record.yaml")
    record = load_record(path)
    assert record["rows"] == rows and record["hits"] == 1 and record["skipped"] == skipped
    assert record["thresholds"] == {"helps_above": 1.0, "hurts_below": 0.5}
    assert load_record(tmp_path / "absent.yaml") == {}
    text = path.read_text()
    path.write_text(text.replace("hits: 1", "hits: 2"))
    with pytest.raises(OrchError, match="hits 2 but its rows give 1"):
        load_record(path)
    path.write_text(text.replace("outcome: miss", "outcome: hit"))  # frozenlake: 'unlikely to help', and it helped
    with pytest.raises(OrchError, match="mixed frozenlake is recorded as 'hit', but its verdict and interval give 'miss'"):
        load_record(path)


def test_the_line_gives_the_rate_the_cases_and_how_thin_it_is(results):
    rows, skipped = measure(results)
    line = hit_rate_line(make_record(rows, skipped, "python benchmarks/bench_predictor.py --record, 2026-11-28"))
    assert "1/2 decided comparisons hit (Wilson 95% " in line
    assert "mixed countdown said likely helps (ratio 1.50), measured -2.5 [" in line
    assert "undecided by the data (1, point estimate against the verdict in 1)" in line
    assert "n = 3 comparisons, 2 decided: far too thin to recalibrate" in line
    assert "2026-11-28" in line and "finding 4's rule" in line
    assert "not measured yet" in hit_rate_line({})


def test_the_shipped_record_holds_the_long_runs_and_loads():
    record = load_record()
    cases = {(row["sweep"], row["task"]): row for row in record["rows"]}
    frozen = cases[("repro_long", "frozenlake")]
    assert frozen["verdict"] == "likely helps" and frozen["gain"] == pytest.approx(-7.5)
    assert frozen["outcome"] == UNDECIDED
    assert "controls_graded" in record["skipped"]


def test_reports_print_the_line_beside_the_verdict(results, monkeypatch):
    from analysis import predictor_record
    from analysis.answers import predictor
    from analysis.archive import read_archives
    from analysis.report import build_report
    from analysis.science import filter_effect
    from analysis.summary import summarize

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

    from analysis import predictor_record
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
    from analysis import mlflow_store, predictor_record, report
    from analysis.archive import read_archives

    monkeypatch.setattr(predictor_record, "RECORD", Path("/nonexistent/predictor_record.yaml"))
    data, predictions = read_archives(sorted((results / "mixed").iterdir()), "mixed")

    def load_runs(query, uri=None, progress=None):  # only the predictor's sweep (table4) has run
        if query.sweep != "table4":
            raise OrchError(f"no sweep {query.sweep}")
        return data

    monkeypatch.setattr(mlflow_store, "load_runs", load_runs)
    monkeypatch.setattr(report, "_first_batches", lambda data, summary, progress: ({}, predictions, []))
    built = report.build_paper_report("synthetic", n_boot=50)
    predictor = next(s for s in built.sections if "Std(RV)/Mean(RV) predictor" in s.title)
    assert any(isinstance(block, str) and html.escape(hit_rate_line({})) in block for block in predictor.blocks)
    others = [s for s in built.sections if s is not predictor]
    assert not any("Predictor hit rate" in block for s in others for block in s.blocks if isinstance(block, str))
