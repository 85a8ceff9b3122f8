"""The rehearsal of the whole paper (issue: "The paper, cell for cell"): every paper sweep runs under the `rehearsal`
profile (sweeps/profiles.yaml: the tiny model with a small warm start, 2 steps -- 5 on FrozenLake, where MI and
success are made to fall for the early warning --, one seed, a subset of cells) on the
real local executor, then `orch report --paper --strict` must find, in every finished cell, a finite value of every
metric its map items need, and render every item with at least one published value beside a measured one; no
measured value may be NaN, no section below its item's declared coverage, no path of the judge unexercised.
Removing one metric from one cell must make the check fail, naming the item and the metric. The numbers mean nothing
(a tiny model, 2 steps); what is tested is that a paper sweep comes back as the paper's report.

ORCH_REHEARSAL_KEEP=DIR keeps the rehearsal's runs: each paper sweep's `orch archive` goes to DIR/<sweep> (or to the
path with {sweep} filled in), before the test alters its store; what it asserts is unchanged (docs/paper.md, "The
rehearsal"). ORCH_REHEARSAL_DIR=DIR runs it in DIR instead of a temporary folder, so that an interrupted rehearsal
resumes: each `orch sweep --wait` submits only the cells not finished there (a failed cell stays failed, and fails
the test, until retried with `orch sweep FILE --profile rehearsal --retry-failed --wait` in DIR); the metric the test
deletes at its end is put back."""

from __future__ import annotations

import html
import os
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from analysis.paper import ITEMS, paper_sweeps
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep

REPO = Path(__file__).resolve().parents[2]



def orch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=1800, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
@pytest.mark.full  # the full tier (`bash scripts/test.sh --full`; its cost: tests/README.md)
def test_every_paper_sweep_rehearses_into_the_papers_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("ORCH_REHEARSAL_DIR"):  # a rehearsal that resumes (the module docstring)
        tmp_path = Path(os.environ["ORCH_REHEARSAL_DIR"]).resolve()
        tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path / "cache"))  # the warm starts, once per task
    for name in ("ORCH_STORE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)

    def run(sweep: str) -> tuple[str, subprocess.CompletedProcess]:
        return sweep, orch("sweep", str(REPO / "sweeps" / f"{sweep}.yaml"), "--profile", "rehearsal", "--cluster",
                           "local", "--set", "cluster.local_max_parallel=1", "--wait", cwd=tmp_path)

    # Two sweeps at a time, one cell each, the largest first (each worker takes the next sweep when its own ends):
    # both cores stay busy to the end, where sweep after sweep at two cells each left a core idle under every
    # sweep's odd last cell.
    sweeps = sorted(paper_sweeps(), key=lambda name: -len(build_plan(load_sweep(
        REPO / "sweeps" / f"{name}.yaml", profile="rehearsal")).cells))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, sweeps))
    assert sorted(sweep for sweep, _ in results) == sorted(paper_sweeps())
    for sweep, ran in results:
        assert ran.returncode == 0, f"{sweep}: {ran.stdout[-1500:]}{ran.stderr[-1500:]}"
        assert ran.stdout.strip().splitlines()[-1].startswith(f"sweep {sweep}: finished "), ran.stdout[-800:]
        assert "failed" not in ran.stdout.strip().splitlines()[-1], ran.stdout[-800:]

    keep = os.environ.get("ORCH_REHEARSAL_KEEP")
    if keep:  # keep the runs: one `orch archive` per paper sweep, written before anything below changes the store
        for sweep in paper_sweeps():  # ORCH_REHEARSAL_KEEP=DIR -> DIR/<sweep>; a path with {sweep} is filled in
            out = Path(keep.format(sweep=sweep) if "{sweep}" in keep else Path(keep) / sweep).resolve()
            out.parent.mkdir(parents=True, exist_ok=True)
            kept = orch("archive", sweep, "--out", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                        cwd=tmp_path)
            assert kept.returncode == 0, f"{sweep}: {kept.stdout[-1500:]}{kept.stderr[-1500:]}"

    report = orch("report", "--paper", "--strict", "--out", "paper.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "gap:" not in report.stderr
    page = (tmp_path / "paper.html").read_text()
    assert "has run yet" not in page  # every map item has finished cells
    assert "published" in page and "measured" in page and "REHEARSAL" in page and "GENERATED DATA" in page
    # ... and every item's section holds at least one measured value beside its published one (the predictor's too:
    # the rehearsal profile's Sokoban warm start leaves reward variance in its first batches)
    sections = {section.split("</h2>", 1)[0]: section for section in page.split("<h2>")[1:]}
    for item in ITEMS:
        [section] = [text for title, text in sections.items()
                     if title.startswith(html.escape(f"The paper, {item.ref}: {item.title}"))]
        assert "measures this item yet" not in section, item.key
        measured = re.search(r"of (\d+) published values measured", section)
        assert measured and int(measured.group(1)) >= 1, f"{item.ref} ({item.key}): {section[:800]}"

    # every measured value finite, every section at its declared coverage, every path of the judge exercised
    # (analysis.reports.paper_report.rehearsal_problems, tested fast in tests/analysis/stats/test_judge_calibration.py)
    from analysis.reports.paper_report import rehearsal_problems
    from analysis.reports.report import build_paper_report

    built = build_paper_report(f"sqlite:///{tmp_path / 'mlflow.db'}", n_boot=200)
    assert rehearsal_problems(built.comparisons, list(ITEMS)) == []

    with sqlite3.connect(tmp_path / "mlflow.db") as db:  # one cell of Table 6 loses its MI estimate
        (run,) = db.execute("SELECT r.run_uuid FROM runs r JOIN experiments e ON r.experiment_id = e.experiment_id "
                            "JOIN params p ON p.run_uuid = r.run_uuid WHERE e.name = 'table6' AND "
                            "p.key = 'backend' LIMIT 1").fetchone()
        deleted = {table: db.execute(f"SELECT * FROM {table} WHERE run_uuid = ? AND key = 'collapse/trajectory/mi_est'",
                                  (run,)).fetchall() for table in ("metrics", "latest_metrics")}
        for table in deleted:
            db.execute(f"DELETE FROM {table} WHERE run_uuid = ? AND key = 'collapse/trajectory/mi_est'", (run,))
    try:
        broken = orch("report", "--paper", "--strict", "--out", "paper.html", cwd=tmp_path)
        assert broken.returncode == 1, broken.stderr[-2000:]
        gaps = [line for line in broken.stderr.splitlines() if line.startswith("gap:")]
        assert gaps == [f"gap: Table 6 (table6): run {run} (table6) has no finite value of collapse/trajectory/mi_est"]
    finally:  # the store as it was (a resumed rehearsal reads it again)
        with sqlite3.connect(tmp_path / "mlflow.db") as db:
            for table, rows in deleted.items():
                if rows:
                    db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
