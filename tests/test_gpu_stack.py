"""The GPU stack (issue 27 item 4), checked without a GPU: its pins resolve for Linux x86_64 as PyPI serves them, they
are the versions veRL's own `vllm` extra pairs, `setup_gpu.sh` refuses a node without an NVIDIA driver in one line,
and the veRL CPU smoke test passes under the stack's own torch 2.11.0 (PyPI's CUDA 13 build, which imports and runs on a
CPU), torchvision 0.26.0 and transformers 5.9.0."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "gpu"))
from cpu_stack import LOCK, pins  # noqa: E402 - a script's module, by path

from tests.setup_wait import wait_for_setup  # noqa: E402


def test_the_pins_are_what_verls_vllm_extra_declares() -> None:
    locked = pins(LOCK.read_text())
    requires = metadata.requires("verl") or []
    declared = {}
    for requirement in requires:
        match = re.match(r'^([A-Za-z0-9_.\-]+)==([^\s;]+); extra == "vllm"$', requirement)
        if match:
            declared[match[1].lower()] = match[2]
    assert declared == {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "vllm": "0.24.0",
                        "transformers": "5.9.0"}
    assert {name: locked.get(name) for name in declared} == declared
    assert locked["verl"] == metadata.version("verl")


def test_the_pins_resolve_for_linux_x86_64_without_a_gpu(tmp_path) -> None:
    """uv resolves the stack for the CUDA wheels' platform from PyPI's metadata (nothing downloaded, nothing
    installed): a pin conflict fails here, not on a lab's node. The resolution must reproduce the lock exactly."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv, "uv is a dev dependency (pyproject.toml)"
    out = tmp_path / "resolved.txt"
    result = subprocess.run(
        [uv, "pip", "compile", "pyproject.toml", "--extra", "gpu", "--extra", "postgres", "--constraint", str(LOCK),
         "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28", "--index-url",
         "https://pypi.org/simple", "--no-header", "--no-annotate", "--quiet", "-o", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "UV_HTTP_RETRIES": "5"})
    assert result.returncode == 0, result.stderr
    resolved, locked = pins(out.read_text()), pins(LOCK.read_text())
    assert resolved == locked, {k: (resolved.get(k), locked.get(k)) for k in resolved.keys() ^ locked.keys()}


def test_setup_gpu_refuses_a_node_without_an_nvidia_driver_in_one_line() -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this node has an NVIDIA driver")  # never on this project's CI
    result = subprocess.run(["bash", "scripts/setup_gpu.sh", "--check"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "setup_gpu.sh: no NVIDIA driver on this node (nvidia-smi not found): run it on a GPU node"]
    assert not (REPO / ".venv-gpu").exists()


def stack_overlay(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The GPU stack's torch, torchvision and transformers with torch's CUDA runtime wheels, in a folder to put first
    on PYTHONPATH (`scripts/gpu/cpu_stack.py`): the one `scripts/test.sh` installs in the background while the suite
    runs (waited for), else installed here. Returns the folder and name -> version installed."""
    if wait_for_setup("cpu-stack"):
        folder = Path(os.environ["ORCH_SETUP_DIR"]) / "cpu-stack"
    else:
        folder = tmp_path / "overlay"
        result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu" / "cpu_stack.py"), str(folder)],
                                capture_output=True, text=True, timeout=2400)
        assert result.returncode == 0, result.stderr[-2000:]
    return folder, json.loads((folder / "stack.json").read_text())


def test_the_gpu_smoke_script_rehearses_on_cpu_under_the_stacks_torch_and_transformers(tmp_path) -> None:
    """`scripts/gpu_smoke.py --cpu`: the GPU smoke run's plumbing (veRL's trainer, Ray, FSDP2, orch's agent loop,
    the filter and the MI proxies, orch's veRL patches, the summary) on this CPU with the tiny model, with the stack's
    torch 2.11.0 (CUDA build, no GPU used), torchvision 0.26.0 and transformers 5.9.0 first on the path of every
    process (Ray workers inherit it)."""
    locked = pins(LOCK.read_text())
    overlay, installed = stack_overlay(tmp_path)
    stack = ("torch", "torchvision", "transformers")
    assert {name: installed[name] for name in stack} == {name: locked[name] for name in stack}
    assert any(name.startswith("nvidia-") for name in installed) and "triton" in installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(overlay), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "scripts/gpu_smoke.py", "--cpu"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    stack = f"torch {locked['torch']}+cu130 (cuda available: no), transformers {locked['transformers']}"
    assert f"gpu_smoke: stack: {stack}, veRL {locked['verl']}" in out, out[:2000]
    assert "step time: " in out and "split (s per step): gen " in out and "update_actor" in out
    assert "peak memory: " in out and "filter ran: yes; MI proxies ran: yes" in out


def test_the_gpu_smoke_script_names_a_bad_model_folder(tmp_path) -> None:
    result = subprocess.run([sys.executable, "scripts/gpu_smoke.py", str(tmp_path / "nope")], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"gpu_smoke: error: {tmp_path / 'nope'}: no such folder; a Hugging Face checkpoint"), line
