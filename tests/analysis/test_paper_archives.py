"""The paper report from committed files (issue 56 item 3): the full-tier rehearsal's runs, archived per paper sweep
in docs/results/<sweep>/rehearsal-2026-12-02b (tests/analysis/test_rehearsal.py run with ORCH_REHEARSAL_KEEP;
docs/paper.md, "The rehearsal"), render `orch report --paper` from a checkout alone, no tracking store: every item of
the paper map (RAGEN-2, arXiv 2604.06268) gets its section with published values beside measured ones, at least the
coverage the item declares, under the REHEARSAL and GENERATED DATA banners. The numbers mean nothing (a tiny model, 2
to 5 steps, one seed); what is tested is that the committed files are enough for the whole report.

This rehearsal passed (docs/paper.md, "The rehearsal"): no measured value NaN, every section at its declared
coverage, every path of the judge exercised (the early warning's ordering included). `KNOWN_GAPS` (the items whose
rows the archived rehearsal left NaN or below coverage) is therefore empty, so that any new gap fails here."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analysis.paper import ITEMS, paper_sweeps
from analysis.reports.paper_report import rehearsal_problems
from analysis.reports.report import build_paper_report, paper_archives
from analysis.stores.archive import check_archive
from orchestrator.cli import app

REPO = Path(__file__).resolve().parents[2]
NAME = "rehearsal-2026-12-02b"
KNOWN_GAPS: set[str] = set()  # the map items whose rows the rehearsal left NaN (none: the module docstring)
REHEARSAL = sorted((REPO / "docs" / "results").glob(f"*/{NAME}"))


def test_every_paper_sweep_has_a_committed_rehearsal_archive_marked_as_such() -> None:
    assert sorted(check_archive(folder)["sweep"] for folder in REHEARSAL) == sorted(paper_sweeps())
    for folder in REHEARSAL:  # the folder says what it is to whoever browses docs/results
        assert folder.parent.name == check_archive(folder)["sweep"], folder
        note = (folder / "README.md").read_text()
        assert note.startswith("# REHEARSAL, GENERATED DATA"), folder
    size = sum(path.stat().st_size for folder in REHEARSAL for path in folder.iterdir())
    assert size < 5e6, f"{size / 1e6:.1f} MB of rehearsal archives: keep them small"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, str]:
    """The documented command (docs/paper.md), in process, with --strict."""
    out = tmp_path_factory.mktemp("paper") / "paper.html"
    argv = ["report", "--paper", "--strict", *(arg for folder in REHEARSAL for arg in ("--archive", str(folder))),
            "--out", str(out)]
    result = CliRunner().invoke(app, argv)
    return result, out.read_text() if out.exists() else ""


def test_the_paper_report_renders_every_section_from_the_committed_rehearsal(rendered) -> None:
    result, page = rendered
    assert result.exit_code == 0, result.output[-3000:]
    assert "gap:" not in result.output, result.output[-2000:]
    assert "has run yet" not in page
    assert "REHEARSAL" in page and "GENERATED DATA" in page  # the banners, once for the report
    sections = {section.split("</h2>", 1)[0]: section for section in page.split("<h2>")[1:]}
    for item in ITEMS:
        [section] = [text for title, text in sections.items()
                     if title.startswith(html.escape(f"The paper, {item.ref}: {item.title}"))]
        assert "measures this item yet" not in section, item.key
        assert re.search(r"of \d+ published values measured", section), f"{item.ref} ({item.key}): {section[:800]}"


def test_the_committed_rehearsal_exercises_every_judge_path_and_has_only_its_known_gaps() -> None:
    """The rehearsal test's own check (`rehearsal_problems`: a NaN measured value, a section below its declared
    coverage, a path of the judge no row exercised) on the archives: no judge path unexercised, and NaN or coverage
    problems in exactly the known items."""
    built = build_paper_report(archives=paper_archives([str(folder) for folder in REHEARSAL]), n_boot=200)
    problems = rehearsal_problems(built.comparisons, list(ITEMS))
    assert not [line for line in problems if line.startswith("the judge's")], problems
    keys = {item.key for item in ITEMS for line in problems if line.startswith(f"{item.ref} ({item.key})")}
    assert keys == KNOWN_GAPS, problems
