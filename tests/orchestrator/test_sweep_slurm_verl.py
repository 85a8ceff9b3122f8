"""A `backend: verl` sweep on the real single-node SLURM: each cell's job starts veRL's V1 trainer (the default:
Ray, TransferQueue's controller and storage actors, FSDP2 workers, HF rollouts) with the micro model, and reports
into the cell's pre-created MLflow run."""

from __future__ import annotations

import importlib.util
import os
import site
from pathlib import Path

import pytest
import yaml

from orchestrator.engine import submit_plan, wait
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchestrator.store import Store

pytestmark = [pytest.mark.usefixtures("slurm"), pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                                 reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")]
MICRO = {"trainer": "test", "model.preset.hidden_size": 32, "model.preset.num_hidden_layers": 1,
         "model.preset.num_attention_heads": 2, "model.preset.num_key_value_heads": 1,
         "model.preset.intermediate_size": 64, "model.warm_start.enabled": False}


def test_a_v1_verl_sweep_of_two_cells_runs_on_slurm(workdir: Path, tracking: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    # The jobs run this interpreter with `workdir`'s PYTHONPATH; where TransferQueue sits outside its site-packages
    # (a folder on this process's path), the jobs and their Ray workers get that folder too.
    folder = str(Path(importlib.util.find_spec("transfer_queue").origin).parents[1])
    if folder not in site.getsitepackages():
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.environ["PYTHONPATH"], folder]))

    spec = {
        "name": "verl2",
        "backend": "verl",
        "base": {**MICRO, "task": "countdown", "algorithm": "grpo", "trainer.val_every": 0},
        "grid": {"filter": ["none", "top_p"]},
        "seeds": [0],
        "resources": {"default": {"cpus_per_task": 1, "mem_gb": 4, "time_min": 30}},
        "cluster": {"signal_delay_s": 30, "max_requeues": 1},
    }
    path = workdir / "verl2.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    plan = build_plan(load_sweep(path))
    store = Store.open()
    report = submit_plan(plan, store, "slurm", tracking_uri=tracking)
    assert report.submitted == 2
    assert wait(store, "verl2", poll_s=2, timeout_s=900) == {"finished": 2}, [
        (row.state, row.reason) for row in store.cell_rows(store.require_sweep("verl2").id)]
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("verl2")
    runs = [run for run in client.search_runs([experiment.experiment_id]) if "cell" in run.data.tags]
    assert len(runs) == 2
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["backend"] == "verl"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "timing_s/step")] == [1, 2]
        assert run.data.params["backend"] == "verl"
        keys = set(run.data.metrics)  # veRL's V1 trainer logs its `training/*` and not legacy's profiler marks
        assert any(key.startswith("training/") for key in keys) and "timing_s/start_profile" not in keys, keys
