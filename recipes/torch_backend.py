"""The `torch` trainer backend: one process, CPU or one GPU, veRL's algorithm math, SNR-Aware Filtering.

`run(cfg, should_stop)` is the whole training run, readable top to bottom:

    setup      validate the config, open/attach the MLflow run, build (or load from cache) the warm-started
               policy, value model and reference, resume from the latest checkpoint
    each step  1 rollout      prompts x samples episodes through envs.run_episodes (all samples of a prompt share
                              its seed); DAPO's dynamic sampling tops up zero-variance groups
               2 hooks        registered step hooks on the unfiltered batch (MI cross-scoring goes here)
               3 filter       recipes.filtering.filter_groups on episode returns; an empty batch skips the step
               4 tensors      kept trajectories -> token tensors (loss only on generated tokens)
               5 log-probs    old (and reference) log-probs, values for PPO
               6 advantages   veRL estimator of the algorithm, x the filter's loss scale
               7 update       critic then actor, mini-batches of the kept trajectories only
               8 validate     every `val_every` steps on held-out seeds at temperature 0.5
               9 log, dump the rollout batch, checkpoint; stop on request at this boundary

Every metric is named where it is computed. Timings: `timing_s/<phase>`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from orchlib.errors import OrchError
from recipes.actor import (
    UpdateSettings,
    actor_config,
    batched_forward,
    state_values,
    token_log_probs,
    update_actor,
    update_critic,
)
from recipes.algorithms import get_algorithm
from recipes.backends import TrainResult, register_backend
from recipes.batch import build_batch
from recipes.chat import ChatEncoder
from recipes.checkpoint import latest_checkpoint, load_checkpoint, restore_rng_states, save_checkpoint
from recipes.config import filter_config_from, flatten_config
from recipes.hooks import StepContext, build_hooks
from recipes.models import base_model_folder, count_parameters, load_critic, load_policy, load_tokenizer
from recipes.progress import TrainProgress
from recipes.sampler import Sampler
from recipes.seeds import seed_everything, train_prompt_seeds, validation_seeds
from recipes.tracking import RunTracker, tracking_uri

log = logging.getLogger(__name__)


@contextmanager
def timed(metrics: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall time of the block to `metrics["timing_s/<name>"]`."""
    start = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = metrics.get(f"timing_s/{name}", 0.0) + time.perf_counter() - start


# ------------------------------------------------------------------------------------------------------------
# Rollout
# ------------------------------------------------------------------------------------------------------------


def play(cfg: DictConfig, sampler: Sampler, seeds: list[int], samples: int) -> list[Any]:
    """`samples` episodes per seed (consecutive; same start state, own dynamics randomness), one batched sampler."""
    from envs import run_episodes

    env_config = OmegaConf.to_container(cfg.task.env, resolve=True)
    return run_episodes(
        cfg.task.name, env_config, [seed for seed in seeds for _ in range(samples)], sampler,
        dynamics_seeds=[sample for _ in seeds for sample in range(samples)],  # independent slips per sample
    )


def collect_rollouts(cfg: DictConfig, sampler: Sampler, step: int) -> tuple[list[Any], dict[str, float]]:
    """The step's trajectories, grouped by prompt (consecutive). With dynamic sampling (DAPO), zero-variance groups
    are replaced by groups from up to `max_extra_gen_batches` extra generation batches of fresh prompts."""
    from recipes.filtering import group_stats

    prompts, samples = cfg.trainer.prompts_per_step, cfg.trainer.samples_per_prompt
    trajectories = play(cfg, sampler, train_prompt_seeds(cfg.seed, step, prompts), samples)
    metrics = {"rollout/gen_batches": 1.0}
    if not cfg.algorithm.dynamic_sampling:
        return trajectories, metrics
    kept: list[Any] = []
    for extra in range(cfg.algorithm.max_extra_gen_batches + 1):
        if extra:
            trajectories = play(cfg, sampler, train_prompt_seeds(cfg.seed, step, prompts, extra), samples)
            metrics["rollout/gen_batches"] += 1
        stats = group_stats([t.episode_return for t in trajectories], [t.seed for t in trajectories])
        for group, zero in enumerate(stats.zero_variance):
            if not zero:
                kept.extend(trajectories[group * samples : (group + 1) * samples])
        if len(kept) >= prompts * samples:
            break
    metrics["rollout/dynamic_sampling_groups"] = len(kept) / samples
    return (kept[: prompts * samples] if kept else trajectories), metrics


