"""A V1 cell's life cycle end to end on CPU (`verl.trainer=v1`, the default, issue #50 item 1): a graceful stop
(SIGUSR2 to every process, as SLURM sends it) and its resume into the same MLflow run with orch's state, on a run
whose filter keeps nothing (every step empty: no update). CI's one stop-and-resume of the veRL backend (the kill -9
twin is test_verl_training.py's, full tier); the best checkpoint, `orch eval` and `orch export` of V1's folder are test_verl_training.py's GRPO test; here, the loss scale reaching V1's update."""

from __future__ import annotations

import importlib.util
import signal

import pytest
import torch

from analysis import names
from recipes.config.backends import run_training
from recipes.config.schema import compose_train_config
from tests.recipes.verl.test_verl_training import (
    WARM,
    client,
    history,
    run_orch,
    signal_session,
    wait_for_step,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                                 reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")]


def test_v1_stopped_by_sigusr2_resumes_into_the_same_run_with_orchs_state_and_empty_steps_update_nothing(
        train_overrides, tmp_path) -> None:
    """A stop and its resume on V1 with a filter that keeps nothing: the cold micro model earns the format penalty
    everywhere, every group has zero variance and `filter=top_p` drops them all, so every step is empty (no update),
    and orch's count of consecutive empty steps, part of the state written beside veRL's checkpoint, runs 1..N
    across the resume only if the resume read it."""
    from recipes.torch_trainer.warmstart import model_folder
    from recipes.trained.export import resolve_checkpoint

    own_store = [o for o in train_overrides if not o.startswith("mlflow.tracking_uri=")]
    steps = 24  # an empty step takes ~0.4 s here, the stop must land before the last one
    overrides = [*own_store, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "backend=verl",
                 "algorithm=grpo", "task=countdown", "filter=top_p", "trainer.max_empty_steps=0",
                 f"trainer.total_steps={steps}", "trainer.save_every=2", "trainer.val_every=0"]
    mlflow = client(overrides)
    first = run_orch(overrides, tmp_path / "first.log")
    run_id = wait_for_step(mlflow, 1, first, tmp_path / "first.log")
    signal_session(first, signal.SIGUSR2)
    assert first.wait(timeout=120) == 75, (tmp_path / "first.log").read_text()[-3000:]  # "requeue me"
    first_log = (tmp_path / "first.log").read_text()
    # at a step's end ("stop requested; checkpoint at step N"), or inside the next step, which is dropped ("stop
    # requested during the rollout of step N+1; checkpoint at step N"): both ran here
    assert "preempted: stop requested" in first_log, first_log[-3000:]
    stopped_at = len(history(mlflow, run_id, names.STEP_TIME))
    assert 1 <= stopped_at < steps
    second = run_orch(overrides, tmp_path / "second.log")
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    runs = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()])
    assert [run.info.run_id for run in runs] == [run_id] and runs[0].info.status == "FINISHED"
    assert [step for step, _ in history(mlflow, run_id, names.STEP_TIME)] == list(range(1, steps + 1))
    assert history(mlflow, run_id, "rollout/empty_steps") == [(step, float(step)) for step in range(1, steps + 1)]
    assert history(mlflow, run_id, "actor/pg_loss") == []  # no step updated the actor
    cfg = compose_train_config(overrides)
    checkpoint = resolve_checkpoint(cfg.infra.checkpoint_dir)
    assert checkpoint.parent.name == f"global_step_{steps}"
    from safetensors.torch import load_file

    state = {key: value.full_tensor() if hasattr(value, "full_tensor") else value
             for key, value in torch.load(checkpoint / "model_world_size_1_rank_0.pt", weights_only=False).items()}
    base = load_file(str(model_folder(cfg)[0] / "model.safetensors"))
    for key, value in base.items():  # the actor after its empty steps is the model it started from
        assert torch.equal(state[key], value), key


def test_v1_scales_the_loss_of_the_kept_groups(train_overrides) -> None:
    """`filter.loss_scaling=linear`: the kept half of the groups update with their advantages x 0.5. GRPO normalises
    each group's advantages to a standard deviation of 1, so a group of 4 with any reward variance has its largest
    |advantage| in [sqrt(3)/2, 3/2]; scaled by 0.5 in [0.433, 0.75]: veRL's `critic/advantages` extremes, read from
    TransferQueue after the update, show whether the scale reached the update."""
    overrides = [*train_overrides, *WARM, "backend=verl", "algorithm=grpo", "trainer.samples_per_prompt=4",
                 "trainer.prompts_per_step=4", "trainer.mini_batch_size=4", "trainer.max_response_tokens=64",
                 "filter=top_k", "filter.value=0.5", "filter.include_zero=true", "filter.loss_scaling=linear"]
    result = run_training(compose_train_config(overrides))
    assert (result.status, result.steps_done) == ("finished", 2), result.reason
    mlflow, run_id = client(overrides), result.mlflow_run_id
    assert history(mlflow, run_id, "rollout/kept_ratio") == [(1, 0.5), (2, 0.5)]
    assert history(mlflow, run_id, "rollout/loss_scale") == [(1, 0.5), (2, 0.5)]
    top = dict(history(mlflow, run_id, "critic/advantages/max"))
    bottom = dict(history(mlflow, run_id, "critic/advantages/min"))
    for step in (1, 2):
        largest = max(top[step], -bottom[step])
        assert largest == 0.0 or 0.5 * 3 ** 0.5 / 2 - 1e-4 <= largest <= 0.75 + 1e-4, (step, largest)
    assert max(max(top.values()), -min(bottom.values())) > 0  # some kept group had reward variance
