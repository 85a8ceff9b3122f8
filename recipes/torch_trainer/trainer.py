"""orch's own trainer, the `torch` backend's loop: one process, CPU or one GPU, veRL's algorithm math, SNR-Aware
Filtering. `train` reads top to bottom, and `train_step` is one step (the entry point,
`recipes.torch_trainer.backend.run`, opens the MLflow run and finds the checkpoint to resume from):

    setup      build (or load from cache) the warm-started policy, value model and reference, the hooks and the update
               settings (`setup`; what the run holds: `recipes.torch_trainer.state.Run`), resume from the checkpoint
               (or validate at step 0)
    each step  1 rollout      prompts x samples episodes through envs.run_episodes (all samples of a prompt share
                              its seed); DAPO's dynamic sampling gathers groups with variance; the whole batch as
                              token tensors, built once (hooks and the update share it)
               2 hooks        registered step hooks on the unfiltered batch (MI cross-scoring goes here)
               3 filter       SNR-Aware Filtering on episode returns, the rollout table; an empty batch skips the
                              update (2-3 and the stops at a step's end: `recipes.step.phases`, as on veRL)
               4 score        the kept rows: old (and reference) log-probs, values, advantages (veRL) x the filter's
                              loss scale -- `score_batch`, which the gradient split of the diagnostics also calls; a
                              float32 policy's old log-probs are the sampler's (`sampled_or_scored`)
               5 update       critic then actor, mini-batches of the kept trajectories only
               6 validate     every `val_every` steps on held-out seeds at temperature 0.5
               7 log, dump the rollout batch, checkpoint; stop on request at this boundary, or before a step that
                 would overrun `trainer.time_limit` (`recipes.runtime.time_limit.TimeLimit`)

A stop asked for inside a step (`recipes.runtime.stop`) ends steps 1-6 between decoded tokens or micro-batches: during
1-4 the step is dropped (the model is still the previous step's; hook states are rewound) and the checkpoint is the
previous step's; during 5 the models and optimisers are put back as the previous step left them
(`recipes.runtime.update_undo.UpdateUndo`: a copy kept while the update runs) and the step is dropped likewise; during
6 the step is kept and its validation runs first on resume.

Every metric is named where it is computed. Timings: `timing_s/<phase>`. Image observations (a vision-language
policy, `model=tiny_vl` or a Qwen2.5-VL folder) travel as frames beside the chats: the sampler, the batch
(`TrainBatch.images`) and the hooks feed them to the model (`recipes.policy.vision`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recipes.config.schema import TrainConfig
from recipes.diagnostics.hooks import StepContext
from recipes.diagnostics.registry import build_hooks
from recipes.policy.actor import (
    UpdateSettings,
    actor_config,
    batched_forward,
    state_values,
    token_log_probs,
    update_actor,
    update_critic,
)
from recipes.policy.algorithms import get_algorithm
from recipes.policy.batch import TrainBatch, build_batch, sampled_log_probs
from recipes.policy.chat import ChatEncoder
from recipes.policy.lora import trainable_parameters
from recipes.policy.models import count_parameters
from recipes.policy.sampler import BlindSampler, Sampler
from recipes.run.progress import PHASES, ProgressFile, TrainProgress, report, reporting
from recipes.run.tracking import PEAK_MEMORY_METRIC, RunTracker, peak_memory_gb
from recipes.runtime.result import TrainResult
from recipes.runtime.seeds import blinded_rows, seed_everything, train_prompt_seeds, validation_seeds
from recipes.runtime.stop import StopRequested, interruptible
from recipes.runtime.time_limit import TimeLimit
from recipes.runtime.update_undo import UpdateUndo
from recipes.stats.rollout_stats import VAL_SUCCESS, rollout_metrics, validation_metrics
from recipes.step import phases
from recipes.torch_trainer.policy_access import LocalPolicy
from recipes.torch_trainer.state import Models, Run
from recipes.torch_trainer.warmstart import model_folder

log = logging.getLogger(__name__)


@contextmanager
def timed(metrics: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall time of the block to `metrics["timing_s/<name>"]` (and show the phase in the progress file); under
    torch's profiler the block is the range `phase/<name>` (benchmarks/bench_step_limits.py --floor reads it)."""
    report(phase=name)
    start = time.perf_counter()
    try:
        with torch.profiler.record_function(f"phase/{name}"):
            yield
    except StopRequested as stop:  # name the phase a stop interrupted (the innermost one)
        stop.phase = stop.phase or name
        raise
    metrics[f"timing_s/{name}"] = metrics.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


