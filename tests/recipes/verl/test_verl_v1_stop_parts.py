"""How a V1 run stops (`verl.trainer=v1`, issue #50 item 1), without Ray: the legacy path's rules
(test_verl_parts.py) through V1's hooks. A stop inside a step, before its update, drops the step (rewinds to the
previous step's end, checkpoints that with its dataloader position); a stop during a validation keeps nothing of it
and the resume runs it first; the time limit and the stop file checkpoint a step at its end; a resume reads orch's
state back."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from tests.recipes.verl.test_verl_parts import CountingHook, stop_setup

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                                reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")


def v1_trainer(tmp_path: Path, **fields):
    from recipes.runtime.time_limit import TimeLimit
    from recipes.verl.v1 import OrchV1Trainer

    trainer = object.__new__(OrchV1Trainer)
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path / "verl"),
                                                   "val_before_train": False}})
    trainer.orch = {"stop_file": str(tmp_path / "STOP")}
    trainer.pending_stop, trainer.validation_pending, trainer.loader_state, trainer._training = None, False, None, True
    trainer.empty_steps, trainer.validation, trainer.hooks, trainer._validated = 0, {}, {}, False
    trainer.tracker, trainer.time_limit, trainer.use_critic = SimpleNamespace(run_id="r", store_down=False), TimeLimit(None), False
    trainer.checkpoint_manager, trainer.timing_raw = SimpleNamespace(update_weights=lambda step=None: None), {}
    for key, value in fields.items():
        setattr(trainer, key, value)
    return trainer


@pytest.mark.parametrize("phase", ["rollout", "log-prob and reference passes", "log-prob, reference and value passes"])
def test_a_stop_inside_a_v1_step_drops_it_and_checkpoints_the_previous_step(phase, tmp_path) -> None:
    """As on the legacy path: the sampler's hand-over (after the rollout, before any log-prob) and the update
    overrides raise `Stop("preempted")` naming the phase, with orch's state back at the previous step's end and
    that step checkpointed with the dataloader's position of then."""
    from recipes.verl.orch_base import Stop

    stop_file, saves, hook = tmp_path / "STOP", [], CountingHook()
    trainer = v1_trainer(tmp_path, use_critic="value" in phase)
    stop_setup(stop_file, saves, None, hook)(trainer)
    stop_file.touch()
    call = {"rollout": lambda: trainer.after_rollout(None),
            "log-prob and reference passes": lambda: trainer._update_actor(None, {}),
            "log-prob, reference and value passes": lambda: trainer._update_critic(None, {})}[phase]
    with pytest.raises(Stop) as stopped:
        call()
    assert (stopped.value.status, stopped.value.reason) == (
        "preempted", f"stop requested during the {phase} of step 3; checkpoint at step 2")
    assert saves == [(2, {"position": 2})] and trainer.global_steps == 2
    assert (trainer.empty_steps, trainer.validation, hook.seen) == (0, {"val/success": 0.5}, 2)


def test_the_step_begin_keeps_the_previous_steps_end_and_a_rewound_checkpoint_gets_its_loader_position(
        tmp_path) -> None:
    """`on_step_begin` (before veRL draws the step's prompts) is what a dropped step rewinds to; veRL then saves
    its current dataloader position in `data.pt` and `OrchCheckpointCallback` replaces it with the rewound one,
    once, beside orch's state."""
    from recipes.runtime.checkpoint import VERL_STATE_FILE
    from recipes.verl.v1 import OrchCheckpointCallback

    hook = CountingHook()
    hook.seen = 4
    trainer = v1_trainer(tmp_path, hooks={"counting": hook}, empty_steps=2, validation={"val/success": 0.25},
                         train_dataloader=SimpleNamespace(state_dict=lambda: {"position": 5}), global_steps=6)
    trainer.on_step_begin()
    assert trainer.step_end == {"step": 5, "loader": {"position": 5}, "empty_steps": 2,
                                "validation": {"val/success": 0.25}, "hooks": {"counting": {"seen": 4}}}
    folder = tmp_path / "verl" / "global_step_5"
    folder.mkdir(parents=True)
    torch.save({"position": 6}, folder / "data.pt")  # what veRL's _save_checkpoint wrote
    trainer.loader_state = {"position": 5}
    OrchCheckpointCallback().on_save(trainer=trainer, global_step=5, checkpoint_dir=str(folder))
    assert torch.load(folder / "data.pt") == {"position": 5} and trainer.loader_state is None
    state = json.loads((folder / VERL_STATE_FILE).read_text())
    assert (state["empty_steps"], state["hooks"], state["trainer"]) == (2, {"counting": {"seen": 4}}, "v1")


