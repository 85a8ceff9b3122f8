"""`orch report`: the built report, its self-contained HTML, and a render in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import analysis.reports.report as report_module
from analysis.reports.report import build_report, export_figures, kaleido_available, render_html, write_report
from orchlib.errors import OrchError

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None)


def test_report_sections_and_missing_cells(demo_report):
    titles = [section.title for section in demo_report.sections]
    assert titles == [
        "The answers: did filtering help, did MI collapse, what did the predictor say?",
        "Sweep overview",
        "Does the paper's story hold here? Findings over seeds",  # 2 seeds per cell, filter off and on
        "Cells",
        "The paper's tables",
        "Training curves",
        "Diagnostics vs task performance",
        "Early warning: did MI fall before success?",
        "Will filtering help? The Std(RV)/Mean(RV) predictor",
    ]
    assert any("seed=2" in note and "failed" in note for note in demo_report.notes)
    assert any("scheduled, not finished" in note for note in demo_report.notes)
    assert len(demo_report.notes) == 2
    assert len(demo_report.figures()) >= 10  # curves, two scatters, predictor, RV histograms


def test_html_is_self_contained_and_carries_the_tables(demo_report, tmp_path):
    from plotly.offline import get_plotlyjs

    out = write_report(demo_report, tmp_path / "report.html")[0]
    text = out.read_text(encoding="utf-8")
    assert get_plotlyjs()[:2000] in text  # plotly.js inlined once
    assert text.count(get_plotlyjs()[:2000]) == 1
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=", text)
    assert "Table 4" in text and "21.0 ± 1.4 (+10.0)" in text  # ppo / sokoban, seeds 20 and 22, filter +10
    assert "Table 8" in text and "likely helps" in text
    assert "Missing or incomplete" in text and "not finished" in text
    figures = int(re.search(r'id="figure-count">(\d+)<', text).group(1))
    assert figures == len(demo_report.figures())


def test_a_sweep_that_only_has_one_kind_of_run_still_reports(demo_store):
    from analysis.reports.report import _paper_tables
    from analysis.stats.summary import summarize
    from analysis.stores.mlflow_store import RunQuery, load_runs

    data = load_runs(RunQuery(sweep="demo", filter_string="params.filter.strategy = 'none'"), demo_store.uri)
    summary = summarize(data)
    notes: list[str] = []
    section, _ = _paper_tables(summary, summary[["run_id"]], notes)
    assert any("need runs both without and with the filter" in block for block in section.blocks)


def test_unknown_sweep_and_static_export_errors(demo_store, demo_report, tmp_path, monkeypatch):
    with pytest.raises(OrchError, match="unknown sweep 'absent'"):
        build_report("absent", demo_store.uri)
    with pytest.raises(OrchError, match="unknown --format 'svg'"):
        write_report(demo_report, tmp_path / "r.html", "svg")
    monkeypatch.setattr(report_module, "kaleido_available", lambda: False)  # the dev install has it (pyproject.toml)
    with pytest.raises(OrchError, match="needs the kaleido package"):
        export_figures(demo_report, tmp_path / "r.html", "png")


def test_static_export_writes_every_figure(demo_report, tmp_path):
    """kaleido (a dev dependency) drives the Debian Chromium that scripts/test.sh installs: in CI this runs."""
    assert kaleido_available() and CHROMIUM is not None, "pip install -e '.[dev]' and Debian chromium (scripts/test.sh)"
    written = write_report(demo_report, tmp_path / "report.html", "png")
    assert len(written) == 1 + len(demo_report.figures())
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in written[1:])


def render_in_chromium(path) -> tuple[str, list[str]]:
    """Load a page in headless Chromium: (the DOM after scripts ran, the console lines Chromium logged)."""
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=30000", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, [line for line in result.stderr.splitlines() if "CONSOLE" in line]


def script_errors(dom: str, console: list[str]) -> list[str]:
    banner = re.search(r'<div id="orch-errors"[^>]*>(.*?)</div>', dom, re.S)
    return [line for line in console if "Uncaught" in line or "rror" in line] + (
        [banner.group(1)] if banner is None or banner.group(1) else []
    )


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian package `chromium`)")


@needs_chromium
def test_report_renders_in_headless_chromium_without_script_errors(demo_report, tmp_path):
    out = tmp_path / "report.html"
    out.write_text(render_html(demo_report), encoding="utf-8")
    dom, console = render_in_chromium(out)
    assert script_errors(dom, console) == []
    assert dom.count('class="plot-container plotly"') == len(demo_report.figures()) > 0


@needs_chromium
def test_the_render_check_catches_a_script_error(demo_report, tmp_path):
    out = tmp_path / "broken.html"
    out.write_text(render_html(demo_report).replace("</body>", "<script>notAFunction();</script></body>"), encoding="utf-8")
    dom, console = render_in_chromium(out)
    errors = script_errors(dom, console)
    assert errors and any("notAFunction" in error for error in errors)
