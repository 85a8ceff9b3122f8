"""orch's trainer on veRL: veRL's own PPO loop (the legacy `RayPPOTrainer` of veRL 0.9.1) with orch's pieces in.

One step of `RayPPOTrainer.fit` (verl/trainer/ppo/ray_trainer.py) and where orch plugs in:

    generate_sequences        the `orch_env` agent loop plays every environment (recipes.verl.agent_loop)
    _balance_batch            the rollout with its rewards, before any log-prob, value or update:
                                * each turn's reward on the last token of its reply (as the torch backend)
                                * DAPO's dynamic sampling: zero-variance groups replaced by fresh prompts
                                * the rollout statistics (recipes.stats.rollout_stats) and the step hooks on the unfiltered
                                  batch (the `collapse` diagnostics, cross-scored through the actor workers)
                                * SNR-Aware Filtering (recipes.stats.filtering.filter_groups): the batch shrinks to the kept
                                  trajectories, padded with no-op groups to the row multiple veRL's dispatch needs
                                * the rollout-batch table (recipes.stats.rollouts) every `dump_every` steps
    old_log_prob, values, advantages (veRL)
    _update_critic, _update_actor   skipped when the filter kept nothing; advantages x the filter's loss scale
    _save_checkpoint          veRL's checkpoint plus orch's state (empty steps, latest validation, hook states)
    _stop_profiling           the step is done: a requested stop (SIGUSR2/SIGTERM: the stop file) or a decided
                              one (empty steps, the collapse alarm) checkpoints it; the run ends once it is logged
    (inside a step)           a stop requested before the step's update drops the step (`_stop_inside_step`): the
                              agent loops end their episodes at the next turn, and the trainer checks after the
                              rollout, after the diagnostics and before the update, rewinds to the previous step's
                              end and checkpoints that
    _validate                 orch's validation metrics (`val/*`) on held-out seeds; a new peak of validation
                              success keeps the step's actor checkpoint as the run's best (`keep_if_best`); a stop
                              requested during it ends its episodes at the next turn and drops it (no `val/*`);
                              the step, whose update is done, is checkpointed and its validation runs first on
                              resume
    logger.log                every metric to the cell's MLflow run (orch's names override veRL's where both exist)
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from recipes.run.progress import ProgressFile, report, reporting
from recipes.run.tracking import PEAK_MEMORY_METRIC
from recipes.runtime.checkpoint import VERL_ITERATION_FILE as ITERATION_FILE
from recipes.runtime.checkpoint import VERL_STATE_FILE as STATE_FILE
from recipes.runtime.time_limit import TimeLimit
from recipes.verl.agent_loop import blind_marks, train_config

log = logging.getLogger("orch.verl")
SCORE_ROWS = 256  # (prompt, sample) pairs per actor-worker call when cross-scoring naively


class Stop(Exception):  # noqa: N818  (a control-flow signal, not an error)
    """Ends `fit` at a step boundary: `status` preempted (a stop was requested) or stopped (the run decided)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class WorkerPolicy:
    """`recipes.diagnostics.hooks.PolicyAccess` on veRL: the policy lives in the actor workers, so a hook's questions
    go to the trainer's worker calls (`OrchPPOTrainer.cross_score`, `OrchPPOTrainer.gradient_norms` over the step's
    unfiltered `batch`)."""

    def __init__(self, trainer: OrchPPOTrainer, batch: DataProto) -> None:
        self.trainer, self.batch = trainer, batch

    def cross_score(self, prompts: list[Any], samples: list[list[int]]) -> Any:
        return self.trainer.cross_score(prompts, samples)

    def gradient_norms(self, row_sets: list[np.ndarray]) -> list[dict[str, float]]:
        return self.trainer.gradient_norms(self.batch, row_sets)