def rollout_metrics(trajectories: list[Any], generated: dict[str, list[int]], cap: int) -> dict[str, float]:
    """Reward, success, format and length statistics of the (unfiltered) batch."""
    returns = np.array([t.episode_return for t in trajectories])
    lengths = np.array([sum(len(generated.get(turn.response, ())) for turn in t.turns) for t in trajectories])
    replies = [generated.get(turn.response, ()) for t in trajectories for turn in t.turns]
    turns = [turn for t in trajectories for turn in t.turns]
    return {
        "rollout/reward_mean": float(returns.mean()),
        "rollout/reward_std": float(returns.std()),
        "rollout/reward_max": float(returns.max()),
        "rollout/reward_min": float(returns.min()),
        "rollout/success_rate": float(np.mean([t.success for t in trajectories])),
        "rollout/format_validity": float(np.mean([turn.format_valid for turn in turns])),
        "rollout/num_turns_mean": float(np.mean([t.num_turns for t in trajectories])),
        "rollout/trajectories": float(len(trajectories)),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": float(np.mean([len(reply) >= cap for reply in replies])),
    }


def rollout_frame(trajectories: list[Any], generated: dict[str, list[int]], keep: np.ndarray, step: int) -> Any:
    """The project's rollout-batch table (analysis/rollouts.py) for this step: one row per trajectory."""
    import pandas as pd

    rows, seen = [], Counter()
    for trajectory, kept in zip(trajectories, keep, strict=True):
        row = trajectory.to_record()
        row.update(
            step=step,
            sample=seen[trajectory.seed],
            response_length=sum(len(generated.get(turn.response, ())) for turn in trajectory.turns),
            kept=bool(kept),
        )
        seen[trajectory.seed] += 1
        rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------------------


def validate(cfg: DictConfig, policy: torch.nn.Module, encoder: ChatEncoder, step: int) -> dict[str, float]:
    """One episode per validation seed at `val_temperature`: success, return, format validity, reply length."""
    seed_everything(cfg.seed, step, 1)
    sampler = Sampler(policy, encoder, cfg.trainer.max_response_tokens, cfg.trainer.val_temperature,
                      cfg.trainer.max_context_tokens)
    trajectories = play(cfg, sampler, validation_seeds(cfg.trainer.val_size), 1)
    turns = [turn for t in trajectories for turn in t.turns]
    return {
        "val/success_rate": float(np.mean([t.success for t in trajectories])),
        "val/reward_mean": float(np.mean([t.episode_return for t in trajectories])),
        "val/format_validity": float(np.mean([turn.format_valid for turn in turns])),
        "val/response_length": float(np.mean(
            [sum(len(sampler.generated.get(turn.response, ())) for turn in t.turns) for t in trajectories])),
        "val/num_turns_mean": float(np.mean([t.num_turns for t in trajectories])),
    }


# ------------------------------------------------------------------------------------------------------------
# Setup
# ------------------------------------------------------------------------------------------------------------


def check_config(cfg: DictConfig) -> None:
    """Everything that can be checked before any work (OrchError with the key and the valid choices)."""
    from envs.registry import build_config

    get_algorithm(cfg.algorithm.name)
    filter_config_from(cfg)
    build_config(cfg.task.name, OmegaConf.to_container(cfg.task.env, resolve=True))
    build_hooks(list(cfg.hooks), cfg)
    if cfg.trainer.device.startswith("cuda") and not torch.cuda.is_available():
        raise OrchError(f"config key trainer.device: {cfg.trainer.device!r} but no CUDA device is available")


def model_folder(cfg: DictConfig) -> tuple[Path, dict[str, Any]]:
    """The folder the policy starts from (warm-started when enabled) and the warm start's report."""
    from recipes.warmstart import warm_start_folder

    base = base_model_folder(cfg.model)
    if not cfg.model.warm_start.enabled:
        return base, {}
    env_config = OmegaConf.to_container(cfg.task.env, resolve=True)
    return warm_start_folder(cfg.model, base, cfg.task.name, env_config, cfg.trainer.device)


