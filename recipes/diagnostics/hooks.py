"""Step hooks: where training-time measurements (diagnostics) plug into the torch trainer.

A hook is a class named in `recipes.diagnostics.registry.HOOKS` (or registered with `@register_hook("name")`) and
enabled by listing the name in the config's `hooks: [...]`. The trainer builds one instance per run and, every step, calls

* `on_rollout(ctx)` right after generation, on the **unfiltered** batch (trajectories, their token tensors, the
  policy, the encoder): the place for MI cross-scoring, which the paper computes before filtering;
* `on_batch(ctx)` after advantages, before the update (`ctx.batch` holds the kept trajectories' tensors): the
  place for gradient decompositions.

Each returns metrics to log at that step. A hook may set `ctx.stop_reason` to stop the run after the step
(e.g. a collapse alarm with `stop_on_collapse`) and add MLflow tags to `ctx.tags`. `state_dict`/`load_state_dict`
carry running state (EMA trackers) through checkpoints. Hooks: `collapse` (recipes/diagnostics/collapse_hook.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StepContext:
    """What a hook sees at one step.

    step: the training step (1-based).
    cfg: the resolved run config.
    policy: the current policy model (causal LM).
    encoder: `recipes.policy.chat.ChatEncoder` of the policy's tokenizer (`encoder.tokenizer`).
    trajectories: the step's `envs.Trajectory` list, before filtering (T of them).
    group_ids: (T,) prompt id of each trajectory.
    generated: reply text -> sampled token ids (to rebuild exact sequences via `encoder.encode`).
    metrics: the step's metrics computed so far (rollout, filter, ...); read them, return yours.
    validation: the latest `val/*` metrics (from step 0 on; empty when validation is off).
    reference: the frozen reference policy (None unless `algorithm.use_kl`).
    critic: the value model (None unless the algorithm uses one, e.g. PPO).
    actor_config: the veRL ActorConfig of the actor loss (clip ranges, aggregation, entropy / KL coefficients).
    rollout_batch: every trajectory of the step as a `recipes.policy.batch.TrainBatch` (token tensors, unscored), built
        once by the trainer: its kept rows are what the update trains on.
    score: `score(batch, old_log_probs=True)` -> the batch with the run's log-probs, values and advantages, as the
        trainer scores its update batch (the same function); None where the backend has no such batch (veRL).
    cross_score: `cross_score(prompts, samples)` -> `recipes.stats.cross_scoring.CrossScores` under the current policy,
        where the policy is not in this process (veRL: through its actor workers); None: score with `policy`.
    gradient_norms: `gradient_norms(row_sets)` -> one `{"task": norm, "reg": norm}` per set of trajectory rows: the
        norms of the actor loss's task and regularisation gradients over those rows at the current policy, every
        row normalised by the whole batch, nothing applied; where the policy is not in this process (veRL: its
        actor workers); None: computed with `policy` and `score`.
    batch: the kept trajectories as a `recipes.policy.batch.TrainBatch` with advantages (only in `on_batch`).
    stop_reason: set to stop the run after this step.
    tags: MLflow tags to set on the run after this step (e.g. `collapse_alert_step`).
    """

    step: int
    cfg: Any
    policy: Any
    encoder: Any
    trajectories: list[Any]
    group_ids: np.ndarray
    generated: dict[str, list[int]]
    metrics: dict[str, float]
    validation: dict[str, float]
    reference: Any = None
    critic: Any = None
    actor_config: Any = None
    rollout_batch: Any = None
    score: Callable[..., Any] | None = None
    cross_score: Callable[..., Any] | None = None
    gradient_norms: Callable[..., Any] | None = None
    batch: Any = None
    stop_reason: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


class StepHook:
    """Base class: override what you need."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def on_rollout(self, ctx: StepContext) -> dict[str, float]:
        return {}

    def on_batch(self, ctx: StepContext) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
