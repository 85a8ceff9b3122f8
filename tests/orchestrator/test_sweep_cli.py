"""The sweep commands from the command line: lazy imports, dry runs that write nothing, errors on stderr with
exit code 2, and a full sweep/status/logs/cancel/resume round with the in-process `debug` executor (TEST-ONLY
backend)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "mlflow", "verl", "submitit", "sqlalchemy", "hydra")


@pytest.mark.parametrize("argv", [["--help"], ["sweep", "--help"], ["status", "--help"], ["mlflow", "serve", "--help"]])
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from orchestrator.cli import app\n"
        "try:\n"
        f"    app({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_dry_run_prints_cells_and_writes_nothing(workdir: Path) -> None:
    result = invoke("sweep", str(REPO / "sweeps" / "table4.yaml"), "--dry-run", "--limit", "3")
    assert result.exit_code == 0, result.output
    # RAGEN-2 (arXiv 2604.06268) Table 4: 10 rows (with Qwen2.5-14B) x 4 tasks + 2 VL rows x 2 grid tasks; 2 filters,
    # 3 seeds; one sbatch call per resource group (3B, 0.5B/1.5B, VL-3B, 7B, 14B: sweeps/table4.yaml's resources)
    cells = (10 * 4 + 2 * 2) * 2 * 3
    assert f"{cells} cells" in result.output and "estimated GPU-hours" in result.output
    assert "5 sbatch call(s)" in result.output and f"{cells - 3} more cells" in result.output
    assert not (workdir / ".orch").exists() and not (workdir / "mlflow.db").exists()


def test_cells_their_backend_cannot_run_are_refused_before_anything_is_written(workdir: Path, sweep_file) -> None:
    path = sweep_file("""
        name: wide
        backend: torch
        base: {trainer: test}
        resources: {default: {nodes: 2, gpus_per_node: 4}}
    """)
    result = invoke("sweep", str(path))
    assert result.exit_code == 2
    assert "the torch backend runs one process on one device" in result.output and "backend: verl" in result.output
    assert not (workdir / ".orch").exists()
    assert invoke("sweep", str(REPO / "sweeps" / "table5.yaml"), "--dry-run").exit_code == 0  # verl cells plan


def test_bad_file_and_unknown_names_exit_2(workdir: Path, sweep_file) -> None:
    path = sweep_file("name: x\ngrid:\n  task: [sokobn]\n")
    result = invoke("sweep", str(path), "--dry-run")
    assert result.exit_code == 2
    assert f"orch: error: {path}:3: grid.task[0]: unknown task option 'sokobn'; valid choices:" in result.output
    result = invoke("sweep", str(path), "--cluster", "cloud")
    assert result.exit_code == 2 and "unknown cluster 'cloud'; valid choices: debug, local, slurm" in result.output
    assert invoke("status", "nope").exit_code == 2
    assert not (workdir / ".orch").exists()


def test_sweep_status_logs_cancel_resume_round(workdir: Path, sweep_file, test_backend: str, tracking: str) -> None:
    path = sweep_file(f"""
        name: cli
        backend: {test_backend}
        base: {{trainer: test, trainer.total_steps: 2}}
        grid:
          task: [sokoban, countdown]
    """)
    result = invoke("sweep", str(path), "--cluster", "debug", "--tracking-uri", tracking)
    assert result.exit_code == 0, result.output
    assert "submitted 2 with --cluster debug" in result.output

    result = invoke("status", "cli", "--json")
    status = json.loads(result.output)
    assert status["counts"] == {"finished": 2}
    assert {cell["varied"]["task"] for cell in status["cells"]} == {"sokoban", "countdown"}
    digest = status["cells"][0]["digest"]

    result = invoke("status", "cli")
    assert result.exit_code == 0 and "finished 2" in result.output
    assert "cli (debug): finished 2" in invoke("status").output

    result = invoke("logs", "cli", digest[:6])
    assert result.exit_code == 2 and "ran with --cluster debug: its output went to the terminal" in result.output
    result = invoke("logs", "cli", "zzz")
    assert result.exit_code == 2 and "matches no cell" in result.output

    assert "0 cell(s) cancelled" in invoke("cancel", "cli").output
    result = invoke("resume", "cli")
    assert result.exit_code == 0 and "submitted 0" in result.output
    again = invoke("sweep", str(path), "--cluster", "debug", "--wait")
    assert "submitted 0" in again.output and "2 finished" in again.output
    assert again.output.endswith("sweep cli: finished 2\n")  # not a terminal: whole lines, the last one ended


def test_cells_finished_in_an_archive_are_not_submitted_again(workdir: Path, sweep_file, test_backend: str,
                                                               tracking: str, mlflow_template: Path) -> None:
    import shutil

    text = f"""
        name: kept
        backend: {test_backend}
        base: {{trainer: test, trainer.total_steps: 2}}
        grid:
          task: [TASKS]
    """
    path = sweep_file(text.replace("TASKS", "sokoban, countdown"))
    assert invoke("sweep", str(path), "--cluster", "debug", "--tracking-uri", tracking).exit_code == 0
    archive = workdir / "archive"
    result = invoke("archive", "kept", "--out", str(archive), "--tracking-uri", tracking, "--no-rollouts")
    assert result.exit_code == 0 and "3 runs" in result.output, result.output  # the sweep's parent run and 2 cells

    later = workdir / "later"  # another machine: a new store and tracking store, the archive committed
    later.mkdir()
    shutil.copy(mlflow_template, later / "mlflow.db")
    wider = sweep_file(text.replace("TASKS", "sokoban, countdown, frozenlake"), name="later/sweep.yaml")
    store = f"sqlite:///{later / 'orch.db'}"
    uri = f"sqlite:///{later / 'mlflow.db'}"
    result = invoke("sweep", str(wider), "--done-in", str(archive), "--dry-run", "--store", store)
    assert result.exit_code == 0 and "1 cells" in result.output, result.output
    assert f"2 cell(s) finished in {archive}: not submitted" in " ".join(result.output.split())  # rich wraps
    result = invoke("sweep", str(wider), "--cluster", "debug", "--done-in", str(archive), "--store", store,
                    "--tracking-uri", uri)
    assert result.exit_code == 0 and "submitted 1 with --cluster debug" in result.output, result.output
    status = json.loads(invoke("status", "kept", "--json", "--store", store).output)
    assert [cell["varied"] for cell in status["cells"]] == [{"task": "frozenlake"}]
    result = invoke("sweep", str(wider), "--done-in", str(workdir / "nope"), "--dry-run")
    assert result.exit_code == 2 and "no such archive folder" in result.output