def filtered_step(trainer: Any, trajectories: list, generated: dict[str, list[int]], policy: Any) -> np.ndarray:
    """orch's step on a rollout, one body for both of veRL's trainers (`OrchPPOTrainer._orch_step`,
    `recipes.verl.v1.OrchV1Trainer.after_rollout`): rollout statistics, the step hooks (the MI diagnostics) through
    `policy`, a stop inside the step, SNR-Aware Filtering (`recipes.stats.filtering.filter_step`), the rollout table,
    and the empty-step bookkeeping. Writes into `trainer.step_metrics` / `step_tags`; sets `advantage_scale`,
    `skip_update`, `empty_steps` and `pending_stop`. Returns the keep-mask over `trajectories` (all False: an empty
    step, whose rows the caller still passes through veRL's phases without an update)."""
    from recipes.diagnostics.hooks import StepContext
    from recipes.stats import filtering
    from recipes.stats.rollout_stats import rollout_frame, rollout_metrics

    step, cfg, out = int(trainer.global_steps), trainer.cfg, trainer.step_metrics
    group_ids = np.array([t.seed for t in trajectories])
    returns = np.array([t.episode_return for t in trajectories])
    out.update(rollout_metrics(trajectories, generated, cfg.trainer.max_response_tokens))

    started = time.perf_counter()
    report(phase="diagnostics")
    context = StepContext(step=step, cfg=cfg, policy=policy, encoder=trainer.encoder, trajectories=trajectories,
                          group_ids=group_ids, generated=generated, metrics=out, validation=trainer.validation)
    for hook in trainer.hooks.values():
        out.update(hook.on_rollout(context))
    trainer.step_tags.update(context.tags)
    if context.stop_reason:
        trainer.pending_stop = Stop("stopped", context.stop_reason)
    out["timing_s/diagnostics"] = time.perf_counter() - started
    trainer._stop_inside_step("diagnostics")

    started = time.perf_counter()
    report(phase="filter")
    keep, loss_scale, filter_metrics = filtering.filter_step(returns, group_ids, cfg.filter,
                                                             cfg.trainer.samples_per_prompt)
    out.update(filter_metrics)
    if cfg.trainer.dump_every and step % cfg.trainer.dump_every == 0:
        trainer.tracker.log_frame(rollout_frame(trajectories, generated, keep, step), "rollouts",
                                  f"step_{step:04d}.parquet")
    if keep.any():
        trainer.empty_steps = 0
        trainer.advantage_scale = loss_scale
        out["rollout/loss_scale"] = float(loss_scale)
    else:
        trainer.empty_steps += 1
        trainer.skip_update = True
        out["rollout/empty_steps"] = float(trainer.empty_steps)
        log.warning("step %d: the filter kept no group (%d in a row); skipping the update", step,
                    trainer.empty_steps)
        if cfg.trainer.max_empty_steps and trainer.empty_steps >= cfg.trainer.max_empty_steps:  # 0: never
            trainer.pending_stop = Stop("stopped", (
                f"the filter kept no group for {trainer.empty_steps} consecutive steps (trainer.max_empty_steps); "
                "the batch has no reward variance left"))
    out["timing_s/filter"] = time.perf_counter() - started
    return keep


def logged_metrics(trainer: Any, metrics: dict[str, float], in_step: bool) -> dict[str, float]:
    """What both trainers log for one veRL log call: a step's log gets orch's step metrics (over veRL's of the same
    name), the step's wall time and the largest actor worker's peak memory (Table 5's memory column; veRL's loops do
    not log it); names made MLflow-safe, values not finite dropped."""
    if in_step:
        metrics.update(trainer.step_metrics)
        metrics["timing_s/step"] = time.perf_counter() - trainer._step_started
        metrics["timing_s/diagnostics_share"] = metrics.get("timing_s/diagnostics", 0.0) / metrics["timing_s/step"]
        metrics[PEAK_MEMORY_METRIC] = max(trainer.actor_rollout_wg.orch_peak_memory_gb())
    return {_metric_name(key): value for key, value in metrics.items() if value is not None and math.isfinite(value)}