# ------------------------------------------------------------------------------------------------------------
# Setup
# ------------------------------------------------------------------------------------------------------------


def setup(cfg: TrainConfig, tracker: RunTracker, checkpoint_dir: Path,
          should_stop: Callable[[], bool] | None = None) -> tuple[Run, dict[str, float]]:
    """Models (the warm start is trained once per input hash and cached), hooks, update settings; params and tags
    on the MLflow run. Returns the run and its setup figures (step 0 metrics of a fresh run)."""
    seed_everything(cfg.seed)
    started = time.perf_counter()
    algorithm = get_algorithm(cfg.algorithm.name)
    folder, warm_start = model_folder(cfg, should_stop)  # StopRequested: stopped in the warm start (kept per epoch)
    # again: a warm start trained here (the task's first cell) drew from the streams, one loaded from the cache did
    # not; the models' fresh heads and everything after them must not depend on which (test_warmstart)
    seed_everything(cfg.seed)
    models = Models(cfg, folder, algorithm.uses_critic)
    trainer = cfg.trainer
    settings = UpdateSettings(
        mini_batch_size=trainer.mini_batch_size, micro_batch_size=trainer.micro_batch_size, epochs=trainer.ppo_epochs,
        grad_clip=cfg.model.grad_clip, loss_scale_factor=trainer.max_response_tokens * cfg.task.env["max_turns"],
    )
    run = Run(cfg, tracker, checkpoint_dir, models, algorithm, build_hooks(cfg.hooks, cfg), settings,
              actor_config(cfg.algorithm, settings, trainer.samples_per_prompt))
    setup_seconds = time.perf_counter() - started
    tracker.log_run_config(cfg, checkpoint_dir)
    figures = {"setup/policy_parameters": count_parameters(models.policy),
               "setup/trainable_parameters": sum(p.numel() for p in trainable_parameters(models.policy)),
               "timing_s/setup": setup_seconds,
               **{f"warm_start/{k}": float(v) for k, v in warm_start.items() if isinstance(v, int | float)}}
    return run, figures


# ------------------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------------------


def train(
    cfg: TrainConfig, tracker: RunTracker, checkpoint_dir: Path, resumed: dict[str, Any] | None,
    should_stop: Callable[[], bool],
) -> TrainResult:
    """Set up, resume or validate at step 0, then step until done, stopped or asked to stop."""
    done = int(resumed["step"]) if resumed is not None else 0
    with reporting(ProgressFile(checkpoint_dir, cfg.trainer.total_steps, done)):
        return _train(cfg, tracker, checkpoint_dir, resumed, should_stop)


