"""The torch trainer's answer to what a step hook may ask of the policy (`recipes.diagnostics.hooks.PolicyAccess`):
the policy is in this process, so cross-scoring and the gradient split run here, on the step's unfiltered batch
scored the way the trainer scores its update batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from recipes.diagnostics.monitor import DiagnosticsConfig, scorer
from recipes.policy.actor import global_batch_info, gradient_norm, loss_part_gradients
from recipes.policy.batch import TrainBatch
from recipes.policy.chat import ChatEncoder
from recipes.stats.cross_scoring import CrossScores


@dataclass
class LocalPolicy:
    """`PolicyAccess` with the policy in this process.

    model: the current policy (causal LM).
    encoder: the policy's `ChatEncoder` (its pad id; its `vision` for prompts that show frames).
    diagnostics: the run's `diagnostics:` section (cross-scoring method and batch size).
    actor_config: the veRL ActorConfig of the actor loss (clip ranges, aggregation, entropy / KL coefficients).
    micro_batch_size: rows per forward/backward pass.
    rollout_batch: every trajectory of the step (token tensors, unscored).
    score: `score(batch, old_log_probs=...)` -> the batch with the run's log-probs, values and advantages, the
        trainer's own scoring of its update batch.
    """

    model: Any
    encoder: ChatEncoder
    diagnostics: DiagnosticsConfig
    actor_config: Any
    micro_batch_size: int
    rollout_batch: TrainBatch
    score: Callable[..., TrainBatch]

    def cross_score(self, prompts: list[Any], samples: list[list[int]]) -> CrossScores:
        score = scorer(self.model, self.diagnostics, self.encoder.tokenizer.pad_token_id,
                       getattr(self.encoder, "vision", None))
        return score(prompts, samples)

    def gradient_norms(self, row_sets: list[np.ndarray]) -> list[dict[str, float]]:
        batch = self.score(self.rollout_batch, old_log_probs=False)  # the loss uses the current log-probs, detached
        info = global_batch_info(batch, self.actor_config.loss_scale_factor)
        norms = []
        for rows in row_sets:
            task, regularisation = loss_part_gradients(self.model, batch.select(rows), self.actor_config, info,
                                                       self.micro_batch_size)
            norms.append({"task": gradient_norm(task), "reg": gradient_norm(regularisation)})
        return norms
