"""The `collapse` step hook: template-collapse diagnostics inside training (enable with `hooks=[collapse]`).

Configured by the `diagnostics:` section of the training config (`recipes.diagnostics.monitor.DiagnosticsConfig`).
Runs in `on_rollout`, on the step's **unfiltered** batch, before the update:

* every `mi_every` steps (and at step 1): the MI proxies of `CollapseMonitor` (`collapse/<set>/*`) and the
  collapse alert (`collapse/alert`, `collapse/mi_drop`). When the alert first fires it sets the MLflow tag
  `collapse_alert_step`, warns (log and terminal), and with `stop_on_collapse` stops the run after the step;
* at step 1 and every `grad_every` steps after it (1, 1 + N, ...: RAGEN's cadence; 0 = never): the gradient
  split by reward-variance bucket (the paper's signal-to-noise analysis): the prompt groups are split into
  `grad_buckets` buckets by within-prompt reward std and, per bucket, the L2 norms of the gradients of the task
  part and of the regularisation part of the actor loss are logged (`grad_norm/bucket_<k>/{task, reg, rv_min,
  rv_max}`, bucket 0 the lowest reward variance). The backend answers through `ctx.policy`
  (`recipes.diagnostics.hooks.PolicyAccess`): the step's unfiltered batch scored by the trainer's own scoring
  (reference log-probs, values, advantages of the run's estimator on all groups; the torch trainer in this
  process, veRL through the fit loop's own scoring calls and the actor workers' `orch_gradient_norms`,
  recipes.verl.workers); nothing is applied to the policy. The gradients are over the parameters the update trains:
  with LoRA (`model.lora.rank` > 0) the adapters' only, which the run's tag `GRAD_SPLIT_TAG` says.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np

from recipes.diagnostics.hooks import StepContext, StepHook
from recipes.diagnostics.monitor import CollapseMonitor, TurnEncoder, reward_variance_buckets
from recipes.policy.chat import ChatEncoder
from recipes.stats.collapse_alert import CollapseStatus, rates_line
from recipes.stats.rollout_stats import VAL_SUCCESS

log = logging.getLogger(__name__)
GRAD_SPLIT_TAG = "orch.grad_split.parameters"  # what the split's gradients are over: all, or the LoRA adapters'


def split_parameters(lora: Any) -> str:
    """`GRAD_SPLIT_TAG`'s value for a run's `model.lora`: "all", or "adapter only (LoRA rank r, targets)"."""
    if lora.rank <= 0:
        return "all"
    return f"adapter only (LoRA rank {lora.rank}, {lora.targets_text})"


def turn_encoder(encoder: ChatEncoder, generated: dict[str, list[int]]) -> TurnEncoder:
    """Prompts rendered exactly as the sampler saw them (earlier replies as their sampled ids), reasoning as text."""
    vision = encoder.vision
    return TurnEncoder(
        lambda messages: encoder.encode(messages, generated, add_generation_prompt=True).input_ids,
        lambda text: list(encoder.tokenizer(text, add_special_tokens=False)["input_ids"]),
        None if vision is None else
        lambda messages, frames: vision.encode(encoder, messages, frames, generated, True).input_ids,
    )


def gradient_split(ctx: StepContext, num_buckets: int) -> dict[str, float]:
    """Per reward-variance bucket, the L2 norms of the task and regularisation gradients of the actor loss (each
    bucket's rows normalised as part of the whole batch, so the bucket gradients sum to the batch gradient), by the
    backend that holds the policy (`ctx.policy.gradient_norms`)."""
    returns = np.array([t.episode_return for t in ctx.trajectories])
    buckets = reward_variance_buckets(returns, ctx.group_ids, num_buckets)
    norms = ctx.policy.gradient_norms([bucket.rows for bucket in buckets])
    metrics = {}
    for index, (bucket, norm) in enumerate(zip(buckets, norms, strict=True)):
        prefix = f"grad_norm/bucket_{index}"
        metrics.update({f"{prefix}/task": norm["task"], f"{prefix}/reg": norm["reg"],
                        f"{prefix}/rv_min": bucket.rv_min, f"{prefix}/rv_max": bucket.rv_max})
    return metrics


class CollapseHook(StepHook):
    """MI proxies, the collapse alert and the gradient split (see the module docstring)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.config = cfg.diagnostics
        self.monitor = CollapseMonitor(self.config, seed=int(cfg.seed))

    def on_rollout(self, ctx: StepContext) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.config.due(ctx.step):
            metrics.update(self.mutual_information(ctx))
        if self.config.grad_due(ctx.step):
            metrics.update(gradient_split(ctx, self.config.grad_buckets))
            ctx.tags[GRAD_SPLIT_TAG] = split_parameters(ctx.cfg.model.lora)
        return metrics

    def mutual_information(self, ctx: StepContext) -> dict[str, float]:
        """The monitor's metrics for this step; raises the alert when it first fires."""
        success = ctx.validation.get(VAL_SUCCESS, ctx.metrics.get("rollout/success_rate"))
        metrics = self.monitor.compute(ctx.step, ctx.policy.cross_score, turn_encoder(ctx.encoder, ctx.generated),
                                       ctx.trajectories, success)
        status = self.monitor.last_status
        if "collapse/alert" in metrics and status is not None and status.new_alert:
            self.alert(ctx, status)
        return metrics

    def alert(self, ctx: StepContext, status: CollapseStatus) -> None:
        """Tag the run, warn in the log and on the terminal, and stop the run when configured to."""
        ctx.tags["collapse_alert_step"] = str(ctx.step)
        log.warning("step %d: %s", ctx.step, status.reason)
        action = "stopping the run (diagnostics.stop_on_collapse)" if self.config.stop_on_collapse else "training goes on"
        print(f"WARNING step {ctx.step}: template collapse suspected; {action}. {status.reason}. "
              f"{rates_line(self.config.rule)}", file=sys.stderr, flush=True)
        if self.config.stop_on_collapse:
            ctx.stop_reason = f"diagnostics.stop_on_collapse at step {ctx.step}: {status.reason}"

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.monitor.load_state_dict(state["monitor"])
