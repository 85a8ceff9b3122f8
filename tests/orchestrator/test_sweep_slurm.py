"""The `slurm` executor on a real single-node SLURM (scripts/setup_slurm.sh), with the TEST-ONLY `orch-test`
backend: job arrays per resource group, requeue on SIGUSR2 and on `scontrol requeue` into the same MLflow run,
lost jobs, cancel. Skipped (with the reason) where SLURM is not running."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.engine import cancel, reconcile, submit_plan, wait
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchestrator.store import Store
from tests.orchestrator.gate import Gate

pytestmark = pytest.mark.usefixtures("slurm")


@pytest.fixture
def sweep(workdir: Path, test_backend: str):
    def make(name: str, seeds: list[int], steps: int, **extra) -> Path:
        spec = {
            "name": name,
            "backend": test_backend,
            "base": {"trainer": "test", "trainer.total_steps": steps},
            "seeds": seeds,
            "cluster": {"signal_delay_s": 30, "max_requeues": 3, "array_parallelism": 4},
            **extra,
        }
        path = workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    return make


def submit(path: Path, tracking: str):
    plan = build_plan(load_sweep(path))
    store = Store.open()
    return plan, store, submit_plan(plan, store, "slurm", tracking_uri=tracking)


def runs(tracking: str, sweep: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(sweep)
    return {run.data.tags["cell"]: run for run in client.search_runs([experiment.experiment_id])
            if "cell" in run.data.tags}


def metric(tracking: str, run_id: str, key: str) -> list[float]:
    from mlflow.tracking import MlflowClient

    return [item.value for item in MlflowClient(tracking).get_metric_history(run_id, key)]


def wait_for(predicate, timeout: float = 300.0, state=None) -> None:
    """Poll `predicate` until true; on timeout fail with `state()` (what was seen last), so a loaded run's failure
    says where it stopped."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s; last seen: {state() if state else '?'}"
        time.sleep(0.5)


def test_one_sbatch_per_resource_group_and_array_split(sweep, tracking: str) -> None:
    resources = {"default": {"time_min": 10}, "rules": [{"when": {"seed": [4, 5]}, "set": {"time_min": 20}}]}
    path = sweep("arrays", [1, 2, 3, 4, 5], 2, resources=resources)
    spec = yaml.safe_load(path.read_text())
    spec["cluster"]["max_array_size"] = 2
    path.write_text(yaml.safe_dump(spec))
    plan, store, report = submit(path, tracking)
    assert report.submitted == 5
    rows = store.cell_rows(store.require_sweep("arrays").id)
    arrays = {row.job_id.split("_")[0] for row in rows}
    # group time_min=10 has 3 cells -> arrays of 2 + 1; group time_min=20 has 2 cells -> 1 array: 3 sbatch calls
    assert len(arrays) == 3
    assert wait(store, "arrays", poll_s=1, timeout_s=400) == {"finished": 5}
    assert all(run.info.status == "FINISHED" for run in runs(tracking, "arrays").values())
    _, _, again = submit(path, tracking)
    assert again.submitted == 0 and again.not_submitted == {"finished": 5}


