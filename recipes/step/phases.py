"""orch's phases of a training step, the same for every trainer. Between the rollout and any update, in this order
(each trainer calls them where its loop has the rollout, and times them itself):

    hooks        `run_hooks`       the step hooks on the unfiltered batch (the MI diagnostics)
    filter       `filter_rollout`  SNR-Aware Filtering (`recipes.stats.filtering.filter_step`) on the episode returns
    table        `dump_rollouts`   the rollout-batch table every `trainer.dump_every` steps
    empty step   `count_empty`     the filter kept no group: counted and logged (the trainer skips the update);
                 `empty_steps_stop` the reason the run stops after `trainer.max_empty_steps` such steps in a row

and at a step's end, `boundary_stop`: the reason a run ends there with the step checkpointed (the time limit, a
requested stop).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from recipes.config.schema import TrainConfig
    from recipes.diagnostics.hooks import StepContext
    from recipes.run.tracking import RunTracker


def run_hooks(hooks: Mapping[str, Any], context: StepContext) -> None:
    """Every step hook's `on_rollout` on the step's unfiltered batch; their metrics into `context.metrics`."""
    for hook in hooks.values():
        context.metrics.update(hook.on_rollout(context))


def filter_rollout(context: StepContext) -> tuple[np.ndarray, float]:
    """SNR-Aware Filtering of the step's groups by their episode returns: the keep-mask over the trajectories and
    the loss scale; the filter's metrics into `context.metrics`."""
    from recipes.stats import filtering

    cfg = context.cfg
    returns = np.array([t.episode_return for t in context.trajectories])
    keep, loss_scale, filter_metrics = filtering.filter_step(returns, context.group_ids, cfg.filter,
                                                             cfg.trainer.samples_per_prompt)
    context.metrics.update(filter_metrics)
    return keep, loss_scale


def dump_rollouts(context: StepContext, keep: np.ndarray, tracker: RunTracker) -> None:
    """The step's rollout-batch table (`recipes.stats.rollouts`, with the filter's `keep`) into the run's artifacts,
    every `trainer.dump_every` steps (0: never)."""
    from recipes.stats.rollout_stats import rollout_frame

    step, every = context.step, context.cfg.trainer.dump_every
    if every and step % every == 0:
        tracker.log_frame(rollout_frame(context.trajectories, context.generated, keep, step), "rollouts",
                          f"step_{step:04d}.parquet")


def count_empty(context: StepContext, keep: np.ndarray, empty_steps: int, log: logging.Logger) -> int:
    """The run's empty steps in a row after this step: 0 when the filter kept a group; otherwise one more, in the
    step's metrics (`rollout/empty_steps`) and a warning on `log` (the trainer's)."""
    if keep.any():
        return 0
    empty_steps += 1
    context.metrics["rollout/empty_steps"] = float(empty_steps)
    log.warning("step %d: the filter kept no group (%d in a row); skipping the update", context.step, empty_steps)
    return empty_steps


def empty_steps_stop(cfg: TrainConfig, empty_steps: int) -> str | None:
    """Why the run stops (status `stopped`) after `empty_steps` empty steps in a row, or None: at
    `trainer.max_empty_steps` of them (0: never)."""
    if cfg.trainer.max_empty_steps and empty_steps >= cfg.trainer.max_empty_steps:
        return (f"the filter kept no group for {empty_steps} consecutive steps (trainer.max_empty_steps); "
                "the batch has no reward variance left")
    return None


def boundary_stop(step: int, requested: bool, overrun: str | None) -> str | None:
    """Why a run ends at the end of `step` with that step checkpointed (status `preempted`), or None: the time limit
    (`overrun`, `recipes.runtime.time_limit.TimeLimit.would_overrun`: the next step would end past it), else a
    requested stop."""
    if overrun:
        return f"{overrun}; checkpoint at step {step}"
    if requested:
        return f"stop requested; checkpoint at step {step}"
    return None