def test_a_stop_during_a_v1_validation_keeps_nothing_of_it_and_the_resume_runs_it_first(tmp_path) -> None:
    """V1 validates after `on_step_end`: a stop file there (its episodes were cut short) gives no `val/*` and no
    best checkpoint; the step's checkpoint is marked `validation_pending` (saved now if it had none) and the run
    ends once the step is logged. The resume reads the mark and has veRL validate before training, at that step. A
    stop during veRL's validation before training ends the run at once."""
    from recipes.runtime.checkpoint import VERL_STATE_FILE
    from recipes.verl.orch_base import Stop

    saves: list[int] = []
    trainer = v1_trainer(tmp_path, global_steps=4, validation={"val/success": 0.5}, _val_seen=[("cut", {})])
    trainer._checkpointed_step = lambda: None
    trainer._save_checkpoint = lambda: saves.append(int(trainer.global_steps))
    (tmp_path / "STOP").touch()
    trainer.on_validate_end()
    assert trainer.validation == {"val/success": 0.5} and not trainer._validated  # nothing of the cut validation
    assert trainer.validation_pending and saves == [4]
    assert (trainer.pending_stop.status, trainer.pending_stop.reason) == ("preempted",
                                                                           "stop requested; checkpoint at step 4")
    folder = tmp_path / "verl" / "global_step_4"
    trainer._checkpointed_step = lambda: 4  # saved before the validation: the mark goes into its state file
    folder.mkdir(parents=True)
    trainer.on_validate_end()
    assert saves == [4] and json.loads((folder / VERL_STATE_FILE).read_text())["validation_pending"] is True

    resumed = v1_trainer(tmp_path, global_steps=4, best={})
    resumed.on_init_end()
    assert resumed.validation_pending and resumed.config.trainer.val_before_train is True
    assert resumed.validation == {"val/success": 0.5}

    before = v1_trainer(tmp_path, global_steps=4, _training=False, _val_seen=[])
    with pytest.raises(Stop, match="during the validation before training; checkpoint at step 4"):
        before.on_validate_end()


def test_the_stop_file_and_the_time_limit_checkpoint_a_v1_step_at_its_end(tmp_path) -> None:
    """`on_step_end` (after veRL's periodic checkpoint, before the step is logged): while the next step fits the
    time limit nothing happens; once it would not, or once the stop file is there, the step is checkpointed (unless
    veRL just did) and `Stop("preempted")` is pending for `_log`."""
    from recipes.runtime.time_limit import TimeLimit

    saves: list[int] = []
    trainer = v1_trainer(tmp_path, time_limit=TimeLimit(60.0, spent_s=30.0))
    trainer._checkpointed_step, trainer._save_checkpoint = lambda: None, lambda: saves.append(trainer.global_steps)
    trainer.global_steps, trainer._step_started = 1, time.perf_counter() - 10  # a 10 s step: 10 x 1.5 + 5 fits
    trainer.on_step_end()
    assert trainer.pending_stop is None and saves == []
    trainer.global_steps, trainer._step_started = 2, time.perf_counter() - 20  # a 20 s step: no longer fits
    trainer.on_step_end()
    assert trainer.pending_stop.status == "preempted" and saves == [2]
    assert trainer.pending_stop.reason.startswith("time limit: ") and trainer.pending_stop.reason.endswith(
        "checkpoint at step 2")

    signalled = v1_trainer(tmp_path, global_steps=3, _step_started=time.perf_counter())
    signalled._checkpointed_step = lambda: 3  # veRL's periodic checkpoint of this step: not saved twice
    signalled._save_checkpoint = lambda: saves.append(3)
    (tmp_path / "STOP").touch()
    signalled.on_step_end()
    assert signalled.pending_stop.reason == "stop requested; checkpoint at step 3" and saves == [2]