def _train(
    cfg: TrainConfig, tracker: RunTracker, checkpoint_dir: Path, resumed: dict[str, Any] | None,
    should_stop: Callable[[], bool],
) -> TrainResult:
    clock = TimeLimit(cfg.infra.time_limit)  # counted from here: the warm start and setup count too
    report(phase="warm start" if cfg.model.warm_start.enabled else "setup")
    try:
        run, metrics = setup(cfg, tracker, checkpoint_dir, should_stop)
    except StopRequested as stop:  # the warm start kept its completed epochs; the next attempt resumes there
        done = int(resumed["step"]) if resumed is not None else 0
        return TrainResult("preempted", done, tracker.run_id, f"{stop}; its completed epochs are kept")
    trainer = cfg.trainer
    try:
        with interruptible(should_stop):
            if resumed is not None:
                start_step = run.restore(resumed)
                if resumed.get("validation_pending"):  # a stop interrupted this step's validation: run it now
                    validate_step(run, start_step, {})
            else:
                start_step = 0
                if trainer.val_every:
                    validate_step(run, 0, metrics, log_now=False)
                tracker.log_metrics(metrics, step=0)
    except StopRequested:
        done = int(resumed["step"]) if resumed is not None else 0
        return TrainResult("preempted", done, tracker.run_id, f"stop requested during the validation at step {done}; "
                           + ("its checkpoint is kept" if resumed is not None else "nothing to keep"))

    status, reason, step = "finished", f"completed {trainer.total_steps} steps", start_step
    with TrainProgress(trainer.total_steps, start_step, enabled=cfg.infra.progress) as progress:
        for step in range(start_step + 1, trainer.total_steps + 1):
            overrun = clock.would_overrun()  # the stop at a step's end: the time limit, then a requested stop
            boundary = phases.boundary_stop(step - 1, should_stop(), overrun)
            if boundary:
                step -= 1
                status, reason = "preempted", boundary
                run.checkpoint(step)
                break
            report(step=step)
            started, before = time.monotonic(), run.counters()
            try:
                outcome = train_step(run, step, should_stop)
            except StopRequested as stop:  # before the validation: the models are step-1's; the step is dropped
                run.rewind(before)
                step -= 1
                status = "preempted"
                phase = PHASES.get(stop.phase or "gen", stop.phase)
                reason = f"stop requested during the {phase} of step {step + 1}; checkpoint at step {step}"
                run.checkpoint(step)
                break
            clock.took(time.monotonic() - started)
            report(done=step, phase="logging", success=outcome.metrics.get("rollout/success_rate"))
            tracker.log_metrics(outcome.metrics, step=step)
            if outcome.tags:
                tracker.set_tags(outcome.tags)
            progress.update(step, outcome.metrics)
            if not cfg.infra.progress:  # batch logs (SLURM) get one line per step instead of the live bar
                log.info("step %d/%d: success %.3f, kept %.2f, %.1fs", step, trainer.total_steps,
                         outcome.metrics["rollout/success_rate"], outcome.metrics.get("rollout/kept_ratio", 1.0),
                         outcome.metrics["timing_s/step"])
            if outcome.failure:  # logged for diagnosis, never checkpointed
                status, reason = "failed", outcome.failure
                break
            if outcome.validation_pending:  # the update is done; the validation runs first on resume
                status = "preempted"
                reason = f"stop requested during the validation of step {step}; checkpoint at step {step}"
                run.checkpoint(step, validation_pending=True)
                break
            if VAL_SUCCESS in outcome.metrics:
                run.keep_if_best(step)
            stop_reason = outcome.stop_reason or phases.empty_steps_stop(cfg, run.empty_steps)  # a hook's first
            if (trainer.save_every and step % trainer.save_every == 0) or step == trainer.total_steps or stop_reason:
                started = time.monotonic()
                run.checkpoint(step)
                clock.took(0.0, checkpoint=time.monotonic() - started)
            if stop_reason:
                status, reason = "stopped", stop_reason
                break
    return TrainResult(status=status, steps_done=step, mlflow_run_id=tracker.run_id, reason=reason)


# ------------------------------------------------------------------------------------------------------------
# One step
# ------------------------------------------------------------------------------------------------------------


@dataclass
class StepOutcome:
    """One step's metrics, the MLflow tags hooks asked for, and whether the run must stop (`stop_reason`) or has
    failed (`failure`)."""

    metrics: dict[str, float]
    tags: dict[str, str]
    stop_reason: str | None = None
    failure: str | None = None
    validation_pending: bool = False  # a stop interrupted the validation after the update


