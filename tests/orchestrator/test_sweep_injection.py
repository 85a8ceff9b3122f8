"""Nothing a sweep file says reaches a job script's shell unquoted: option names and values that would add lines to
the SLURM script are refused at validation (exit 2, `file:line`, nothing written), and `cluster.python` is split
into words and each word quoted. Tried on the real SLURM submit path (skipped where SLURM is not running)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.spec import ClusterSettings

pytestmark = pytest.mark.usefixtures("slurm")

INJECTIONS = [
    ({"sbatch": {"constraint\ntouch PWNED": True}}, "cluster.sbatch: 'constraint\\ntouch PWNED' is not an sbatch"),
    ({"sbatch": {"comment": "x\ntouch PWNED"}}, "cluster.sbatch: comment: newlines and control characters"),
    ({"sbatch": {"comment; touch PWNED": 1}}, "is not an sbatch option name"),
    ({"partition": "debug\ntouch PWNED"}, "cluster.partition: newlines and control characters"),
    ({"account": "a\rtouch PWNED"}, "cluster.account: newlines"),
    ({"qos": "q\x00"}, "cluster.qos: newlines"),
    ({"python": "python3\ntouch PWNED"}, "cluster.python: newlines"),
    ({"python": "python3 'unclosed"}, "cluster.python: cannot split"),
    ({"setup": ["module load x\ntouch PWNED"]}, "cluster.setup[0]: newlines"),
]


def write_sweep(workdir: Path, backend: str, cluster: dict) -> Path:
    spec = {"name": "inject", "backend": backend, "base": {"trainer": "test", "trainer.total_steps": 1},
            "cluster": cluster}
    path = workdir / "inject.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize(("cluster", "message"), INJECTIONS)
def test_injections_are_refused_before_anything_is_written(workdir: Path, test_backend: str, cluster: dict,
                                                           message: str) -> None:
    path = write_sweep(workdir, test_backend, cluster)
    result = CliRunner().invoke(app, ["sweep", str(path), "--cluster", "slurm"])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert "inject.yaml:" in result.stderr
    assert sorted(item.name for item in workdir.iterdir()) == ["inject.yaml"]


def test_python_command_words_are_quoted_in_the_job_script(workdir: Path, tracking: str, test_backend: str) -> None:
    marker = workdir / "PWNED"
    python = f"{sys.executable} $(touch {marker}) `touch {marker}`; touch {marker}"
    assert ClusterSettings(python=python).python_command("unused").count("'") >= 6
    path = write_sweep(workdir, test_backend, {"python": python, "signal_delay_s": 30})
    from orchestrator.engine import submit_plan, wait
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep
    from orchestrator.store import Store

    store = Store.open(create=True)
    report = submit_plan(build_plan(load_sweep(path)), store, "slurm", tracking_uri=tracking)
    assert report.submitted == 1
    script = next((workdir / ".orch").rglob("*_submission.sh")).read_text()
    assert "'$(touch" in script and "'`touch" in script
    counts = wait(store, "inject", poll_s=0.5, timeout_s=120)
    assert counts.get("failed") or counts.get("lost"), counts  # python got odd arguments: the job fails...
    assert not marker.exists()  # ...and nothing the value held ran
