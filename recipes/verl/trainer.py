"""orch's trainer on veRL: veRL's own PPO loop (the legacy `RayPPOTrainer` of veRL 0.9.1) with orch's pieces in.

One step of `RayPPOTrainer.fit` (verl/trainer/ppo/ray_trainer.py) and where orch plugs in:

    generate_sequences        the `orch_env` agent loop plays every environment (recipes.verl.agent_loop)
    _balance_batch            the rollout with its rewards, before any log-prob, value or update:
                                * each turn's reward on the last token of its reply (as the torch backend)
                                * DAPO's dynamic sampling: groups with variance gathered from extra batches, cut
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

from recipes.run.progress import report
from recipes.stats.dynamic_sampling import GEN_BATCHES, gather_groups
from recipes.verl.agent_loop import blind_marks
from recipes.verl.orch_base import (
    OrchTrainerBase,
    Stop,
    filtered_step,
    scalar,
    scaled_advantages,
    turn_scores,
)

log = logging.getLogger("orch.verl")


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


class OrchPPOTrainer(OrchTrainerBase, RayPPOTrainer):
    """veRL's PPO trainer with orch's filter, diagnostics, metrics and stop control (see the module docstring); orch's
    state, stops, checkpoints, cross-scoring and metrics are `recipes.verl.orch_base.OrchTrainerBase`'s, shared with
    the V1 trainer. Built with `orch=` (OrchTrainerBase) beside veRL's own arguments."""

    TRAINER = "legacy"  # `verl.trainer`, written into orch's state file

    def __init__(self, *args: Any, orch: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, orch=orch, **kwargs)
        from recipes.policy.chat import ChatEncoder

        self.encoder = ChatEncoder(self.tokenizer)
        self._in_step = False  # between `_start_profiling` and `_stop_profiling` (veRL validates before its loop too)
        self._before_training = False  # `_validate` ran as veRL's validation before training: its log is val/* only

    # -- the loop ------------------------------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """veRL's loop with orch's metric sink; returns how the run ended."""
        from recipes.verl.patches import tracking_sink

        with tracking_sink(self._log):
            return self.run_fit(super().fit)

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

    # -- after the rollout, before any update --------------------------------------------------------------------

    def _balance_batch(self, batch: DataProto, metrics: dict, logging_prefix: str = "global_seqlen",
                       keep_minibatch: bool = False) -> None:
        if logging_prefix == "global_seqlen":
            self._orch_step(batch, metrics)
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _orch_step(self, batch: DataProto, metrics: dict) -> None:
        """Rewards per turn, dynamic sampling, statistics, hooks and the filter on the step's rollout."""
        self._stop_inside_step("rollout")
        self.step_metrics, self.step_tags = {GEN_BATCHES: 1.0}, {}
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
        """DAPO's dynamic sampling, the rule of every backend (`recipes.stats.dynamic_sampling.gather_groups`): the
        groups with reward variance of this batch and of up to `algorithm.max_extra_gen_batches` extra generation
        batches (the same seeds as the torch backend), gathered and cut to the step's prompts, in place."""
        from recipes.verl.data import extra_prompt_batch

        def returns(rows: DataProto) -> list[float]:
            return [t.episode_return for t in rows.non_tensor_batch["orch_trajectory"]]

        def batches() -> Any:
            yield batch, returns(batch), batch.non_tensor_batch["uid"]
            for extra in range(1, self.cfg.algorithm.max_extra_gen_batches + 1):
                self.checkpoint_manager.wake_up_replicas()
                fresh = extra_prompt_batch(self, int(self.global_steps), extra)
                self.checkpoint_manager.sleep_replicas()
                place_turn_rewards(fresh)
                yield fresh, returns(fresh), fresh.non_tensor_batch["uid"]

        gathered = gather_groups(batches(), self.cfg.trainer.prompts_per_step,
                                 self.cfg.algorithm.max_extra_gen_batches + 1)
        merged = DataProto.concat([rows.select_idxs(np.flatnonzero(keep)) for rows, keep in gathered.parts
                                   if keep.any()])
        batch.batch, batch.non_tensor_batch = merged.batch, merged.non_tensor_batch
        self.step_metrics.update(gathered.metrics())

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
        with self.writing_checkpoint():
            super()._save_checkpoint()
            folder = Path(self.config.trainer.default_local_dir) / f"global_step_{int(self.global_steps)}"
            if self.loader_state is not None:  # a rewound checkpoint: the dataloader's position at that step's end
                torch.save(self.loader_state, folder / "data.pt")
                self.loader_state = None
            self.write_state(folder)
        self.time_limit.took(0.0, checkpoint=time.perf_counter() - started)

    def _load_checkpoint(self) -> Any:
        result = super()._load_checkpoint()
        self.restore_state()
        self.step_end = self.resume_point()
        return result

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
        step) into the cell's MLflow run (`log_step`)."""
        metrics = {key: scalar(value) for key, value in data.items()}
        # veRL's validation before training: a fresh run's step 0, or a validation a stop cut short, run now at its
        # step (logged though that step was logged before: it had no val/*); no step metrics, no step line
        before_training, self._before_training = self._before_training, False
        self.log_step(metrics, step, in_step=step > 0 and not before_training)


def place_turn_rewards(batch: DataProto) -> None:
    """Each turn's reward on the last token of its reply (`rm_scores`, which veRL's fit loop turns into token-level
    rewards), as the torch backend places them; veRL put the whole episode return on the last token."""
    width = batch.batch["rm_scores"].shape[1]
    batch.batch["rm_scores"] = torch.stack([
        turn_scores(width, ends, rewards) for ends, rewards in zip(
            batch.non_tensor_batch["orch_turn_ends"], batch.non_tensor_batch["orch_turn_rewards"], strict=True)])


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