def train_step(run: Run, step: int, should_stop: Callable[[], bool] | None = None) -> StepOutcome:
    """One training step (see the module docstring); returns its metrics. A stop (`should_stop`) before the
    validation raises `StopRequested` out of the rollout, scoring, diagnostics or update (the update undone first);
    one during the validation ends it and says so (`validation_pending`)."""
    cfg, models, trainer = run.cfg, run.models, run.cfg.trainer
    seed_everything(cfg.seed, step)
    metrics: dict[str, float] = {}
    step_start = time.perf_counter()
    with interruptible(should_stop):
        context = rollout_and_score(run, step, metrics)
    batch = context.batch

    failure = None
    if batch is not None:  # 5 update: critic, then actor, over mini-batches of the kept trajectories
        trained = [(models.policy, models.policy_optimizer)]
        if models.critic is not None:
            trained.insert(0, (models.critic, models.critic_optimizer))
        undo = UpdateUndo(trained)
        try:
            with interruptible(should_stop if undo.kept else None):
                if models.critic is not None:
                    with timed(metrics, "update_critic"):
                        metrics.update(update_critic(models.critic, models.critic_optimizer, batch,
                                                     cfg.algorithm.cliprange_value, run.settings))
                with timed(metrics, "update_actor"):
                    metrics.update(update_actor(models.policy, models.policy_optimizer, batch, run.policy_config,
                                                run.settings))
        except StopRequested:  # the models and optimisers as step - 1 left them: the step is dropped
            undo.restore()
            raise
        del undo
        if not math.isfinite(metrics["actor/pg_loss"]):
            failure = f"non-finite policy loss at step {step}"

    # 6 validation on held-out seeds
    pending = False
    if trainer.val_every and step % trainer.val_every == 0 and failure is None:
        try:
            with interruptible(should_stop):
                validate_step(run, step, metrics, log_now=False)
        except StopRequested:
            pending = True
    metrics[PEAK_MEMORY_METRIC] = peak_memory_gb(trainer.device)
    metrics["timing_s/step"] = time.perf_counter() - step_start
    metrics["timing_s/diagnostics_share"] = metrics["timing_s/diagnostics"] / metrics["timing_s/step"]
    return StepOutcome(metrics, context.tags, context.stop_reason, failure, pending)


def rollout_and_score(run: Run, step: int, metrics: dict[str, float]) -> StepContext:
    """Steps 1-4 of a training step, which leave the model as it was: the rollout, the diagnostics, the filter and
    the scoring of the kept rows (`context.batch`, None when the filter kept nothing)."""
    cfg, models, trainer = run.cfg, run.models, run.cfg.trainer

    # 1 rollout: G prompts x K samples through the batched sampler, and the whole batch as tensors (built once)
    sampler = Sampler(models.policy, models.encoder, trainer.max_response_tokens, trainer.temperature,
                      trainer.max_context_tokens,  # a float32 policy's sampler keeps the old log-probs
                      keep_log_probs=next(models.policy.parameters()).dtype == torch.float32)
    if cfg.control.blind_from_step and step >= cfg.control.blind_from_step:
        # CONTROL: a planted template collapse (recipes.policy.sampler.BlindSampler) on the rows the shared rule picks
        # (each generation batch's G x K rows; an extra DAPO batch's rows are numbered from 0 again)
        rows = blinded_rows(trainer.prompts_per_step * trainer.samples_per_prompt, cfg.control.blind_strength,
                            cfg.seed, step)
        sampler = BlindSampler(sampler, rows)
    with timed(metrics, "gen"):
        trajectories, gen_metrics = collect_rollouts(cfg, sampler, step)
    metrics.update(gen_metrics)
    metrics.update(rollout_metrics(trajectories, sampler.generated, trainer.max_response_tokens))
    group_ids = np.array([t.seed for t in trajectories])
    frames = [t.images for t in trajectories] if any(t.images for t in trajectories) else None
    rollout_batch = build_batch(
        [t.messages for t in trajectories], [[turn.reward for turn in t.turns] for t in trajectories], group_ids,
        models.encoder, sampler.generated, frames,
    ).to(trainer.device)
    if sampler.reply_log_probs:  # the sampler's log-probs are the old log-probs (`sampled_or_scored`)
        rollout_batch.sampled_log_probs, rollout_batch.sampled_rows = sampled_log_probs(rollout_batch,
                                                                                        sampler.reply_log_probs)

    # 2 step hooks (diagnostics) on the unfiltered batch
    policy = LocalPolicy(models.policy, models.encoder, cfg.diagnostics, run.policy_config, trainer.micro_batch_size,
                         rollout_batch, lambda batch, **options: score_batch(run, batch, **options))
    context = StepContext(step=step, cfg=cfg, policy=policy, encoder=models.encoder, trajectories=trajectories,
                          group_ids=group_ids, generated=sampler.generated, metrics=metrics,
                          validation=run.validation)
    with timed(metrics, "diagnostics"):
        phases.run_hooks(run.hooks, context)

    # 3 SNR-Aware Filtering (whole groups, by reward variance), the rollout table, the empty step (no update)
    with timed(metrics, "filter"):
        keep, loss_scale = phases.filter_rollout(context)
    phases.dump_rollouts(context, keep, run.tracker)
    run.empty_steps = phases.count_empty(context, keep, run.empty_steps, log)
    if keep.any():
        # 4 score the kept rows (log-probs, values, advantages), scaled for the shrunken batch
        batch = score_batch(run, rollout_batch.select(keep).trimmed(), metrics)
        batch.advantages = batch.advantages * loss_scale
        mask = batch.loss_mask.bool()
        metrics["critic/advantages/mean"] = float(batch.advantages[mask].mean())
        metrics["critic/returns/mean"] = float(batch.returns[mask].mean())
        metrics["critic/score/mean"] = float(batch.episode_returns.mean())
        metrics["rollout/loss_scale"] = float(loss_scale)
        metrics["rollout/update_trajectories"] = float(len(batch))
        metrics["rollout/update_tokens"] = float(batch.loss_mask.sum())
        context.batch = batch
        with timed(metrics, "diagnostics"):
            for hook in run.hooks.values():
                metrics.update(hook.on_batch(context))
    return context


