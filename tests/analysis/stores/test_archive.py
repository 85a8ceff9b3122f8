"""`orch archive` and `orch report --archive`: a sweep's results kept as a small folder, reported from without the
tracking store, the same findings as from the store."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.reports.report import archive_sweep, build_report
from analysis.stores.archive import read_archives, write_archive
from analysis.stores.mlflow_store import RunData, RunQuery, load_runs
from orchestrator.cli import app
from orchlib.errors import OrchError


def orch(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def archived(demo_store, tmp_path_factory):
    folder = tmp_path_factory.mktemp("archives") / "demo"
    written, count, notes = archive_sweep("demo", folder, demo_store.uri)
    return written, count, notes


def test_an_archive_keeps_the_finished_runs_and_their_histories(demo_store, archived):
    folder, count, notes = archived
    assert count == 17  # the parent run and 16 cells: the FAILED and the SCHEDULED cell are left out, and said so
    assert any("left out 2 run(s) not finished" in note for note in notes), notes
    data, predictions = read_archives([folder], "demo")
    stored = load_runs(RunQuery(sweep="demo"), demo_store.uri)
    finished = stored.runs[stored.runs["status"].eq("FINISHED") | stored.runs["tags.orch.role"].eq("sweep")].reset_index(drop=True)
    pd.testing.assert_frame_equal(data.runs, finished, check_dtype=False)
    expected = stored.metrics[stored.metrics["run_id"].isin(finished["run_id"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(data.metrics, expected, check_dtype=False)
    assert data.reader == "archive" and data.tracking_uri == f"archive:{folder}"
    baseline = finished.loc[finished["params.filter.strategy"] == "none", "run_id"]
    assert set(predictions["run_id"]) == set(baseline)  # every baseline run dumped a first batch
    assert sum(path.stat().st_size for path in folder.iterdir()) < 200_000


def test_the_report_from_an_archive_finds_what_the_store_finds(demo_report, archived, tmp_path):
    from_store = demo_report  # build_report("demo", <the demo store>, n_boot=100): MLflow alone (tests/analysis/conftest.py)
    from_archive = build_report("demo", archives=[archived[0]], n_boot=100)
    assert [f.line() for f in from_archive.science.findings] == [f.line() for f in from_store.science.findings]
    assert [s.title for s in from_archive.sections] == [s.title for s in from_store.sections]
    predictor = next(s for s in from_archive.sections if s.title.startswith("Will filtering help"))
    assert any(isinstance(b, str) and "an archive does not keep" in b for b in predictor.blocks)
    assert any(isinstance(b, str) and "Table 8" in b for b in predictor.blocks)


def test_archives_of_one_sweep_read_as_one_and_a_run_in_two_is_read_from_the_later(archived, tmp_path):
    data, predictions = read_archives([archived[0]])
    ids = list(data.runs["run_id"])
    halves = []
    for name, part in (("a", ids[:8]), ("b", ids[8:])):
        subset = RunData(runs=data.runs[data.runs["run_id"].isin(part)], metrics=data.metrics[data.metrics["run_id"].isin(part)],
                         tracking_uri=data.tracking_uri, reader="sql")
        halves.append(write_archive(subset, predictions[predictions["run_id"].isin(part)], "demo", tmp_path / name))
    joined, joined_predictions = read_archives(halves, "demo")
    pd.testing.assert_frame_equal(joined.runs, data.runs, check_dtype=False)
    pd.testing.assert_frame_equal(joined.metrics, data.metrics, check_dtype=False)
    pd.testing.assert_frame_equal(joined_predictions, predictions.sort_values(["run_id", "step"]).reset_index(drop=True),
                                  check_dtype=False)

    # A session archived a run cut short (fewer steps, not finished); the next session of the same tracking store
    # continued it and archived it again: the run is read once, from the archive written last, wherever it stands
    # on the command line.
    run = data.runs.loc[data.runs["params.filter.strategy"].eq("none"), "run_id"].iloc[0]
    history = data.metrics[data.metrics["run_id"] == run]
    cut = RunData(runs=data.runs[data.runs["run_id"] == run].assign(status="RUNNING"),
                  metrics=history[history["step"] <= history["step"].median()], tracking_uri=data.tracking_uri, reader="sql")
    earlier = write_archive(cut, predictions.iloc[:0], "demo", tmp_path / "earlier")
    meta = json.loads((earlier / "archive.json").read_text())
    (earlier / "archive.json").write_text(json.dumps({**meta, "written": "2000-01-01T00:00:00Z"}))
    for order in ([earlier, archived[0]], [archived[0], earlier]):
        both, both_predictions = read_archives(order, "demo")
        pd.testing.assert_frame_equal(both.runs, data.runs, check_dtype=False)
        pd.testing.assert_frame_equal(both.metrics, data.metrics, check_dtype=False)
        assert set(both_predictions["run_id"]) == set(predictions["run_id"])
    # written in the same second: the later on the command line is the later snapshot
    newest = json.loads((archived[0] / "archive.json").read_text())["written"]
    (earlier / "archive.json").write_text(json.dumps({**meta, "written": newest}))
    last = read_archives([archived[0], earlier], "demo")[0]
    assert last.runs.loc[last.runs["run_id"] == run, "status"].tolist() == ["RUNNING"]
    assert last.metrics.loc[last.metrics["run_id"] == run, "step"].max() == cut.metrics["step"].max() < history["step"].max()
    assert len(last.runs) == len(data.runs)

    with pytest.raises(OrchError, match="an archive of sweep 'demo', not 'other'"):
        read_archives(halves, "other")


def test_the_commands_and_their_bad_input(demo_store, archived, tmp_path):
    folder = tmp_path / "kept"
    result = orch("archive", "demo", "--out", str(folder), "--tracking-uri", demo_store.uri)
    assert result.exit_code == 0, result.output
    assert f"wrote {folder}: 17 runs" in result.stdout
    out = tmp_path / "report.html"
    result = orch("report", "demo", "--archive", str(folder), "--out", str(out), "--bootstrap", "50")
    assert result.exit_code == 0, result.output
    assert "findings over seeds" in result.stdout and out.stat().st_size > 1_000_000

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "metrics.parquet").unlink()
    for argv, message in (
        (["archive", "demo", "--out", str(folder), "--tracking-uri", demo_store.uri], "already exists"),
        (["archive", "nope", "--out", str(tmp_path / "n"), "--tracking-uri", demo_store.uri], "unknown sweep 'nope'"),
        (["report", "demo", "--archive", str(tmp_path / "absent"), "--out", str(out)], "no such archive folder"),
        (["report", "demo", "--archive", str(broken), "--out", str(out)], "not an orch archive: missing metrics.parquet"),
        (["report", "other", "--archive", str(folder), "--out", str(out)], "an archive of sweep 'demo', not 'other'"),
        (["report", "--paper", "--archive", str(folder), "--out", str(out)], "not a paper sweep; valid: table4"),
    ):
        result = orch(*argv)
        assert result.exit_code == 2, (argv, result.output)
        assert result.stderr.startswith("orch: error: ") and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "n").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "kept", "report.html"]


def test_an_archive_that_cannot_be_written_is_one_error_and_leaves_nothing(archived, tmp_path, monkeypatch):
    import errno

    data, predictions = read_archives([archived[0]])

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    with pytest.raises(OrchError, match="could not be written \\(No space left on device\\)"):
        write_archive(data, predictions, "demo", tmp_path / "full")
    assert list(tmp_path.iterdir()) == []


def test_a_rehearsal_archive_says_so_and_is_never_evidence(archived, tmp_path):
    """The profile a sweep ran under goes into archive.json; the calibration records (the collapse alert's rates, the
    predictor's record) read every archive of a sweep but the rehearsal's, whose runs are generated data."""
    from analysis.stores.archive import archive_profile, evidence_sessions

    data, predictions = read_archives([archived[0]])
    assert json.loads((archived[0] / "archive.json").read_text())["profile"] is None  # the demo ran without one
    sweep_dir = tmp_path / "demo"
    evidence = write_archive(data, predictions, "demo", sweep_dir / "session1")
    rehearsed = data.runs.copy()
    rehearsed["params.profile"] = rehearsed["tags.orch.role"].map({"sweep": "rehearsal"})  # the sweep's parent run
    rehearsal = write_archive(RunData(rehearsed, data.metrics, data.tracking_uri, data.reader), predictions, "demo",
                              sweep_dir / "rehearsal-1")
    assert archive_profile(rehearsal) == "rehearsal"
    assert evidence_sessions(sweep_dir) == [evidence]
    meta = json.loads((rehearsal / "archive.json").read_text())
    del meta["profile"]  # an archive written before the key: its runs say which profile
    (rehearsal / "archive.json").write_text(json.dumps(meta))
    assert archive_profile(rehearsal) == "rehearsal" and evidence_sessions(sweep_dir) == [evidence]
