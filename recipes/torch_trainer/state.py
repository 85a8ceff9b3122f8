"""What a torch run holds from setup to its end (`Run`): the config, the models and their optimisers (`Models`: policy,
optional value model, frozen reference, the chat encoder), the step hooks, the update settings, its MLflow run and
checkpoint folder, and the counters that travel with checkpoints.

`Run` saves a checkpoint (`checkpoint`), keeps the best validation's policy (`keep_if_best`), copies and rewinds what
a dropped step changed besides the model (`counters`, `rewind`) and continues from a checkpoint (`restore`: the resume
logs `resume/replayed_steps`, the steps re-run since it). The loop that drives it is `recipes.torch_trainer.trainer`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from recipes.config.schema import TrainConfig
from recipes.diagnostics.hooks import StepHook
from recipes.policy.actor import UpdateSettings
from recipes.policy.algorithms import Algorithm
from recipes.policy.chat import ChatEncoder
from recipes.policy.lora import add_adapters, trainable_parameters
from recipes.policy.models import load_critic, load_policy, load_tokenizer
from recipes.policy.vision import ImageTokens
from recipes.run.tracking import RunTracker
from recipes.runtime.checkpoint import BEST_DIR, restore_rng_states, save_checkpoint
from recipes.stats.rollout_stats import VAL_SUCCESS

REPLAYED_METRIC = "resume/replayed_steps"  # logged at each resume: steps re-run since the checkpoint
log = logging.getLogger(__name__)


class Models:
    """Policy, optional value model and frozen reference, their optimisers, and the chat encoder.

    With LoRA (`model.lora.rank` > 0) the policy carries peft's adapters (`recipes.policy.lora.add_adapters`, in place:
    `policy` stays the Hugging Face model, `adapter` is peft's wrapper), only they are trained (the optimiser holds
    them alone), and the KL reference is the policy with its adapters disabled (`reference_weights`), as veRL does
    with LoRA (verl/trainer/ppo/ray_trainer.py:357-360, :1272-1276): no second copy of the model. The critic trains
    all its parameters."""

    def __init__(self, cfg: TrainConfig, folder: Path, uses_critic: bool) -> None:
        device, dtype = cfg.trainer.device, cfg.model.dtype
        tokenizer = load_tokenizer(folder)
        self.encoder = ChatEncoder(tokenizer, vision=ImageTokens.from_folder(folder, tokenizer))
        self.policy = load_policy(folder, dtype, device)
        self.adapter = add_adapters(self.policy, cfg.model.lora) if cfg.model.lora.enabled else None
        self.policy_optimizer = torch.optim.AdamW(
            trainable_parameters(self.policy), lr=cfg.model.actor_lr, weight_decay=cfg.model.weight_decay
        )
        self.critic = load_critic(folder, dtype, device) if uses_critic else None
        self.critic_optimizer = (
            torch.optim.AdamW(self.critic.parameters(), lr=cfg.model.critic_lr, weight_decay=cfg.model.weight_decay)
            if self.critic is not None else None
        )
        self.reference = None if not cfg.algorithm.use_kl else self.policy if self.adapter is not None \
            else load_policy(folder, dtype, device).eval().requires_grad_(False)

    def reference_weights(self) -> contextlib.AbstractContextManager:
        """The context in which `reference` computes the reference policy: with LoRA, the adapters disabled."""
        return self.adapter.disable_adapter() if self.adapter is not None else contextlib.nullcontext()

    def state_dict(self) -> dict[str, Any]:
        state = {"policy": self.policy.state_dict(), "policy_optimizer": self.policy_optimizer.state_dict()}
        if self.critic is not None:
            state.update(critic=self.critic.state_dict(), critic_optimizer=self.critic_optimizer.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.policy_optimizer.load_state_dict(state["policy_optimizer"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])


@dataclass
class Run:
    """What a run holds from setup to its end: the config, models, hooks, the update settings, its MLflow run and
    checkpoint folder, and the counters that travel with checkpoints."""

    cfg: TrainConfig
    tracker: RunTracker
    checkpoint_dir: Path
    models: Models
    algorithm: Algorithm
    hooks: dict[str, StepHook]
    settings: UpdateSettings
    policy_config: Any  # veRL ActorConfig
    empty_steps: int = 0
    validation: dict[str, float] = field(default_factory=dict)  # the latest val/* metrics (hooks read them)
    best: dict[str, float] = field(default_factory=dict)  # {"step", "success"} of the best validation so far

    def checkpoint(self, step: int, validation_pending: bool = False) -> None:
        """Save everything a resume needs at `step`; `validation_pending`: a stop interrupted step `step`'s
        validation, which the resume runs first."""
        save_checkpoint(self.checkpoint_dir, step, {
            **self.models.state_dict(), "hooks": {name: hook.state_dict() for name, hook in self.hooks.items()},
            "empty_steps": self.empty_steps, "validation": self.validation, "best": self.best,
            "validation_pending": validation_pending,
            "mlflow_run_id": self.tracker.run_id, "config": yaml.safe_dump(self.cfg.to_tree(), sort_keys=False),
        })

    def counters(self) -> dict[str, Any]:
        """A copy of what a step changes besides the model (hook states, the empty-step count): a step a stop
        interrupts before its update is undone with `rewind` (the model is as it was)."""
        return copy.deepcopy({"hooks": {name: hook.state_dict() for name, hook in self.hooks.items()},
                              "empty_steps": self.empty_steps})

    def rewind(self, counters: dict[str, Any]) -> None:
        for name, hook in self.hooks.items():
            hook.load_state_dict(counters["hooks"][name])
        self.empty_steps = counters["empty_steps"]

    def keep_if_best(self, step: int) -> None:
        """After a validation at `step` (>= 1): if its success beats every earlier one of the run, keep the policy as
        `<checkpoint_dir>/best/step_N` (weights and config only; the one kept there), where `orch eval --best` and
        `orch export` find it: the paper reports each run's peak validation success."""
        success = self.validation.get(VAL_SUCCESS)
        if success is None or success <= self.best.get("success", -math.inf):
            return
        save_checkpoint(self.checkpoint_dir / BEST_DIR, step, {
            "policy": self.models.policy.state_dict(), "validation": self.validation,
            "mlflow_run_id": self.tracker.run_id, "config": yaml.safe_dump(self.cfg.to_tree(), sort_keys=False),
        }, keep=1)
        self.best = {"step": step, "success": success}
        self.tracker.set_tags({"orch.best_step": str(step), "orch.best_success": f"{success:.6g}"})

    def restore(self, resumed: dict[str, Any]) -> int:
        """Continue from a checkpoint; returns its step."""
        self.models.load_state_dict(resumed)
        for name, hook in self.hooks.items():
            hook.load_state_dict(resumed["hooks"].get(name, {}))
        restore_rng_states(resumed["rng"])
        self.empty_steps, self.validation = resumed["empty_steps"], resumed["validation"]
        self.best = resumed.get("best", {})  # checkpoints from before the best was kept carry none
        last = self.tracker.last_logged_step("timing_s/step")
        replayed = max(0, last - resumed["step"]) if last is not None else 0
        # One point per resume, at the checkpoint's step: how many steps the run does twice (at most
        # `trainer.save_every` - 1 after a crash; 0 after a stop signal, which checkpoints where it stops).
        self.tracker.log_metrics({REPLAYED_METRIC: replayed}, int(resumed["step"]))
        if replayed:
            log.warning("steps %d..%d were logged after the last checkpoint and are re-run", resumed["step"] + 1,
                        last)
            self.tracker.set_tags({"orch.replayed_steps": f"{resumed['step'] + 1}-{last}"})
        return int(resumed["step"])