def score_batch(run: Run, batch: TrainBatch, metrics: dict[str, float] | None = None,
                old_log_probs: bool = True) -> TrainBatch:
    """`batch` with the old (unless `old_log_probs` is false) and reference log-probs, the values (PPO) and the run's
    advantages and returns (veRL's estimator), as a new batch; timings into `metrics` when given. The update and
    the gradient split of the diagnostics both score through here."""
    metrics = {} if metrics is None else metrics
    models, micro = run.models, run.cfg.trainer.micro_batch_size

    def log_probs(model: torch.nn.Module, rows: TrainBatch) -> torch.Tensor:
        return token_log_probs(model, rows)[0]

    scored = replace(batch)
    if old_log_probs:
        with timed(metrics, "old_log_prob"):
            scored.old_log_probs = sampled_or_scored(log_probs, models.policy, scored, micro)
    if models.reference is not None:
        with timed(metrics, "ref"), models.reference_weights():  # LoRA: the policy, adapters disabled
            scored.ref_log_probs = batched_forward(log_probs, models.reference, scored, micro)
    if models.critic is not None:
        with timed(metrics, "values"):
            scored.values = batched_forward(state_values, models.critic, scored, micro)
    with timed(metrics, "adv"):
        scored.advantages, scored.returns = run.algorithm.advantages(scored, run.cfg.algorithm)
    return scored


