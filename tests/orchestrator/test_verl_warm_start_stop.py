"""Issue 45: a stop is a stop in the veRL backend's warm start, on `orch train backend=verl` and on a veRL sweep cell.

The warm start runs in the job's process before veRL (and Ray) start, so neither part of the test starts Ray: each
stop lands while the warm start trains. The torch backend's twin is
`tests/recipes/test_train_cli.py::test_a_stop_in_the_warm_start_ends_within_seconds_and_the_next_run_resumes_its_epochs`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.engine import cancel, submit_plan, wait
from orchestrator.executors.base import process_alive
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchestrator.store import Store
from recipes.runtime.checkpoint import REQUEUE_EXIT_CODE
from tests.orchestrator.conftest import MICRO
from tests.stops import signal_at_line

pytestmark = pytest.mark.slow
# A warm start of a few seconds an epoch on the micro model, evaluated after every epoch (one log line each)
WARM_START = {"model.warm_start.enabled": True, "model.warm_start.demos": 256, "model.warm_start.epochs": 6,
              "model.warm_start.eval_episodes": 2, "model.warm_start.batch_size": 2,
              "model.warm_start.max_response_tokens": 16, "model.warm_start.eval_every": 1}
SETTINGS = {**MICRO, **WARM_START, "task": "countdown", "algorithm": "grpo", "filter": "none",
            "trainer.total_steps": 1, "trainer.val_every": 0}
STOP_WITHIN_S = 10  # the bound; measured: ~1-3 s (docs/reliability.md, "Where a stop is read")


def _epochs_kept(cache: Path) -> int:
    import torch

    (kept,) = cache.glob("warm-start/*.partial/epoch.pt")
    return int(torch.load(kept, map_location="cpu", weights_only=False)["epoch"])


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_sigterm_in_the_verl_warm_start_ends_train_and_the_sweep_job_and_their_epochs_resume(
        workdir: Path, tracking: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = workdir / "own-cache"  # this test's own warm start, never a cached one
    monkeypatch.setenv("ORCH_CACHE_DIR", str(cache))  # for `orch train`, and the sweep's jobs inherit it
    env = os.environ.copy()

    # 1. `orch train backend=verl`: SIGTERM once epoch 1 is evaluated -> exit 75 within seconds, epoch 1 kept
    command = [sys.executable, "-m", "orchestrator.cli", "train", "backend=verl",
               *(f"{key}={value}" for key, value in SETTINGS.items()), f"mlflow.tracking_uri={tracking}",
               f"trainer.checkpoint_dir={workdir / 'ck'}"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    signalled = signal_at_line(process, "warm start countdown epoch 1:")
    rest = process.stderr.read()
    assert process.wait(timeout=120) == REQUEUE_EXIT_CODE, rest[-2000:]
    took = time.monotonic() - signalled
    assert took < STOP_WITHIN_S, f"the stop took {took:.1f} s"
    assert "received SIGTERM" in rest and "Traceback" not in rest and "epoch 2:" not in rest, rest[-2000:]
    assert _epochs_kept(cache) == 1

    # 2. a veRL sweep cell on the local executor: its job resumes the warm start after epoch 1; SIGTERM to the job
    # while epoch 2 trains ends it within seconds as a requeue (epoch 2 kept when it finished before the signal)
    spec = {"name": "vws", "backend": "verl", "base": SETTINGS, "seeds": [0],
            "resources": {"default": {"cpus_per_task": 1, "time_min": 30}},
            "cluster": {"signal_delay_s": 30, "max_requeues": 1}}
    path = workdir / "vws.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    store = Store.open()
    try:
        assert submit_plan(build_plan(load_sweep(path)), store, "local", tracking_uri=tracking).submitted == 1
        (cell,) = store.cell_rows(store.require_sweep("vws").id)
        logs = workdir / ".orch" / "sweeps" / "vws" / "jobs"

        def said(text: str) -> bool:
            return any(text in log.read_text(errors="replace") for log in logs.glob("*_log.err"))

        _until(lambda: said("warm start countdown: resumes after epoch 1"), 300, "the job did not resume epoch 1")
        _until(lambda: said("warm start countdown epoch 2:") or store.cell_rows(cell.sweep_id)[0].state not in
               ("queued", "running"), 300, "the job did not finish epoch 2")
        attempt = store.attempts(cell.id)[-1]
        signalled = time.monotonic()
        os.kill(attempt.pid, signal.SIGTERM)
        _until(lambda: store.attempts(cell.id)[0].state != "running", 60, "the job did not report its end")
        _until(lambda: not process_alive(attempt.pid, None), 60, "the job did not exit")
        took = time.monotonic() - signalled
        first = store.attempts(cell.id)[0]
        assert first.state == "requeued" and "epochs are kept" in first.reason, (first.state, first.reason)
        assert took < STOP_WITHIN_S, f"the job took {took:.1f} s to stop"
        assert _epochs_kept(cache) >= 2
    finally:
        cancel(store, "vws")  # the local controller restarts a requeued job: end that one too
        wait(store, "vws", poll_s=0.5, timeout_s=120)
    text = "".join(log.read_text(errors="replace") for log in logs.glob("*_log.err"))
    assert "Traceback" not in text, text[-2000:]


def test_sigterm_while_verls_workers_start_ends_train_within_seconds_and_leaves_no_process(
        workdir: Path, tracking: str) -> None:
    """Issue 45 item 2: before veRL's loop begins (Ray's workers, the models and the rollout engine loading: 89 s on
    this CPU, minutes on a GPU node) nothing of the attempt is there to keep, so a stop kills the TaskRunner and
    tears its Ray cluster down at once instead of waiting for the loop's first poll."""
    settings = {**SETTINGS, "model.warm_start.enabled": False}
    command = [sys.executable, "-m", "orchestrator.cli", "train", "backend=verl",
               *(f"{key}={value}" for key, value in settings.items()), f"mlflow.tracking_uri={tracking}",
               f"trainer.checkpoint_dir={workdir / 'ck'}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    signalled = signal_at_line(process, "(OrchTaskRunner", timeout_s=300)  # Ray up, workers building (V1: ...V1)
    out, rest = process.communicate(timeout=120)
    took = time.monotonic() - signalled
    assert process.returncode == REQUEUE_EXIT_CODE, rest[-2000:]
    assert took < STOP_WITHIN_S, f"the stop took {took:.1f} s"
    assert "received SIGTERM" in rest and "Traceback" not in rest, rest[-2000:]
    assert "stop requested while veRL's workers started (nothing to keep); starts afresh" in out, out
    assert not (workdir / "ck" / "verl").exists() or not list((workdir / "ck" / "verl").glob("global_step_*"))
    left = [stat.parent.name for stat in Path("/proc").glob("[0-9]*/stat")
            if _session_of(stat) == process.pid]
    assert not left, f"processes of the run still alive: {left}"


def _session_of(stat: Path) -> int | None:
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[3]) if fields[0] != "Z" else None