class Models:
    """Policy, optional value model and frozen reference, their optimisers, and the chat encoder."""

    def __init__(self, cfg: DictConfig, folder: Path, uses_critic: bool) -> None:
        device, dtype = cfg.trainer.device, cfg.model.dtype
        self.encoder = ChatEncoder(load_tokenizer(folder))
        self.policy = load_policy(folder, dtype, device)
        self.policy_optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.model.actor_lr, weight_decay=cfg.model.weight_decay
        )
        self.critic = load_critic(folder, dtype, device) if uses_critic else None
        self.critic_optimizer = (
            torch.optim.AdamW(self.critic.parameters(), lr=cfg.model.critic_lr, weight_decay=cfg.model.weight_decay)
            if self.critic is not None else None
        )
        self.reference = load_policy(folder, dtype, device).eval().requires_grad_(False) if cfg.algorithm.use_kl \
            else None

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


# ------------------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------------------


def available_cpus() -> int:
    """CPU cores this run may use: `$ORCH_CPUS` (set by the local sweep executor to the cell's share), else
    `$SLURM_CPUS_PER_TASK`, else every core this process may run on."""
    for name in ("ORCH_CPUS", "SLURM_CPUS_PER_TASK"):
        if os.environ.get(name, "").isdigit():
            return max(1, int(os.environ[name]))
    return len(os.sched_getaffinity(0))


@register_backend("torch")
def run(cfg: DictConfig, should_stop: Callable[[], bool] | None = None) -> TrainResult:
    """Train `cfg` (see the module docstring). `should_stop` is polled at step boundaries: when it returns True the
    run checkpoints and returns status 'preempted'."""
    check_config(cfg)
    should_stop = should_stop or (lambda: False)
    trainer = cfg.trainer
    torch.set_num_threads(int(trainer.threads or available_cpus()))

    checkpoint_dir = Path(trainer.checkpoint_dir) if trainer.checkpoint_dir else None
    latest = latest_checkpoint(checkpoint_dir) if checkpoint_dir and trainer.resume == "auto" else None
    resumed = load_checkpoint(latest) if latest else None
    if resumed and cfg.mlflow.run_id and cfg.mlflow.run_id != resumed["mlflow_run_id"]:
        raise OrchError(
            f"config key mlflow.run_id: {cfg.mlflow.run_id} but the checkpoint in {checkpoint_dir} belongs to run "
            f"{resumed['mlflow_run_id']}; use another trainer.checkpoint_dir or trainer.resume=never"
        )
    tracker = RunTracker(
        tracking_uri(cfg.mlflow.tracking_uri), cfg.mlflow.experiment_name,
        run_id=cfg.mlflow.run_id or (resumed["mlflow_run_id"] if resumed else None), run_name=cfg.mlflow.run_name,
    )
    checkpoint_dir = checkpoint_dir or Path("checkpoints") / tracker.run_id
    try:
        result = train(cfg, tracker, checkpoint_dir, resumed, should_stop)
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.set_tags({"orch.status": result.status, "orch.reason": result.reason})
    tracker.end({"finished": "FINISHED", "stopped": "FINISHED", "preempted": "KILLED", "failed": "FAILED"}[
        result.status])
    return result