@pytest.mark.slow
def test_signal_and_scontrol_requeue_resume_into_the_same_run(sweep, tracking: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(Path("gate.json"), allowed=3).install(monkeypatch)  # both jobs hold after step 3
    _, store, _ = submit(sweep("requeue", [1, 2], 40), tracking)
    sweep_row = store.require_sweep("requeue")
    wait_for(lambda: [p.read_text() for p in Path(".orch/sweeps/requeue/checkpoints").glob("*/step.txt")]
             == ["3", "3"])  # a few steps in, checkpointed
    first, second = store.cell_rows(sweep_row.id)
    # SLURM's time-limit warning (what --signal=USR2@N sends), then an operator's requeue (SIGTERM, requeue).
    subprocess.run(["scancel", "--signal=USR2", first.job_id], check=True)
    subprocess.run(["scontrol", "requeue", second.job_id], check=True)
    wait_for(lambda: all(len(store.attempts(row.id)) >= 2 for row in (first, second)))  # both restarted
    gate.open()
    assert wait(store, "requeue", poll_s=1, timeout_s=600) == {"finished": 2}
    by_cell = runs(tracking, "requeue")
    assert len(by_cell) == 2
    for row in store.cell_rows(sweep_row.id):
        assert row.requeues >= 1 and row.attempts >= 2, row
        run = by_cell[row.digest]
        assert run.info.status == "FINISHED"
        assert max(metric(tracking, run.info.run_id, "test/resumed_from")) > 0  # resumed from its checkpoint
        assert sorted(metric(tracking, run.info.run_id, "test/step"))[-1] == 40


@pytest.mark.slow
def test_killed_job_is_lost_and_cancel_stops_jobs(sweep, tracking: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_TEST_STEP_S", "0.5")
    _, store, _ = submit(sweep("kill", [1, 2], 240), tracking)
    sweep_row = store.require_sweep("kill")
    wait_for(lambda: store.counts(sweep_row.id).get("running", 0) == 2)
    victim, other = store.cell_rows(sweep_row.id)
    os.kill(store.attempts(victim.id)[-1].pid, signal.SIGKILL)  # the job dies without a word (OOM killer)
    wait_for(lambda: reconcile(store, sweep_row) > 0 or store.counts(sweep_row.id).get("lost"), timeout=120)
    (lost,) = store.cell_rows(sweep_row.id, digests=[victim.digest])
    assert lost.state == "lost" and "ended without reporting" in lost.reason
    assert cancel(store, "kill") == 1
    assert wait(store, "kill", poll_s=1, timeout_s=180) == {"lost": 1, "cancelled": 1}
    (cancelled,) = store.cell_rows(sweep_row.id, digests=[other.digest])
    assert cancelled.state == "cancelled"


@pytest.mark.slow
def test_restarts_past_max_requeues_fail_the_cell_whoever_requeued_it(sweep, tracking: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`cluster.max_requeues: 1`: an operator's `scontrol requeue` (the job checkpoints and reports it) uses the one
    requeue; a second restart the job cannot report (killed, then requeued, as after a node failure) is one too
    many: the restarted job does not run and the cell ends failed with the reason.

    The first requeue lands the moment the cell shows running, before the trainer starts (the job waits at a start
    gate until the signal has reached it): loaded CI run B of issue 31 requeued a job 1 s after its launch, and a
    SIGTERM there went to submitit's handler, which only logs it, so the job was killed without its report."""
    monkeypatch.setenv("ORCH_TEST_STEP_S", "0.5")
    gate = Path("started.gate").resolve()
    monkeypatch.setenv("ORCH_TEST_START_GATE", str(gate))
    path = sweep("maxrq", [1], 240)
    spec = yaml.safe_load(path.read_text())
    spec["cluster"]["max_requeues"] = 1
    path.write_text(yaml.safe_dump(spec))
    _, store, _ = submit(path, tracking)
    sweep_row = store.require_sweep("maxrq")
    wait_for(lambda: store.counts(sweep_row.id).get("running") == 1)
    (cell,) = store.cell_rows(sweep_row.id)
    subprocess.run(["scontrol", "requeue", cell.job_id], check=True)
    log = Path(store.attempts(cell.id)[0].stderr_path)
    wait_for(lambda: log.exists() and ("signal SIGTERM" in log.read_text() or "received SIGTERM" in log.read_text()),
             state=lambda: log.read_text()[-500:] if log.exists() else "no log")
    gate.touch()  # the job, stopped at its start, goes on: it must have kept the stop request
    attempts = lambda: [(a.state, a.pid) for a in store.attempts(cell.id)]  # noqa: E731
    wait_for(lambda: [a.state for a in store.attempts(cell.id)] == ["requeued", "running"],
             state=lambda: (attempts(), subprocess.run(["squeue", "-h", "-j", cell.job_id, "-o", "%T %r"],
                                                       capture_output=True, text=True).stdout.strip()))
    os.kill(store.attempts(cell.id)[-1].pid, signal.SIGKILL)  # no end report from this attempt
    subprocess.run(["scontrol", "requeue", cell.job_id], check=True)
    wait_for(lambda: store.counts(sweep_row.id).get("failed") == 1)
    (row,) = store.cell_rows(sweep_row.id)
    assert row.requeues == 2 and "restarted 2 times (cluster.max_requeues=1)" in row.reason, row.reason
    assert [a.state for a in store.attempts(cell.id)] == ["requeued", "lost", "failed"]
    assert wait(store, "maxrq", poll_s=1, timeout_s=120) == {"failed": 1}
