"""Step hooks: where training-time measurements (diagnostics) plug into the trainers (torch and verl).

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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from recipes.stats.cross_scoring import CrossScores


class PolicyAccess(Protocol):
    """What a hook can ask of the step's policy, the same on every backend: the torch trainer answers in this process
    (`recipes.torch_trainer.policy_access.LocalPolicy`), the verl backend through its actor workers
    (`recipes.verl.trainer.WorkerPolicy`). A hook never needs to know which."""

    def cross_score(self, prompts: list[Any], samples: list[list[int]]) -> CrossScores:
        """Every sample (reasoning token ids) scored teacher-forced under every prompt column (token ids, or keyed
        ids where prompts show frames) by the current policy, with the run's `diagnostics.method` and batch size."""
        ...

    def gradient_norms(self, row_sets: list[np.ndarray]) -> list[dict[str, float]]:
        """One `{"task": norm, "reg": norm}` per set of rows of the step's unfiltered batch: the L2 norms of the actor
        loss's task and regularisation gradients over those rows at the current policy (the batch scored as the
        update batch is, every row normalised by the whole batch); nothing is applied."""
        ...


@dataclass
class StepContext:
    """What a hook sees at one step.

    step: the training step (1-based).
    cfg: the resolved run config.
    policy: what the hook may ask of the current policy (`PolicyAccess`: cross-scoring, gradient norms).
    encoder: `recipes.policy.chat.ChatEncoder` of the policy's tokenizer (`encoder.tokenizer`).
    trajectories: the step's `envs.Trajectory` list, before filtering (T of them).
    group_ids: (T,) prompt id of each trajectory.
    generated: reply text -> sampled token ids (to rebuild exact sequences via `encoder.encode`).
    metrics: the step's metrics computed so far (rollout, filter, ...); read them, return yours.
    validation: the latest `val/*` metrics (from step 0 on; empty when validation is off).
    batch: the kept trajectories as a `recipes.policy.batch.TrainBatch` with advantages (only in `on_batch`, which
        the torch trainer calls).
    stop_reason: set to stop the run after this step.
    tags: MLflow tags to set on the run after this step (e.g. `collapse_alert_step`).
    """

    step: int
    cfg: Any
    policy: PolicyAccess
    encoder: Any
    trajectories: list[Any]
    group_ids: np.ndarray
    generated: dict[str, list[int]]
    metrics: dict[str, float]
    validation: dict[str, float]
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