def train(
    cfg: DictConfig, tracker: RunTracker, checkpoint_dir: Path, resumed: dict[str, Any] | None,
    should_stop: Callable[[], bool],
) -> TrainResult:
    trainer = cfg.trainer
    algorithm = get_algorithm(cfg.algorithm.name)
    filter_config = filter_config_from(cfg)
    hooks = build_hooks(list(cfg.hooks), cfg)

    # --- models (the warm start is trained once per input hash and cached) ---
    seed_everything(cfg.seed)
    started = time.perf_counter()
    folder, warm_start = model_folder(cfg)
    models = Models(cfg, folder, algorithm.uses_critic)
    settings = UpdateSettings(
        mini_batch_size=trainer.mini_batch_size, micro_batch_size=trainer.micro_batch_size, epochs=trainer.ppo_epochs,
        grad_clip=cfg.model.grad_clip, loss_scale_factor=trainer.max_response_tokens * cfg.task.env.max_turns,
    )
    policy_config = actor_config(cfg.algorithm, settings, trainer.samples_per_prompt)
    setup_seconds = time.perf_counter() - started

    # --- bookkeeping: params once, resume state ---
    tracker.log_params(flatten_config(cfg))
    tracker.set_tags({"task": cfg.task.name, "algorithm": cfg.algorithm.name, "model": cfg.model.name,
                      "backend": "torch", "filter": cfg.filter.name, "orch.checkpoint_dir": str(checkpoint_dir)})
    tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
    start_step, empty_steps, validation = 0, 0, {}  # validation: the latest val/* metrics (hooks read them)
    if resumed is not None:
        models.load_state_dict(resumed)
        for name, hook in hooks.items():
            hook.load_state_dict(resumed["hooks"].get(name, {}))
        restore_rng_states(resumed["rng"])
        start_step, empty_steps, validation = resumed["step"], resumed["empty_steps"], resumed["validation"]
        replayed = tracker.last_logged_step("timing_s/step")
        if replayed is not None and replayed > start_step:
            log.warning("steps %d..%d were logged after the last checkpoint and are re-run", start_step + 1, replayed)
            tracker.set_tags({"orch.replayed_steps": f"{start_step + 1}-{replayed}"})
    else:
        setup = {"setup/policy_parameters": count_parameters(models.policy), "timing_s/setup": setup_seconds}
        setup.update({f"warm_start/{k}": float(v) for k, v in warm_start.items() if isinstance(v, int | float)})
        if trainer.val_every:
            with timed(setup, "val"):
                validation = validate(cfg, models.policy, models.encoder, 0)
            setup.update(validation)
        tracker.log_metrics(setup, step=0)

    def checkpoint(step: int) -> None:
        hook_states = {name: hook.state_dict() for name, hook in hooks.items()}
        save_checkpoint(checkpoint_dir, step, {
            **models.state_dict(), "hooks": hook_states, "empty_steps": empty_steps, "validation": validation,
            "mlflow_run_id": tracker.run_id, "config": OmegaConf.to_yaml(cfg, resolve=True),
        })

    status, reason, step = "finished", f"completed {trainer.total_steps} steps", start_step
    progress = TrainProgress(trainer.total_steps, start_step, enabled=trainer.progress)
    with progress:
        for step in range(start_step + 1, trainer.total_steps + 1):
            if should_stop():
                step -= 1
                status, reason = "preempted", f"stop requested; checkpoint at step {step}"
                checkpoint(step)
                break
            seed_everything(cfg.seed, step)
            metrics: dict[str, float] = {}
            step_start = time.perf_counter()

            # 1 rollout: G prompts x K samples through the batched sampler
            sampler = Sampler(models.policy, models.encoder, trainer.max_response_tokens, trainer.temperature,
                              trainer.max_context_tokens)
            with timed(metrics, "gen"):
                trajectories, gen_metrics = collect_rollouts(cfg, sampler, step)
            metrics.update(gen_metrics)
            metrics.update(rollout_metrics(trajectories, sampler.generated, trainer.max_response_tokens))
            group_ids = np.array([t.seed for t in trajectories])
            returns = np.array([t.episode_return for t in trajectories])

            # 2 step hooks (diagnostics) on the unfiltered batch
            context = StepContext(step=step, cfg=cfg, policy=models.policy, encoder=models.encoder,
                                  trajectories=trajectories, group_ids=group_ids, generated=sampler.generated,
                                  metrics=metrics, validation=validation, reference=models.reference,
                                  critic=models.critic, actor_config=policy_config)
            with timed(metrics, "diagnostics"):
                for hook in hooks.values():
                    metrics.update(hook.on_rollout(context))

            # 3 SNR-Aware Filtering (whole groups, by reward variance)
            with timed(metrics, "filter"):
                if filter_config.strategy == "none" and trainer.samples_per_prompt < 2:
                    keep, loss_scale = np.ones(len(trajectories), dtype=bool), 1.0
                else:
                    from recipes.filtering import filter_groups

                    filtered = filter_groups(returns, group_ids, filter_config)
                    keep, loss_scale = filtered.keep_samples, filtered.loss_scale
                    metrics.update(filtered.metrics)
            if trainer.dump_every and step % trainer.dump_every == 0:
                tracker.log_frame(rollout_frame(trajectories, sampler.generated, keep, step), "rollouts",
                                  f"step_{step:04d}.parquet")

            if not keep.any():
                empty_steps += 1
                metrics["rollout/empty_steps"] = float(empty_steps)
                log.warning("step %d: the filter kept no group (%d in a row); skipping the update", step, empty_steps)
            else:
                empty_steps = 0
                kept = [t for t, k in zip(trajectories, keep, strict=True) if k]

                # 4 tensors: whole trajectories, loss only on generated tokens, turn rewards on their last token
                batch = build_batch(
                    [t.messages for t in kept], [[turn.reward for turn in t.turns] for t in kept],
                    group_ids[keep], models.encoder, sampler.generated,
                ).to(trainer.device)

                # 5 log-probs of the sampling policy (and the reference), values
                with timed(metrics, "old_log_prob"):
                    batch.old_log_probs = batched_forward(
                        lambda model, micro: token_log_probs(model, micro)[0], models.policy, batch,
                        trainer.micro_batch_size)
                if models.reference is not None:
                    with timed(metrics, "ref"):
                        batch.ref_log_probs = batched_forward(
                            lambda model, micro: token_log_probs(model, micro)[0], models.reference, batch,
                            trainer.micro_batch_size)
                if models.critic is not None:
                    with timed(metrics, "values"):
                        batch.values = batched_forward(state_values, models.critic, batch, trainer.micro_batch_size)

                # 6 advantages (veRL), scaled for the shrunken batch
                with timed(metrics, "adv"):
                    batch.advantages, batch.returns = algorithm.advantages(batch, cfg.algorithm)
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
                    for hook in hooks.values():
                        metrics.update(hook.on_batch(context))

                # 7 update: critic, then actor, over mini-batches of the kept trajectories
                if models.critic is not None:
                    with timed(metrics, "update_critic"):
                        metrics.update(update_critic(models.critic, models.critic_optimizer, batch,
                                                     cfg.algorithm.cliprange_value, settings))
                with timed(metrics, "update_actor"):
                    metrics.update(update_actor(models.policy, models.policy_optimizer, batch, policy_config,
                                                settings))
                if not math.isfinite(metrics["actor/pg_loss"]):
                    status, reason = "failed", f"non-finite policy loss at step {step}"

            # 8 validation on held-out seeds
            if trainer.val_every and step % trainer.val_every == 0 and status != "failed":
                with timed(metrics, "val"):
                    validation = validate(cfg, models.policy, models.encoder, step)
                metrics.update(validation)
            metrics["timing_s/step"] = time.perf_counter() - step_start
            metrics["timing_s/diagnostics_share"] = metrics["timing_s/diagnostics"] / metrics["timing_s/step"]

            # 9 log, checkpoint, stop conditions
            tracker.log_metrics(metrics, step=step)
            if context.tags:
                tracker.set_tags(context.tags)
            progress.update(step, metrics)
            if not trainer.progress:  # batch logs (SLURM) get one line per step instead of the live bar
                log.info("step %d/%d: success %.3f, kept %.2f, %.1fs", step, trainer.total_steps,
                         metrics["rollout/success_rate"], metrics.get("rollout/kept_ratio", 1.0),
                         metrics["timing_s/step"])
            if status == "failed":  # logged for diagnosis, never checkpointed
                break
            stop_now = empty_steps >= trainer.max_empty_steps or context.stop_reason is not None
            if (trainer.save_every and step % trainer.save_every == 0) or step == trainer.total_steps or stop_now:
                checkpoint(step)
            if empty_steps >= trainer.max_empty_steps:
                status, reason = "stopped", (
                    f"the filter kept no group for {empty_steps} consecutive steps (trainer.max_empty_steps); "
                    "the batch has no reward variance left")
                break
            if context.stop_reason is not None:
                status, reason = "stopped", context.stop_reason
                break
    return TrainResult(status=status, steps_done=step, mlflow_run_id=tracker.run_id, reason=reason)