def sampled_or_scored(log_probs: Any, policy: torch.nn.Module, batch: TrainBatch, micro: int) -> torch.Tensor:
    """The old log-probs (T, L): the sampler's where it recorded a row's every reply under the row's own tokens
    (`batch.sampled_rows`: a float32 policy's rollout, drawn with the weights this step updates), the policy's
    scoring pass over the other rows (all of them when nothing was recorded; a blinded row's reply came from another
    chat). This is veRL's bypass mode (old_log_prob = rollout_log_prob: verl/trainer/ppo/rollout_corr_helper.py:1138,
    chosen at verl/trainer/ppo/ray_trainer.py:1575 by `algorithm.rollout_correction.bypass_mode`, veRL 0.9.1). veRL
    recomputes by default because its rollout engine's numbers differ from the trainer's (vLLM, bfloat16); here the
    sampler runs the same float32 model and the two agree to float tolerance (tests/recipes/policy/test_decode.py),
    so the pass is skipped, not changed."""
    if batch.sampled_rows is None or not batch.sampled_rows.any():
        return batched_forward(log_probs, policy, batch, micro)
    scores = batch.sampled_log_probs.clone()  # zero outside the loss tokens
    missing = ~batch.sampled_rows
    if missing.any():
        rows = torch.as_tensor(np.flatnonzero(missing), device=scores.device)
        scored = batched_forward(log_probs, policy, batch.select(missing), micro)
        scores[rows, : scored.shape[1]] = scored
    return scores


def validate_step(run: Run, step: int, metrics: dict[str, float], log_now: bool = True) -> None:
    """Validate the policy at `step` into `run.validation` and `metrics`; `log_now`: log them at `step` and keep
    the policy if it is the best so far (a validation a stop interrupted, run on resume)."""
    with timed(metrics, "val"):
        run.validation = validate(run.cfg, run.models.policy, run.models.encoder, step)
    metrics.update(run.validation)
    if log_now:
        run.tracker.log_metrics(metrics, step=step)
        run.keep_if_best(step)


# ------------------------------------------------------------------------------------------------------------
# Rollout and validation
# ------------------------------------------------------------------------------------------------------------


def play(cfg: TrainConfig, sampler: Sampler, seeds: list[int], samples: int) -> list[Any]:
    """`samples` episodes per seed (consecutive; same start state, own dynamics randomness), one batched sampler."""
    from envs import run_episodes

    return run_episodes(
        cfg.task.name, cfg.task.env, [seed for seed in seeds for _ in range(samples)], sampler,
        dynamics_seeds=[sample for _ in seeds for sample in range(samples)],  # independent slips per sample
    )


def collect_rollouts(cfg: TrainConfig, sampler: Sampler, step: int) -> tuple[list[Any], dict[str, float]]:
    """The step's trajectories, grouped by prompt (consecutive). With dynamic sampling (DAPO), the groups with
    reward variance of up to 1 + `max_extra_gen_batches` generation batches of fresh prompts, gathered and cut to
    `prompts_per_step` (`recipes.stats.dynamic_sampling.gather_groups`, the rule of every backend)."""
    from recipes.stats.dynamic_sampling import GEN_BATCHES, gather_groups

    prompts, samples = cfg.trainer.prompts_per_step, cfg.trainer.samples_per_prompt
    if not cfg.algorithm.dynamic_sampling:
        return play(cfg, sampler, train_prompt_seeds(cfg.seed, step, prompts), samples), {GEN_BATCHES: 1.0}

    def batches() -> Any:
        for extra in range(cfg.algorithm.max_extra_gen_batches + 1):
            trajectories = play(cfg, sampler, train_prompt_seeds(cfg.seed, step, prompts, extra), samples)
            yield trajectories, [t.episode_return for t in trajectories], [t.seed for t in trajectories]

    gathered = gather_groups(batches(), prompts, cfg.algorithm.max_extra_gen_batches + 1)
    kept = [t for trajectories, keep in gathered.parts for t, k in zip(trajectories, keep, strict=True) if k]
    return kept, gathered.metrics()


def validate(cfg: TrainConfig, policy: torch.nn.Module, encoder: ChatEncoder, step: int) -> dict[str, float]:
    """One episode per validation seed at `val_temperature` (`recipes.stats.rollout_stats.validation_metrics`)."""
    seed_everything(cfg.seed, step, 1)
    sampler = Sampler(policy, encoder, cfg.trainer.max_response_tokens, cfg.trainer.val_temperature,
                      cfg.trainer.max_context_tokens)
    trajectories = play(cfg, sampler, validation_seeds(cfg.trainer.val_size), 1)
    return validation_metrics(trajectories, sampler.generated)
