"""The V1 backend's parts (`verl.trainer: v1`, issue #50), without a training run: the hosting key, the refusals of
what the V1 path does not do yet, the config it maps to, the trainer a resumed cell keeps, and the V1 trainer's
hooks and registration in veRL 0.9.1 (skipped where TransferQueue, which V1 needs, is not installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from orchlib.errors import OrchError
from recipes.config.schema import compose_train_config
from tests.recipes.conftest import MICRO
from tests.recipes.verl.test_verl_parts import mapped

V1 = [*MICRO, "backend=verl", "algorithm=grpo", "verl.trainer=v1"]
needs_tq = pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                              reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")


def test_the_trainer_is_hosting_not_identity() -> None:
    legacy = compose_train_config([*MICRO, "backend=verl", "algorithm=grpo", "verl.trainer=legacy"])
    v1 = compose_train_config(V1)
    assert (legacy.infra.verl.trainer, v1.infra.verl.trainer) == ("legacy", "v1")
    assert legacy.digest() == v1.digest()


@pytest.mark.parametrize(("extra", "key"), [
    (["hooks=[collapse]", "diagnostics.method=naive"], "diagnostics.method"),
])
def test_what_v1_does_not_do_yet_is_refused_in_one_line(extra, key) -> None:
    with pytest.raises(OrchError, match=f"config key {key}: .*V1 trainer") as err:
        compose_train_config([*V1, *extra])
    assert "\n" not in str(err.value)
    compose_train_config([*MICRO, "backend=verl", "algorithm=grpo", "verl.trainer=legacy", *extra])  # legacy takes it


@pytest.mark.parametrize("extra", [
    ["trainer.device=cuda"],  # vLLM, the rollout on cuda
    ["hooks=[collapse]", "diagnostics.grad_every=2"],  # the gradient split
    ["control.blind_from_step=3"],  # the planted-collapse control
])
def test_v1_takes_what_legacy_takes(extra) -> None:
    """What legacy takes, V1 takes, with the same identity (the V1 path's refusals are gone but naive cross-scoring)."""
    legacy = compose_train_config([*MICRO, "backend=verl", "algorithm=grpo", "verl.trainer=legacy", *extra])
    v1 = compose_train_config([*V1, *extra])
    assert v1.digest() == legacy.digest()


def test_v1_maps_to_the_sync_trainer_with_orchs_sampler_and_checkpoint_callback() -> None:
    lines = mapped(V1)
    assert lines["trainer.use_v1"] == "true" and lines["trainer.v1.trainer_mode"] == "'sync'"
    assert lines["trainer.v1.sampler.custom_sampler.path"] == "'pkg://recipes.verl.v1'"
    assert lines["trainer.v1.sampler.custom_sampler.name"] == "'OrchSampler'"
    assert lines["trainer.checkpoint_callback_class"] == "'recipes.verl.v1.OrchCheckpointCallback'"
    assert lines["actor_rollout_ref.rollout.agent.agent_loop_manager_class"] == "'recipes.verl.v1.OrchAgentLoopManager'"
    assert lines["transfer_queue.backend.SimpleStorage.num_data_storage_units"] == "1"  # cpu: 8 actors never fit
    legacy = mapped([*MICRO, "backend=verl", "algorithm=grpo", "verl.trainer=legacy"])
    assert legacy["trainer.use_v1"] == "false" and "trainer.v1.sampler.custom_sampler.path" not in legacy
    assert "actor_rollout_ref.rollout.agent.agent_loop_manager_class" not in legacy  # legacy reads it too


def test_a_resumed_cell_keeps_the_trainer_that_wrote_its_checkpoints(tmp_path: Path) -> None:
    from recipes.verl.backend import TRAINER_FILE, keep_trainer

    folder = tmp_path / "verl"
    keep_trainer(folder, "v1", None)  # a fresh start records its trainer
    assert (folder / TRAINER_FILE).read_text() == "v1"
    keep_trainer(folder, "v1", 3)
    with pytest.raises(OrchError, match="config key verl.trainer: legacy, .* written by veRL's v1 trainer") as err:
        keep_trainer(folder, "legacy", 3)
    assert "\n" not in str(err.value)
    (folder / TRAINER_FILE).unlink()  # checkpoints from before the record: the legacy trainer's
    keep_trainer(folder, "legacy", 3)
    with pytest.raises(OrchError, match="written by veRL's legacy trainer"):
        keep_trainer(folder, "v1", 3)


@needs_tq
def test_the_v1_trainer_is_registered_and_uses_veRLs_hooks() -> None:
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from recipes.verl.v1 import POLL_S, OrchSampler, OrchV1Trainer

    assert get_trainer_cls("orch_sync") is OrchV1Trainer
    hooks = {"on_init_end", "on_train_begin", "on_step_begin", "on_step_end", "on_validate_begin", "on_validate_end"}
    assert hooks <= set(vars(PPOTrainer)) and hooks <= set(vars(OrchV1Trainer))
    assert issubclass(OrchSampler, ReplayBuffer) and POLL_S < 2.0


@needs_tq
def test_transfer_queues_trajectory_dicts_are_rebuilt() -> None:
    from envs.trajectory import Trajectory, Turn
    from recipes.verl.v1 import as_trajectory

    turn = Turn(prompt_messages=[{"role": "user", "content": "x"}], response="r", reasoning="", actions=["a"],
                reward=0.5, format_valid=True)
    trajectory = Trajectory(task="countdown", seed=3, messages=[], turns=[turn], success=False)
    rebuilt = as_trajectory({"task": "countdown", "seed": 3, "messages": [], "success": False,
                             "turns": [dict(vars(turn))]})
    assert rebuilt == trajectory and rebuilt.episode_return == 0.5
    assert as_trajectory(trajectory) is trajectory
