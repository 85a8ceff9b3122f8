"""veRL's V1 trainer end to end on CPU (`verl.trainer=v1`, issue #50): 2 steps of GRPO on Countdown with the filter
and the MI diagnostics, beside the same cell on the legacy trainer; both log the same orch metric keys, and veRL's own
keys differ only where veRL's two trainers do (listed here)."""

from __future__ import annotations

import importlib.util

import pytest
from mlflow import MlflowClient

from analysis import names
from recipes.config.backends import run_training
from recipes.config.schema import compose_train_config
from tests.recipes.verl.test_verl_training import WARM, client, history

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                                 reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")]
# veRL's own metrics that only one of its trainers logs (ray_trainer.py's agent-loop timings and profiler marks;
# V1's `_compute_metrics`, v1/trainer_base.py:1935-1993): not orch's, and no analysis reads them
LEGACY_ONLY = ("timing_s/agent_loop/", "perf/mfu/actor_infer", "timing_s/reward", "timing_s/start_profile",
               "timing_s/stop_profile")
V1_ONLY = ("training/",)


def test_v1_grpo_with_the_filter_and_mi_logs_the_legacy_runs_metric_keys(train_overrides, tmp_path) -> None:
    overrides = [*train_overrides, *WARM, "backend=verl", "algorithm=grpo", "trainer.samples_per_prompt=4",
                 "trainer.prompts_per_step=4", "trainer.mini_batch_size=4", "trainer.max_response_tokens=64",
                 "filter=top_k", "filter.value=0.5", "filter.include_zero=true", "hooks=[collapse]",
                 "diagnostics.num_samples=8"]
    mlflow: MlflowClient = client(overrides)
    keys = {}
    for trainer in ("legacy", "v1"):
        result = run_training(compose_train_config(
            [*overrides, f"verl.trainer={trainer}", f"trainer.checkpoint_dir={tmp_path / trainer}"]))
        assert (result.status, result.steps_done) == ("finished", 2), result.reason
        run_id = result.mlflow_run_id
        keys[trainer] = set(mlflow.get_run(run_id).data.metrics)
        assert history(mlflow, run_id, "rollout/kept_ratio") == [(1, 0.5), (2, 0.5)]
        assert [v for _, v in history(mlflow, run_id, "rollout/update_trajectories")] == [8.0, 8.0]
        assert [step for step, _ in history(mlflow, run_id, names.VAL_SUCCESS)] == [0, 1, 2]
        assert [step for step, _ in history(mlflow, run_id, names.MI_ZSCORE_EMA)] == [1]
        assert (tmp_path / trainer / "verl" / "orch_trainer.txt").read_text() == trainer
    assert {k for k in keys["legacy"] - keys["v1"] if not k.startswith(LEGACY_ONLY)} == set()
    assert {k for k in keys["v1"] - keys["legacy"] if not k.startswith(V1_ONLY)} == set()
