"""Issue 60 item 5, tried as a new user would: `orch runs --archive`, a missing tracking database that says where
one may be, `orch report --archive DIR` naming its sweep from archive.json and saying in the terminal what it read,
shipped sweeps by name from any folder, the dry-run table at 80 columns, a missing model folder printed absolute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = REPO / "docs" / "results" / "repro_long" / "session22"


def _orch(argv: list[str], **env: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, argv, env=env or None)
    return result.exit_code, result.stdout, result.stderr


def test_runs_reads_an_archive(tmp_path: Path) -> None:
    out = tmp_path / "runs.csv"
    code, _, err = _orch(["runs", "--archive", str(ARCHIVE), "--metrics", "val/success_rate", "--format", "csv",
                          "--out", str(out)])
    assert code == 0 and not err, err
    frame = pd.read_csv(out)
    assert len(frame) >= 19 and "val/success_rate" in frame.columns and set(frame["experiment"]) == {"repro_long"}
    code, _, err = _orch(["runs", "--archive", str(ARCHIVE), "--tracking-uri", "sqlite:///x.db"])
    assert code == 2 and err.count("\n") == 1 and "--archive reads archive folders: not with --tracking-uri" in err


def test_runs_without_a_database_says_where_one_may_be(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, out, err = _orch(["runs"])
    assert code == 2 and not out and err.count("\n") == 1, err
    assert "no MLflow database there" in err and "pass --tracking-uri URI" in err and "the sweep's folder" in err
    assert "--archive DIR" in err and not (tmp_path / "mlflow.db").exists()


def test_report_names_the_sweep_of_its_archives(tmp_path: Path) -> None:
    """Without a sweep name, `orch report --archive` takes the one archive.json names; archives of two sweeps are
    refused in one line naming both, before anything is written."""
    from analysis.cli import _archived_sweep

    assert _archived_sweep([ARCHIVE]) == "repro_long"
    other = tmp_path / "other"
    shutil.copytree(ARCHIVE, other)
    meta = json.loads((other / "archive.json").read_text())
    (other / "archive.json").write_text(json.dumps({**meta, "sweep": "demo"}))
    code, out, err = _orch(["report", "--archive", str(ARCHIVE), "--archive", str(other), "--out",
                            str(tmp_path / "r.html")])
    assert code == 2 and err.count("\n") == 1 and "archives of sweeps demo, repro_long; give the sweep name" in err
    assert not (tmp_path / "r.html").exists()


def test_the_reports_terminal_lines_say_what_was_read() -> None:
    from analysis.reports.report import held_line

    summary = pd.DataFrame({"status": ["FINISHED", "FINISHED", "FAILED"]})
    assert held_line("s", summary, None, [ARCHIVE]) == f"s: 3 cells read from 1 archive ({ARCHIVE}): 2 finished, 1 failed"
    store = pd.DataFrame({"state": ["finished", "finished", "failed", "pending"]})
    assert held_line("s", summary, store, (), "sqlite:///m.db").endswith(
        "read from the tracking store sqlite:///m.db: 2 finished, 1 failed; the orch store knows 4 cells: "
        "2 finished, 1 failed, 1 pending")


def test_shipped_sweeps_are_found_by_name_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.spec import SHIPPED_SWEEPS, sweep_file
    from orchlib.errors import OrchError

    monkeypatch.chdir(tmp_path)
    assert sweep_file("demo") == sweep_file("demo.yaml") == sweep_file("sweeps/demo.yaml") == SHIPPED_SWEEPS / "demo.yaml"
    (tmp_path / "demo.yaml").write_text("name: mine\n")
    assert sweep_file("demo.yaml") == Path("demo.yaml")  # a file here wins
    with pytest.raises(OrchError, match=r"sweep 'dmeo': no such file in .*, nor a sweep orch ships; shipped .*demo.*"
                                        r"; did you mean 'demo'\?$"):
        sweep_file("dmeo")
    code, out, _ = _orch(["sweep", "demo", "--dry-run"])
    assert code == 0 and f"sweep demo ({SHIPPED_SWEEPS / 'demo.yaml'})" in out, out


def test_the_dry_run_table_fits_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """table4's 8 varied keys were cut to `a…`, `t…` at 80 columns: a too-wide table becomes a line per cell with
    its settings as key=value, wrapped, nothing cut."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = _orch(["sweep", "table4", "--dry-run", "--limit", "4"], COLUMNS="80")
    assert code == 0, out
    table = out.split("\n... ")[0].splitlines()[1:]
    assert all(len(line) <= 80 for line in table) and "…" not in "".join(table), out
    assert "model.path=models/Qwen2.5-3B" in out and "algorithm=ppo" in out, out
    code, out, _ = _orch(["sweep", "demo", "--dry-run"], COLUMNS="80")
    assert "#  cell          filter  res" in out  # a narrow table stays a table


def test_a_missing_model_folder_is_printed_absolute_with_where_checkpoints_come_from(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from recipes.runtime.hf_folder import hf_folder_problems

    monkeypatch.chdir(tmp_path)
    (line,) = hf_folder_problems("models/Qwen2.5-3B")
    assert line.startswith(f"models/Qwen2.5-3B ({tmp_path / 'models/Qwen2.5-3B'}): no such folder"), line
    assert f"hf download Qwen/Qwen2.5-3B --local-dir {tmp_path / 'models/Qwen2.5-3B'}" in line
