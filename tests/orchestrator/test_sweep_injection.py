"""Nothing a sweep file says reaches a job script's shell unquoted: option names and values that would add lines to
the SLURM script are refused at validation (exit 2, `file:line`, nothing written), and `cluster.python` is split
into words and each word quoted. Tried on the real SLURM submit path (skipped where SLURM is not running)."""

from __future__ import annotations

import shlex
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
    ({"python": "python3; touch PWNED"}, "cluster.python: 'python3;' is not an absolute path or a program name"),
    ({"python": "python3 && touch PWNED"}, "cluster.python: '&&' in"),
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


def test_python_command_with_shell_syntax_is_refused_and_plain_words_are_quoted(workdir: Path, tracking: str,
                                                                                test_backend: str) -> None:
    """`cluster.python` must be an absolute path or a program name, then plain words: shell syntax is refused at
    validation (exit 2, nothing written, nothing run), and an allowed command is still quoted word by word."""
    marker = workdir / "PWNED"
    python = f"{sys.executable} $(touch {marker}) `touch {marker}`; touch {marker}"
    path = write_sweep(workdir, test_backend, {"python": python, "signal_delay_s": 30})
    before = sorted(item.name for item in workdir.iterdir())
    result = CliRunner().invoke(app, ["sweep", str(path), "--cluster", "slurm"])
    assert result.exit_code == 2 and "cluster.python" in result.stderr and "not a plain word" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert sorted(item.name for item in workdir.iterdir()) == before and not marker.exists()

    plain = f"{sys.executable} -X utf8"
    assert ClusterSettings(python=plain).python_command("unused") == shlex.join([sys.executable, "-X", "utf8"])
    path = write_sweep(workdir, test_backend, {"python": plain, "signal_delay_s": 30})
    from orchestrator.engine import submit_plan, wait
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep
    from orchestrator.store import Store

    store = Store.open(create=True)
    report = submit_plan(build_plan(load_sweep(path)), store, "slurm", tracking_uri=tracking)
    assert report.submitted == 1
    script = next((workdir / ".orch").rglob("*_submission.sh")).read_text()
    assert shlex.join([sys.executable, "-X", "utf8"]) in script
    assert wait(store, "inject", poll_s=0.5, timeout_s=300) == {"finished": 1}
