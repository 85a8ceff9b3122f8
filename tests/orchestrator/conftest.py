"""Fixtures of the sweep-engine tests: an isolated working directory, the test-only backend, real SLURM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TEST_BACKEND_DIR = Path(__file__).parent / "testbackend"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def conf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One `$ORCH_CACHE_DIR` for the session (composed conf/ subtrees are reused across tests)."""
    return tmp_path_factory.mktemp("orch-cache")


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An initialised MLflow SQLite database, copied per test (creating one costs seconds)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conf_cache: Path) -> Path:
    """Run in an empty directory with the store and MLflow defaults there; jobs see the test backend."""
    monkeypatch.chdir(tmp_path)
    for name in ("ORCH_STORE", "MLFLOW_TRACKING_URI", "ORCH_TEST_FAIL_SEED", "ORCH_TEST_FAIL_FLAG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORCH_CACHE_DIR", str(conf_cache))
    monkeypatch.setenv("ORCH_HEARTBEAT_S", "1")
    monkeypatch.setenv("ORCH_TEST_STEP_S", "0.05")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TEST_BACKEND_DIR), str(REPO)]))
    return tmp_path


@pytest.fixture
def tracking(workdir: Path, mlflow_template: Path) -> str:
    """`sqlite:///<workdir>/mlflow.db`, already initialised."""
    shutil.copy(mlflow_template, workdir / "mlflow.db")
    return f"sqlite:///{workdir / 'mlflow.db'}"


@pytest.fixture
def test_backend() -> str:
    """Register the TEST-ONLY `orch-test` backend in this process (jobs get it via sitecustomize)."""
    if str(TEST_BACKEND_DIR) not in sys.path:
        sys.path.insert(0, str(TEST_BACKEND_DIR))
    import orch_test_backend

    return orch_test_backend.NAME


def slurm_running() -> bool:
    """Whether a SLURM controller answers on this machine."""
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture
def slurm() -> None:
    """Skip unless a real SLURM answers (CI starts one with scripts/setup_slurm.sh)."""
    if not slurm_running():
        pytest.skip("SLURM is not running here (start it with: bash scripts/setup_slurm.sh)")


@pytest.fixture
def sweep_file(workdir: Path):
    """`sweep_file(text, name="sweep.yaml")` writes a (dedented) sweep file into the working directory."""

    def write(text: str, name: str = "sweep.yaml") -> Path:
        path = workdir / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return write


MICRO = {  # sweep settings of the smallest Qwen2 that exercises every code path, no warm start (as the trainer's tests)
    "trainer": "test",
    "model.preset.hidden_size": 32,
    "model.preset.num_hidden_layers": 1,
    "model.preset.num_attention_heads": 2,
    "model.preset.num_key_value_heads": 1,
    "model.preset.intermediate_size": 64,
    "model.warm_start.enabled": False,
}
