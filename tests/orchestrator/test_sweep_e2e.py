"""End to end with the REAL torch trainer backend (recipes.torch_trainer.backend) and a micro model on CPU:
a sweep submitted to a real single-node SLURM completes with runs in MLflow and the right states in the store,
a second submission submits nothing, `--cluster local` gives the same results, and a job told to stop by SLURM's
time-limit signal checkpoints, requeues and resumes into the same MLflow run."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.engine import submit_plan, wait
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchestrator.store import Store
from recipes.runtime.checkpoint import latest_checkpoint
from tests.orchestrator.conftest import MICRO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("recipes.torch_trainer.backend") is None,
                       reason="the torch trainer backend (recipes/torch_trainer/backend.py) is not there yet"),
]

COMPARED = ("rollout/reward_mean", "rollout/kept_groups", "response_length/mean", "val/reward_mean")


def write(workdir: Path, name: str, steps: int, tasks: list[str], **base) -> Path:
    spec = {"name": name, "backend": "torch", "base": {**MICRO, "trainer.total_steps": steps, **base},
            "grid": {"task": tasks}, "seeds": [1], "cluster": {"signal_delay_s": 60}}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def submit(path: Path, executor: str, tracking: str):
    plan = build_plan(load_sweep(path))
    store = Store.open()
    return plan, store, submit_plan(plan, store, executor, tracking_uri=tracking)


def finished_runs(tracking: str, sweep: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(sweep)
    return {run.data.tags["cell"]: run for run in client.search_runs([experiment.experiment_id])
            if "cell" in run.data.tags}


def history(tracking: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((item.step, item.value) for item in MlflowClient(tracking).get_metric_history(run_id, key))


def test_torch_sweep_on_slurm_then_again_then_local(workdir: Path, tracking: str, slurm: None) -> None:
    path = write(workdir, "e2e", 2, ["sokoban", "frozenlake"])
    plan, store, report = submit(path, "slurm", tracking)
    assert report.submitted == 2
    assert wait(store, "e2e", poll_s=2, timeout_s=900) == {"finished": 2}
    slurm_runs = finished_runs(tracking, "e2e")
    assert set(slurm_runs) == {cell.digest for cell in plan.cells}
    for row in store.cell_rows(store.require_sweep("e2e").id):
        assert (row.steps_done, row.mlflow_run_id) == (2, slurm_runs[row.digest].info.run_id)
        assert slurm_runs[row.digest].info.status == "FINISHED"
        assert history(tracking, row.mlflow_run_id, "rollout/reward_mean")

    _, _, again = submit(path, "slurm", tracking)
    assert again.submitted == 0 and again.not_submitted == {"finished": 2}

    local_path = write(workdir, "e2e-local", 2, ["sokoban", "frozenlake"])
    local_plan, _, _ = submit(local_path, "local", tracking)
    assert [cell.digest for cell in local_plan.cells] == [cell.digest for cell in plan.cells]  # same identities
    assert wait(store, "e2e-local", poll_s=2, timeout_s=900) == {"finished": 2}
    local_runs = finished_runs(tracking, "e2e-local")
    for digest, run in slurm_runs.items():
        for key in COMPARED:
            slurm_values = history(tracking, run.info.run_id, key)
            local_values = history(tracking, local_runs[digest].info.run_id, key)
            assert [step for step, _ in slurm_values] == [step for step, _ in local_values], key
            assert all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
                       for (_, a), (_, b) in zip(slurm_values, local_values, strict=True)), (key, slurm_values,
                                                                                            local_values)


def test_torch_job_requeued_by_slurm_resumes_into_the_same_run(workdir: Path, tracking: str, slurm: None) -> None:
    steps = 40
    # No filter: a random micro model often has no reward variance, and the filter would end the run early.
    _, store, _ = submit(write(workdir, "e2e-requeue", steps, ["sokoban"], filter="none"), "slurm", tracking)
    sweep = store.require_sweep("e2e-requeue")
    (cell,) = store.cell_rows(sweep.id)
    checkpoints = Path(sweep.run_dir) / "checkpoints" / cell.digest
    deadline = time.monotonic() + 600
    while latest_checkpoint(checkpoints) is None:  # a few steps in, a checkpoint saved (not the writer's lease file)
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(1)
    (cell,) = store.cell_rows(sweep.id)
    subprocess.run(["scancel", "--signal=USR2", cell.job_id], check=True)  # what SLURM sends before the limit
    assert wait(store, "e2e-requeue", poll_s=2, timeout_s=1200) == {"finished": 1}
    (cell,) = store.cell_rows(sweep.id)
    assert cell.requeues >= 1 and cell.attempts >= 2 and cell.steps_done == steps
    attempts = store.attempts(cell.id)
    assert [attempt.state for attempt in attempts][0] == "requeued" and attempts[-1].state == "finished"
    runs = finished_runs(tracking, "e2e-requeue")
    assert list(runs) == [cell.digest] and runs[cell.digest].info.run_id == cell.mlflow_run_id
    logged_steps = [step for step, _ in history(tracking, cell.mlflow_run_id, "rollout/reward_mean")]
    assert logged_steps == sorted(set(logged_steps)) and logged_steps[-1] == steps  # resumed, not restarted
    assert runs[cell.digest].info.status == "FINISHED"
