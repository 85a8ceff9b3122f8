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
from recipes.config.schema import compose_train_config
from tests.recipes.verl.test_verl_training import (
    client,
    history,
    run_orch,
    signal_session,
    wait_for_step,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                                 reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")]


@pytest.mark.parametrize("stop", ["SIGUSR2", pytest.param("SIGTERM", marks=pytest.mark.full)])
def test_v1_stopped_by_a_signal_resumes_into_the_same_run_with_orchs_state_and_empty_steps_update_nothing(
        train_overrides, tmp_path, stop) -> None:
    """The legacy `test_a_stopped_run_resumes_into_the_same_run_without_a_lost_or_repeated_step` on V1, with a filter
    that keeps nothing: the cold micro model earns the format penalty everywhere, every group has zero variance and
    `filter=top_p` drops them all, so every step is empty (no update), and orch's count of consecutive empty steps,
    part of the state written beside veRL's checkpoint, runs 1..N across the resume only if the resume read it.
    SIGUSR2 (SLURM's warning) checkpoints and ends the run; SIGTERM to every process (a preemption) also ends Ray's,
    and the run resumes from its last periodic checkpoint, as the legacy backend reports it."""
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
    signal_session(first, getattr(signal, stop))
    assert first.wait(timeout=120) == 75, (tmp_path / "first.log").read_text()[-3000:]  # "requeue me"
    first_log = (tmp_path / "first.log").read_text()
    # SIGUSR2: at a step's end ("stop requested; checkpoint at step N"), or inside the next step, which is dropped
    # ("stop requested during the rollout of step N+1; checkpoint at step N"): both ran here
    # SIGTERM: Ray's processes end too, unless the trainer read the stop file first (recipes.verl.backend.train)
    assert "preempted: stop requested" in first_log or (
        stop == "SIGTERM" and "preempted: stopped by a signal that also ended Ray's processes" in first_log), \
        first_log[-3000:]
    assert 1 <= len(history(mlflow, run_id, names.STEP_TIME)) < steps
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


def test_the_loss_scale_multiplies_the_advantages_verls_update_reads_from_transfer_queue(tmp_path,
                                                                                        monkeypatch) -> None:
    """`OrchV1Trainer._update_actor` with the filter's loss scale 0.5, on a real TransferQueue (in a Ray of its own):
    veRL's `_update_actor` hands the actor workers the batch's keys and they read the advantages from
    TransferQueue (v1/trainer_base.py:1827-1866), so what veRL's update reads there is each row's advantages x 0.5
    (ragged rows, as veRL stores them); an empty step (`skip_update`) does not reach veRL's update at all."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from tests.recipes.verl.test_verl_v1_stop_parts import v1_trainer

    read: list[list[torch.Tensor]] = []

    def verl_update(self, batch, metrics):
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages"])
        read.append(list(data["advantages"].unbind()))
        return batch

    monkeypatch.setattr(PPOTrainer, "_update_actor", verl_update)
    rows = [torch.tensor([1.5, 1.5]), torch.tensor([-0.5]), torch.tensor([0.25, -1.0, 2.0])]
    keys = ["u1_0_0", "u1_1_0", "u2_0_0"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        try:
            tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict(
                {"advantages": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, batch_size=len(rows)))
            batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{}, {}, {}])
            trainer = v1_trainer(tmp_path, step_metrics={}, skip_update=True, advantage_scale=0.5)
            assert trainer._update_actor(batch, {}) is batch and read == []  # the empty step: no update
            trainer.skip_update = False
            trainer._update_actor(batch, {})
        finally:
            tq.close()
    finally:
        ray.shutdown()
    assert len(read) == 1 and all(torch.equal(got, row * 0.5) for got, row in zip(read[0], rows, strict=True))