class OrchPPOTrainer(RayPPOTrainer):
    """veRL's PPO trainer with orch's filter, diagnostics, metrics and stop control (see the module docstring).

    `orch` (a mapping): run_id and tracking_uri of the cell's MLflow run, stop_file (its existence requests a stop),
    started_file (written as the loop begins), logged_until (the last step already in MLflow: steps re-run after a
    resume are not logged again), started_at (the driver's start, wall-clock seconds: `trainer.time_limit` counts
    from it).
    """

    TRAINER = "legacy"  # `verl.trainer`, written into orch's state file

    def __init__(self, *args: Any, orch: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from recipes.diagnostics.registry import build_hooks
        from recipes.policy.chat import ChatEncoder
        from recipes.run.tracking import RunTracker

        self.cfg = train_config(self.config)
        self.orch = orch
        # `trainer.time_limit`, counted from the driver's start (before the warm start and Ray's start-up)
        self.time_limit = TimeLimit(self.cfg.infra.time_limit, time.time() - orch.get("started_at", time.time()))
        self.tracker = RunTracker(orch["tracking_uri"], self.cfg.infra.mlflow.experiment_name, run_id=orch["run_id"])
        self.encoder = ChatEncoder(self.tokenizer)
        self.hooks = build_hooks(self.cfg.hooks, self.cfg)
        self.empty_steps = 0
        self.validation: dict[str, float] = {}
        self.best: dict[str, float] = {}  # {"step", "success"} of the checkpoint kept in <checkpoint_dir>/best
        self.step_metrics: dict[str, float] = {}  # orch's metrics of the step, logged over veRL's of the same name
        self.step_tags: dict[str, str] = {}
        self.pending_stop: Stop | None = None
        self.step_end: dict[str, Any] = {}  # the state at the end of the last step (`resume_point`)
        self.loader_state: Any = None  # the dataloader state a rewound checkpoint saves instead of the current one
        self.skip_update = False
        self.advantage_scale = 1.0
        self._step_started = 0.0
        self._in_step = False  # between `_start_profiling` and `_stop_profiling` (veRL validates before its loop too)
        self.validation_pending = False  # a stop cut this step's validation short: the resume runs it first
        self._before_training = False  # `_validate` ran as veRL's validation before training: its log is val/* only

    # -- the loop ------------------------------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """veRL's loop with orch's metric sink; returns how the run ended."""
        from recipes.verl.patches import tracking_sink

        folder = Path(self.config.trainer.default_local_dir).parent  # orch's checkpoint folder (veRL's is verl/)
        if self.orch.get("started_file"):  # from here a stop is read by the loop (before it, the driver ends Ray)
            Path(self.orch["started_file"]).touch()
        try:
            with tracking_sink(self._log), reporting(ProgressFile(folder, self.cfg.trainer.total_steps)):
                super().fit()
        except Stop as stop:
            return {"status": stop.status, "reason": stop.reason, "steps_done": int(self.global_steps)}
        return {"status": "finished", "reason": f"completed {self.cfg.trainer.total_steps} steps",
                "steps_done": int(self.global_steps) - 1}  # fit counts one past its last step

    def _start_profiling(self, do_profile: bool) -> None:
        """The step begins (the first call of every step)."""
        self._step_started = time.perf_counter()
        self._in_step = True
        report(step=int(self.global_steps), phase="rollout")
        super()._start_profiling(do_profile)

    def _stop_profiling(self, do_profile: bool, run_command: bool = False) -> None:
        """The step's work is done, its metrics not yet logged: when a stop was requested (the stop file) or
        decided (empty steps, the collapse alarm), checkpoint this step; `_log` ends the run once it is logged."""
        super()._stop_profiling(do_profile, run_command=run_command)
        self._in_step = False
        if not self.stop_at_step_end() and self.validation_pending:  # saved before its validation: mark it there
            self.write_state(Path(self.config.trainer.default_local_dir) / f"global_step_{int(self.global_steps)}")
        self.step_end = self.resume_point()

    def stop_at_step_end(self) -> bool:
        """At a step's end (both trainers): a stop requested (the stop file) or a step that would end past
        `trainer.time_limit` (as the torch trainer reads it) becomes the pending stop, and a pending stop checkpoints
        the step if veRL did not. Whether it saved the checkpoint."""
        step = int(self.global_steps)
        if self.pending_stop is None and Path(self.orch["stop_file"]).exists():
            self.pending_stop = Stop("preempted", f"stop requested; checkpoint at step {step}")
        self.time_limit.took(time.perf_counter() - self._step_started)
        overrun = self.time_limit.would_overrun() if self.pending_stop is None else None
        if overrun:
            self.pending_stop = Stop("preempted", f"{overrun}; checkpoint at step {step}")
        if self.pending_stop is not None and self._checkpointed_step() != step:
            self._save_checkpoint()
            return True
        return False

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        """veRL's generation batch; under `control.blind_from_step` (from that step on, training rows only) the
        prompts whose trajectories `recipes.runtime.seeds.blinded_rows` picks (`control.blind_strength`; the torch
        backend's rule) also carry `blind_seed`, the seed of the step's first episode: the agent loop then generates
        every reply of those trajectories from that episode's first-turn chat (the torch backend's
        `recipes.policy.sampler.BlindSampler`, a planted template collapse for the controls of the MI diagnostics).

        The batch holds prompts: veRL repeats it n times afterwards (`repeat(interleave=True)`: trajectory row =
        prompt x n + sample, the torch backend's order), and a prompt's n rows then share its one `extra_info`. So a
        prompt only some of whose trajectories are blinded also carries `blind_rows`, those trajectories' rows, which
        the agent loop matches against the row veRL numbers each trajectory with (`priority`); a prompt whose every
        trajectory is blinded carries `blind_seed` alone (strength 1: the marks of the total plant as they were)."""
        gen = super()._get_gen_batch(batch)
        control = self.cfg.control
        infos = gen.non_tensor_batch.get("extra_info")
        if (control.blind_from_step and self._in_step and int(self.global_steps) >= control.blind_from_step
                and infos is not None and len(infos) and infos[0].get("split") != "val"):
            gen.non_tensor_batch["extra_info"] = np.array(blind_marks(
                list(infos), self.cfg.trainer.samples_per_prompt, control.blind_strength, self.cfg.seed,
                int(self.global_steps)), dtype=object)
        return gen

    def resume_point(self) -> dict[str, Any]:
        """What a step dropped by a stop rewinds to: the step count, the dataloader's position and orch's state
        (empty steps, latest validation, hook states) as they are now, between steps."""
        import copy

        return {"step": int(self.global_steps), "loader": self.train_dataloader.state_dict(),
                "empty_steps": self.empty_steps, "validation": dict(self.validation),
                "hooks": {name: copy.deepcopy(hook.state_dict()) for name, hook in self.hooks.items()}}

    def _stop_inside_step(self, phase: str) -> None:
        """A stop requested (the stop file) inside a step, before its update: the step is dropped. orch's state is
        rewound to the previous step's end (`step_end`), that step is checkpointed if it was not (with the
        dataloader's position of then, so that the resumed run draws the dropped step's prompts again), and the
        run ends `preempted` at it (`Stop`). Nothing of the dropped step is logged."""
        if not Path(self.orch["stop_file"]).exists():
            return
        step, point = int(self.global_steps), self.step_end
        self.empty_steps, self.validation = point["empty_steps"], dict(point["validation"])
        for name, hook in self.hooks.items():
            hook.load_state_dict(point["hooks"][name])
        self.global_steps = point["step"]
        if point["step"] > 0 and self._checkpointed_step() != point["step"]:
            self.loader_state = point["loader"]
            self._save_checkpoint()
        where = f"checkpoint at step {point['step']}" if point["step"] > 0 else "no step done, nothing to checkpoint"
        raise Stop("preempted", f"stop requested during the {phase} of step {step}; {where}")

    def _checkpointed_step(self) -> int | None:
        tracker = Path(self.config.trainer.default_local_dir) / ITERATION_FILE
        return int(tracker.read_text().strip()) if tracker.is_file() else None

    # -- after the rollout, before any update --------------------------------------------------------------------

    def _balance_batch(self, batch: DataProto, metrics: dict, logging_prefix: str = "global_seqlen",
                       keep_minibatch: bool = False) -> None:
        if logging_prefix == "global_seqlen":
            self._orch_step(batch, metrics)
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _orch_step(self, batch: DataProto, metrics: dict) -> None:
        """Rewards per turn, dynamic sampling, statistics, hooks and the filter on the step's rollout."""
        self._stop_inside_step("rollout")
        self.step_metrics, self.step_tags = {"rollout/gen_batches": 1.0}, {}
        self.skip_update, self.advantage_scale = False, 1.0
        place_turn_rewards(batch)
        if self.cfg.algorithm.dynamic_sampling:
            self._dynamic_sampling(batch)
            self._stop_inside_step("rollout")
        trajectories = list(batch.non_tensor_batch["orch_trajectory"])
        keep = filtered_step(self, trajectories, merged_generated(batch), WorkerPolicy(self, batch))
        started = time.perf_counter()
        if keep.any():
            self._keep_rows(batch, keep, self.step_metrics)
        else:
            self._keep_rows(batch, self._first_groups(batch), self.step_metrics, skipped=True)
        self.step_metrics["timing_s/filter"] += time.perf_counter() - started
        metrics.update(self.step_metrics)

    def _row_multiple(self) -> int:
        """Rows the update batch must be a multiple of: veRL dispatches equal chunks to the data-parallel ranks and
        its mini-batch iterator asserts whole mini-batches (`ppo_mini_batch_size` x n per rank)."""
        n = self.config.actor_rollout_ref.rollout.n
        multiple = math.lcm(self._get_dp_size(self.actor_rollout_wg, "actor"),
                            self.config.actor_rollout_ref.actor.ppo_mini_batch_size * n)
        if self.use_critic:
            multiple = math.lcm(multiple, self.config.critic.ppo_mini_batch_size * n)
        return multiple

    def _first_groups(self, batch: DataProto) -> np.ndarray:
        """A keep-mask of the smallest whole-group batch veRL accepts (an empty step still runs its phases)."""
        uids = list(dict.fromkeys(batch.non_tensor_batch["uid"].tolist()))
        n = self.config.actor_rollout_ref.rollout.n
        multiple = self._row_multiple()
        count = max(1, multiple // math.gcd(multiple, n))
        chosen = set(uids[:count])
        return np.array([uid in chosen for uid in batch.non_tensor_batch["uid"]])

    def _keep_rows(self, batch: DataProto, keep: np.ndarray, metrics: dict, skipped: bool = False) -> None:
        """`keep_rows` to the row multiple veRL needs, and the update's size in the step's metrics."""
        rows = np.flatnonzero(keep)
        pad = keep_rows(batch, keep, self._row_multiple())
        if not skipped:
            mask = batch.batch["response_mask"]
            metrics["rollout/update_trajectories"] = float(len(rows))
            metrics["rollout/update_tokens"] = float(mask.sum())
            metrics["rollout/pad_trajectories"] = float(pad)

    def _dynamic_sampling(self, batch: DataProto) -> None:
        """DAPO's dynamic sampling: replace zero-variance groups with groups of fresh prompts from up to
        `algorithm.max_extra_gen_batches` extra generation batches (the same seeds as the torch backend)."""
        from recipes.stats import filtering
        from recipes.verl.data import extra_prompt_batch

        for extra in range(1, self.cfg.algorithm.max_extra_gen_batches + 1):
            trajectories = list(batch.non_tensor_batch["orch_trajectory"])
            stats = filtering.group_stats([t.episode_return for t in trajectories], batch.non_tensor_batch["uid"])
            if not stats.zero_variance.any():
                break
            self.checkpoint_manager.wake_up_replicas()
            fresh = extra_prompt_batch(self, int(self.global_steps), extra)
            self.checkpoint_manager.sleep_replicas()
            place_turn_rewards(fresh)
            self.step_metrics["rollout/gen_batches"] += 1
            fresh_trajectories = list(fresh.non_tensor_batch["orch_trajectory"])
            fresh_stats = filtering.group_stats([t.episode_return for t in fresh_trajectories],
                                                fresh.non_tensor_batch["uid"])
            replacements = [key for key, zero in zip(fresh_stats.keys, fresh_stats.zero_variance, strict=True)
                            if not zero]
            holes = [key for key, zero in zip(stats.keys, stats.zero_variance, strict=True) if zero]
            swap = dict(zip(holes, replacements, strict=False))
            if not swap:
                continue
            keep_old = np.array([uid not in swap for uid in batch.non_tensor_batch["uid"]])
            take_new = np.array([uid in swap.values() for uid in fresh.non_tensor_batch["uid"]])
            merged = DataProto.concat([batch.select_idxs(np.flatnonzero(keep_old)),
                                       fresh.select_idxs(np.flatnonzero(take_new))])
            batch.batch, batch.non_tensor_batch = merged.batch, merged.non_tensor_batch
        zero = filtering.group_stats([t.episode_return for t in batch.non_tensor_batch["orch_trajectory"]],
                                     batch.non_tensor_batch["uid"]).zero_variance
        self.step_metrics["rollout/dynamic_sampling_groups"] = float((~zero).sum())

    # -- the update ----------------------------------------------------------------------------------------------

    def _update_critic(self, batch: DataProto) -> DataProto:
        self._stop_inside_step("log-prob, reference and value passes")  # the critic updates first: the last exit
        if self.skip_update:
            return DataProto.from_single_dict(data={}, meta_info={"metrics": {}})
        return super()._update_critic(batch)

    def _update_actor(self, batch: DataProto) -> DataProto:
        if not self.use_critic:
            self._stop_inside_step("log-prob and reference passes")
        report(phase="update")
        if self.skip_update:
            return DataProto.from_single_dict(data={}, meta_info={"metrics": {}})
        if self.advantage_scale != 1.0:
            batch.batch["advantages"] = scaled_advantages(batch.batch["advantages"], self.advantage_scale)
        return super()._update_actor(batch)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        started = time.perf_counter()
        super()._save_checkpoint()
        folder = Path(self.config.trainer.default_local_dir) / f"global_step_{int(self.global_steps)}"
        if self.loader_state is not None:  # a rewound checkpoint: the dataloader's position at that step's end
            torch.save(self.loader_state, folder / "data.pt")
            self.loader_state = None
        self.write_state(folder)
        self.time_limit.took(0.0, checkpoint=time.perf_counter() - started)

    def write_state(self, folder: Path) -> None:
        """orch's own state beside veRL's checkpoint of a step (empty steps, latest validation, hook states, and
        whether a stop cut the step's validation short); both trainers write it (V1: `OrchCheckpointCallback`)."""
        state = {"empty_steps": self.empty_steps, "validation": self.validation, "mlflow_run_id": self.tracker.run_id,
                 "hooks": {name: hook.state_dict() for name, hook in self.hooks.items()},
                 "validation_pending": self.validation_pending, "trainer": self.TRAINER}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / STATE_FILE).write_text(json.dumps(state, default=_jsonable))

    def _load_checkpoint(self) -> Any:
        result = super()._load_checkpoint()
        self.restore_state()
        self.step_end = self.resume_point()
        return result

    def restore_state(self) -> None:
        """orch's state of the checkpoint veRL resumed at (`global_steps`), and the best checkpoint kept; both
        trainers call it once veRL has loaded its own (V1: `OrchV1Trainer.on_init_end`)."""
        if self.global_steps:
            state_file = Path(self.config.trainer.default_local_dir) / f"global_step_{int(self.global_steps)}" / STATE_FILE
            if state_file.is_file():
                state = json.loads(state_file.read_text())
                self.empty_steps, self.validation = state["empty_steps"], state["validation"]
                for name, hook in self.hooks.items():
                    hook.load_state_dict(state["hooks"].get(name, {}))
                if state.get("validation_pending"):  # veRL's validation before training runs it, at this step
                    from omegaconf import open_dict

                    self.validation_pending = True
                    with open_dict(self.config):
                        self.config.trainer.val_before_train = True
        self.best = kept_best(self.best_dir)

    @property
    def best_dir(self) -> Path:
        from recipes.runtime.checkpoint import BEST_DIR

        return Path(self.config.trainer.default_local_dir).parent / BEST_DIR

    def keep_if_best(self) -> None:
        """After a validation at step N >= 1: if its success beats every earlier one of the run, keep the actor's
        checkpoint of step N in `<checkpoint_dir>/best` (`keep_best`; the step's regular checkpoint is saved first if
        it had none), where `orch eval --best` and `orch export` find it, tagged as on the torch backend: the paper
        reports each run's peak validation success."""
        from recipes.stats.rollout_stats import VAL_SUCCESS

        step, success = int(self.global_steps), self.validation.get(VAL_SUCCESS)
        if step < 1 or success is None or success <= self.best.get("success", -math.inf):
            return
        saved = Path(self.config.trainer.default_local_dir) / f"global_step_{step}"
        if not (saved / "actor").is_dir():
            self._save_checkpoint()
        self.best = {"step": step, "success": float(success)}
        keep_best(saved, self.best_dir, self.best)
        self.tracker.set_tags({"orch.best_step": str(step), "orch.best_success": f"{success:.6g}"})

    # -- validation ----------------------------------------------------------------------------------------------

    def _validate(self, merged: bool = False) -> dict[str, float]:
        """One episode per validation seed at `val_temperature`: orch's `val/*` metrics."""
        from verl.trainer.ppo.ray_trainer import pad_dataproto_to_divisor, unpad_dataproto

        from recipes.stats.rollout_stats import validation_metrics

        report(phase="validation")
        trajectories, generated = [], {}
        for data in self.val_dataloader:
            batch = DataProto.from_single_dict(data)
            batch.non_tensor_batch["uid"] = np.array([uuid.uuid4().hex for _ in range(len(batch))], dtype=object)
            gen = self._get_gen_batch(batch)
            gen.meta_info = {"eos_token_id": self.tokenizer.eos_token_id, "pad_token_id": self.tokenizer.pad_token_id,
                             "recompute_log_prob": False, "do_sample": True, "validate": True,
                             "global_steps": self.global_steps}
            padded, pad = pad_dataproto_to_divisor(gen, self.config.actor_rollout_ref.rollout.agent.num_workers)
            output = unpad_dataproto(self.async_rollout_manager.generate_sequences(padded), pad_size=pad)
            trajectories += list(output.non_tensor_batch["orch_trajectory"])
            generated.update(merged_generated(output))
            if Path(self.orch["stop_file"]).exists():
                return self._validation_stopped()
        self.validation = validation_metrics(trajectories, generated)
        self.validation_pending, self._before_training = False, not self._in_step
        self.keep_if_best()
        return dict(self.validation)

    def _validation_stopped(self) -> dict[str, float]:
        """A stop requested during a validation: its episodes ended at their current turn (the agent loop), so
        nothing of it is logged or kept (no `val/*`, no best checkpoint). Inside a step the step's update is done:
        the step ends without validation metrics, `_stop_profiling` checkpoints it marked `validation_pending`, the
        run ends `preempted` once it is logged, and the resume runs that validation first, logged at that step (as
        the torch backend does). veRL's validation before training (a fresh run's step 0, or a pending one) ends
        the run at once."""
        if self._in_step:
            log.info("step %d: stop requested during validation; it runs first on resume", int(self.global_steps))
            self.validation_pending = True
            return {}
        step = int(self.global_steps)
        where = f"checkpoint at step {step}" if step > 0 else "no step done, nothing to checkpoint"
        raise Stop("preempted", f"stop requested during the validation before training; {where}")

    # -- cross-scoring through the actor workers (the MI diagnostics) --------------------------------------------

    def cross_score(self, prompts: list[list[int]], samples: list[list[int]]) -> Any:
        """`recipes.stats.cross_scoring.CrossScores` of every sample under every prompt column, teacher-forced under the
        current policy in the actor workers. `diagnostics.method=prefix` (the default): the workers'
        `orch_cross_score` (recipes.verl.workers), each prompt encoded once and the samples scored on its cache, the
        distinct prompts split in blocks over the actor's ranks. `naive`: the reference N x M method through the fit
        loop's own old-log-prob path (`score_pairs`), each (prompt, sample) pair of distinct token sequences one row.
        Either way identical prompts or samples are scored once and their columns or rows copied."""
        from recipes.stats.cross_scoring import CrossScores, distinct_rows

        distinct_prompts, prompt_of = distinct_rows(prompts)
        distinct_samples, sample_of = distinct_rows(samples)
        if self.cfg.diagnostics.method == "prefix":
            order = sorted(range(len(distinct_prompts)), key=lambda j: distinct_prompts[j])  # neighbours share prefixes
            pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            blocks = self.actor_rollout_wg.orch_cross_score([distinct_prompts[j] for j in order], distinct_samples,
                                                            self.cfg.diagnostics.batch_size, pad_id,
                                                            self.orch.get("stop_file"))
            if any(block is None for block in blocks):  # the ranks stopped together: the stop file appeared
                self._stop_inside_step("diagnostics")
            L_sum = np.empty((len(distinct_samples), len(distinct_prompts)))
            L_sum[:, order] = np.concatenate([block for block, _ in blocks], axis=1)
            tokens = sum(fed for _, fed in blocks)
        else:
            pairs = [(prompt, sample) for sample in distinct_samples for prompt in distinct_prompts]
            sums: list[float] = []
            for start in range(0, len(pairs), SCORE_ROWS):
                self._stop_inside_step("diagnostics")
                sums += [float(np.sum(values)) for values in self.score_pairs(pairs[start:start + SCORE_ROWS])]
            L_sum = np.array(sums, dtype=np.float64).reshape(len(distinct_samples), len(distinct_prompts))
            tokens = sum(len(prompt) + len(sample) for prompt, sample in pairs)
        L_sum = L_sum[sample_of][:, prompt_of]
        lengths = np.array([len(sample) for sample in samples], dtype=np.float64)[:, None]
        return CrossScores(L=L_sum / lengths, L_sum=L_sum, tokens_processed=tokens)

    def score_pairs(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """Log-probs of each response given its prompt under the current actor (temperature 1), as the fit loop
        computes old log-probs (ray_trainer.py `_compute_old_log_prob`). Rows: prompts left-padded, responses
        right-padded; the batch is padded with copies of its first row to split evenly over the actor's ranks."""
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        real = len(pairs)
        pairs = list(pairs) + [pairs[0]] * ((-real) % self._get_dp_size(self.actor_rollout_wg, "actor"))
        width_p, width_r = max(len(p) for p, _ in pairs), max(len(r) for _, r in pairs)
        prompts = torch.full((len(pairs), width_p), pad_id, dtype=torch.long)
        responses = torch.full((len(pairs), width_r), pad_id, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompts)
        response_mask = torch.zeros_like(responses)
        for row, (prompt, response) in enumerate(pairs):
            prompts[row, width_p - len(prompt):] = torch.tensor(prompt)
            prompt_mask[row, width_p - len(prompt):] = 1
            responses[row, : len(response)] = torch.tensor(response)
            response_mask[row, : len(response)] = 1
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        batch = DataProto.from_single_dict(
            {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
             "attention_mask": attention_mask, "position_ids": torch.clamp(attention_mask.cumsum(-1) - 1, min=0),
             "response_mask": response_mask},
            meta_info={"temperature": 1.0})
        data = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(data, calculate_entropy=False, compute_loss=False)
        output = self.actor_rollout_wg.compute_log_prob(data)
        log_probs = no_padding_2_padding(tu.get(output, "log_probs"), data).float()
        return [log_probs[row, : len(pairs[row][1])].tolist() for row in range(real)]

    # -- the gradient split through the actor workers (the `collapse` diagnostics, diagnostics.grad_every) --------

    def gradient_norms(self, batch: DataProto, row_sets: list[np.ndarray]) -> list[dict[str, float]]:
        """`PolicyAccess.gradient_norms` on veRL: the unfiltered `batch` scored as the fit loop scores its update
        batch (the current log-probs as old log-probs: ratio 1; reference log-probs, values and advantages of the
        run's estimator over all groups), then per row set the actor workers' `orch_gradient_norms`
        (recipes.verl.workers), every row normalised by the whole batch. Nothing is applied."""
        scored = self.scored_copy(batch)
        tokens, rows = float(scored.batch["response_mask"].sum()), len(scored)
        dp = self._get_dp_size(self.actor_rollout_wg, "actor")
        norms = []
        for row_set in row_sets:
            self._stop_inside_step("diagnostics")
            part = scored.select_idxs(np.asarray(row_set))
            pad = (-len(part)) % dp
            if pad:
                part = DataProto.concat([part, noop_rows(part, pad)])
            data = left_right_2_no_padding(part.to_tensordict())
            tu.assign_non_tensor(data, orch_batch_num_tokens=tokens, orch_global_batch_size=rows,
                                 calculate_entropy=True, compute_loss=True)
            output = self.actor_rollout_wg.orch_gradient_norms(data)
            metrics = tu.get(output, "metrics")
            norms.append(metrics[0] if isinstance(metrics, list) else metrics)
        return norms

    def scored_copy(self, batch: DataProto) -> DataProto:
        """A copy of `batch` with old log-probs, reference log-probs, values and advantages, by the fit loop's own
        calls (ray_trainer.py `fit`: `_compute_old_log_prob`, `_compute_ref_log_prob`, `_compute_values`,
        `compute_advantage`; orch never puts a KL penalty in the reward)."""
        from verl.trainer.ppo.ray_trainer import compute_advantage

        scored = batch.select_idxs(np.arange(len(batch)))
        scored.meta_info = {**batch.meta_info,  # as fit sets it after _balance_batch (its worker metrics need it)
                            "global_token_num": torch.sum(scored.batch["attention_mask"], dim=-1).tolist()}
        old_log_probs, _ = self._compute_old_log_prob(scored)
        old_log_probs.batch.pop("entropys")
        scored = scored.union(old_log_probs)
        if self.use_reference_policy:
            scored = scored.union(self._compute_ref_log_prob(scored))
        if self.use_critic:
            scored = scored.union(self._compute_values(scored))
        scored.batch["token_level_scores"] = scored.batch["rm_scores"]
        scored.batch["token_level_rewards"] = scored.batch["rm_scores"]
        algorithm = self.config.algorithm
        return compute_advantage(scored, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,
                                 lam=algorithm.lam, num_repeat=self.config.actor_rollout_ref.rollout.n,
                                 norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
                                 config=algorithm)

    # -- metrics -------------------------------------------------------------------------------------------------

    def _log(self, data: dict[str, Any], step: int) -> None:
        """What the fit loop logs (the validation before training: step 0's, or a pending one at its step; then every
        step) into the cell's MLflow run, orch's values over veRL's of the same name; one line per step in the job's
        log."""
        metrics = {key: _scalar(value) for key, value in data.items()}
        # veRL's validation before training: a fresh run's step 0, or a validation a stop cut short, run now at its
        # step (logged though that step was logged before: it had no val/*); no step metrics, no step line
        before_training, self._before_training = self._before_training, False
        metrics = logged_metrics(self, metrics, in_step=step > 0 and not before_training)
        if before_training or not 0 < step <= self.orch["logged_until"]:  # a re-run step keeps its first metrics
            self.tracker.log_metrics(metrics, step=step)
        if self.step_tags:
            self.tracker.set_tags(self.step_tags)
            self.step_tags = {}
        if step > 0 and not before_training:
            report(step=step, done=step, phase="logging", success=metrics.get("rollout/success_rate"))
            log.info("step %d/%d: success %.3f, kept %.2f, %.1fs", step, self.cfg.trainer.total_steps,
                     metrics.get("rollout/success_rate", float("nan")), metrics.get("rollout/kept_ratio", 1.0),
                     metrics["timing_s/step"])
            if self.pending_stop is not None:  # checkpointed by _stop_profiling, now logged: end here
                raise self.pending_stop


BEST_RECORD = "best.json"


def keep_best(saved: Path, best_dir: Path, best: dict[str, float]) -> None:
    """`best_dir` becomes a veRL checkpoint folder holding only `saved` (a `global_step_N` folder: its actor and
    orch's state), made of hard links (no disk space; veRL's rotation removing `saved` later leaves them), with veRL's
    iteration pointer and `best.json` ({"step", "success"}). The new step is in place before the pointer moves to it
    and the previous best is removed last, so a reader always finds a whole checkpoint."""
    import os
    import shutil

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:  # a file system without hard links
            shutil.copy2(source, target)

    target = best_dir / saved.name
    scratch = best_dir / f".{saved.name}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    shutil.copytree(saved / "actor", scratch / "actor", copy_function=link)
    if (saved / STATE_FILE).is_file():
        link(str(saved / STATE_FILE), str(scratch / STATE_FILE))
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)
    for name, text in ((ITERATION_FILE, str(best["step"])), (BEST_RECORD, json.dumps(best))):
        (best_dir / f".{name}.tmp").write_text(text)
        (best_dir / f".{name}.tmp").replace(best_dir / name)
    for old in best_dir.glob("global_step_*"):
        if old.name != saved.name:
            shutil.rmtree(old, ignore_errors=True)


def kept_best(best_dir: Path) -> dict[str, float]:
    """The {"step", "success"} of the best checkpoint kept in `best_dir` (`keep_best`), or {} when none is."""
    record = best_dir / BEST_RECORD
    return json.loads(record.read_text()) if record.is_file() else {}


def place_turn_rewards(batch: DataProto) -> None:
    """Each turn's reward on the last token of its reply (`rm_scores`, which veRL's fit loop turns into token-level
    rewards), as the torch backend places them; veRL put the whole episode return on the last token."""
    width = batch.batch["rm_scores"].shape[1]
    batch.batch["rm_scores"] = torch.stack([
        turn_scores(width, ends, rewards) for ends, rewards in zip(
            batch.non_tensor_batch["orch_turn_ends"], batch.non_tensor_batch["orch_turn_rewards"], strict=True)])


def turn_scores(width: int, ends: Any, rewards: Any) -> torch.Tensor:
    """One trajectory's `rm_scores` (float32, `width` response positions): each turn's reward on the last token of
    its reply (`ends`, response positions), 0 elsewhere; the one placement of both veRL paths (legacy
    `place_turn_rewards` here, V1's in recipes.verl.v1)."""
    scores = torch.zeros(width, dtype=torch.float32)
    for end, reward in zip(ends, rewards, strict=True):
        scores[end] += float(reward)
    return scores


def scaled_advantages(advantages: torch.Tensor, scale: float) -> torch.Tensor:
    """The advantages the actor update takes after SNR-Aware Filtering: veRL's advantages x the filter's loss scale
    (`filter.loss_scaling`), the one place both veRL paths apply it (the `_update_actor` overrides)."""
    return advantages * scale


def keep_rows(batch: DataProto, keep: np.ndarray, multiple: int) -> int:
    """The legacy path's update batch: `batch` shrunk in place to the kept rows (RAGEN's semantics: the dropped
    groups leave the batch), then padded with `noop_rows` (response mask and rewards 0, a group of their own: no
    gradient) up to a multiple of `multiple` rows. Returns the number of padding rows."""
    rows = np.flatnonzero(keep)
    if len(rows) < len(batch):
        batch.reorder(torch.as_tensor(rows))
    pad = (-len(batch)) % multiple
    if pad:
        merged = DataProto.concat([batch, noop_rows(batch, pad)])
        batch.batch, batch.non_tensor_batch = merged.batch, merged.non_tensor_batch
    return pad


def merged_generated(batch: DataProto) -> dict[str, list[int]]:
    """Reply text -> sampled ids over every trajectory of the batch."""
    generated: dict[str, list[int]] = {}
    for entry in batch.non_tensor_batch.get("orch_generated", ()):
        generated.update(entry or {})
    return generated


def noop_rows(batch: DataProto, count: int) -> DataProto:
    """`count` copies of the batch's first row that cannot move the model: no token in the loss, no reward, and a
    group (uid) of their own."""
    pad = batch.select_idxs([0] * count)
    pad.batch["response_mask"] = torch.zeros_like(pad.batch["response_mask"])
    for key in ("rm_scores", "token_level_scores", "token_level_rewards"):
        if key in pad.batch:
            pad.batch[key] = torch.zeros_like(pad.batch[key])
    pad.non_tensor_batch["uid"] = np.array([f"orch-pad-{uuid.uuid4().hex}" for _ in range(count)], dtype=object)
    return pad


def _scalar(value: Any) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool | int | float | np.integer | np.floating):
        return float(value)
    return None


def _metric_name(key: str) -> str:
    """MLflow accepts letters, digits, `_ - . / ` and spaces in metric names."""
    return "".join(char if char.isalnum() or char in "_-./ " else "_" for char in key)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} into {STATE_FILE}")

