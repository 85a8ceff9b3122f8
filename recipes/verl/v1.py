"""orch's trainer on veRL's V1 trainer (`verl.trainer: v1`): veRL 0.9.1's `PPOTrainerSync`
(verl/trainer/ppo/v1/trainer_sync.py, on `PPOTrainer` in trainer_base.py) with orch's pieces in, through V1's own
extension points where they exist. docs/verl.md ("The V1 trainer") maps every piece of the legacy backend
(recipes.verl.trainer) to these; file:line below refer to veRL 0.9.1.

One step of V1's `_step_once` (trainer_base.py:562-612) and where orch plugs in:

    replay_buffer.sample      `OrchSampler`, veRL's sync `ReplayBuffer` named by the public
                              `trainer.v1.sampler.custom_sampler` (trainer_base.py:145-151): it waits for the step's
                              groups (polling TransferQueue every `POLL_S`, not veRL's 2 s), then, before any
                              log-prob, value or advantage, runs orch's step on the whole rollout
                              (`OrchV1Trainer.after_rollout`): each turn's reward on its reply's last token, the rollout
                              statistics, the step hooks (the `collapse` diagnostics, cross-scored through the actor
                              workers), SNR-Aware Filtering, the rollout table. The batch it returns holds only the
                              kept groups' trajectories (RAGEN's semantics: the batch *shrinks*, it is not refilled);
                              the dropped ones are cleared from TransferQueue
    _balance_batch (veRL)     pads the shrunk batch with veRL's own no-op rows (`is_padding`, response mask 0, reward
                              0, a group of their own: padding_utils.py:144-200) to the row multiple the update needs:
                              orch's legacy `noop_rows` is not needed
    log-probs, values, advantages (veRL), on the kept rows only
    _update_actor/_critic     skipped when the filter kept nothing; advantages x the filter's loss scale
                              (the only overrides of veRL methods here, with `_init_resource_pool_mgr` and
                              `_save_checkpoint`)
    _save_checkpoint          veRL's, with orch's state beside it through `trainer.checkpoint_callback_class` (public,
                              trainer_base.py:1027): `OrchCheckpointCallback`; a full disk is one error naming the
                              step, its half-written folder removed (`OrchTrainerBase.writing_checkpoint`)
    on_step_end (hook)        the step's weights to the rollout replicas (veRL's), then orch's stop decisions: a
                              requested stop (the stop file), the time limit, empty steps, the collapse alarm
                              checkpoint the step; the run ends once it is logged
    on_validate_* (hooks)     orch's `val/*` from the validation episodes the sampler saw (partition "val"); a new
                              peak keeps the step's checkpoint as the run's best; a stop during it keeps nothing of
                              it and the resume runs it first (the legacy path's rule)
    (inside a step)           a stop requested before the step's update drops the step, as on the legacy path: the
                              agent loops end their episodes at the next turn; the sampler's hand-over, the
                              diagnostics and the update overrides check, rewind to the state `on_step_begin` kept
                              (before veRL drew the step's prompts) and checkpoint that step (`_stop_inside_step`)
    logger.log                `self.logger` (veRL's `Tracking`, a public attribute built in fit,
                              trainer_base.py:423) wrapped in `on_validate_begin`/`on_train_begin`: every metric into
                              the cell's MLflow run, orch's over veRL's where both name one (no patch P3 on this path)

Only the sync mode runs: veRL's async modes train on rollouts of an older policy (docs/verl.md, async modes).

Ported from the legacy path after the first part (each a function below the trainer): the planted-collapse
control (`OrchAgentLoopManager`, named by veRL's public `agent_loop_manager_class`, marks a planted step's prompts:
`mark_blinded`), the gradient split (`gradient_norms`, on the unfiltered batch scored in TransferQueue: `scored`) and
DAPO's dynamic sampling with orch's extra seeds (`dynamic_sampling`, `extra_batch`), in the sampler before the hooks.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.checkpoint_callback import CheckpointCallback
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu

from recipes.run.progress import report
from recipes.stats.dynamic_sampling import GEN_BATCHES, gather_groups
from recipes.verl.agent_loop import blind_marks, train_config
from recipes.verl.orch_base import (
    OrchTrainerBase,
    Stop,
    filtered_step,
    scalar,
    scaled_advantages,
    turn_scores,
)

log = logging.getLogger("orch.verl")
POLL_S = 0.05  # TransferQueue polls of the replay buffer (veRL's default 2.0 s: replay_buffer.py:144)
VERL_VAL_PREFIXES = ("val-core/", "val-aux/")  # veRL's validation metrics: orch logs its own `val/*` instead
TRAINER_NAME = "orch_sync"


class OrchSampler(ReplayBuffer):
    """veRL's sync replay buffer (whole groups, on-policy) that hands each training batch to orch's step before any
    update (`OrchV1Trainer.after_rollout`), and the validation episodes to orch's validation metrics. `trainer` is set
    by `OrchV1Trainer` right after veRL builds the buffer."""

    trainer: OrchV1Trainer | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("poll_interval", POLL_S)
        super().__init__(*args, **kwargs)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        batch, metrics = super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        if self.trainer is None:
            return batch, metrics
        batch = ordered(batch)
        if partition_id == "val":
            self.trainer.saw_validation(batch)
            return batch, metrics
        return self.trainer.after_rollout(batch), metrics


def ordered(batch: KVBatchMeta) -> KVBatchMeta:
    """The batch's trajectories in the legacy row order, prompt x n + sample: keys `{uid}_{session}_{index}` by
    the prompt's first appearance, then session."""
    first: dict[str, int] = {}
    for key in batch.keys:
        first.setdefault(key.split("_")[0], len(first))

    def rank(i: int) -> tuple[int, int, int]:
        uid, session, index = batch.keys[i].rsplit("_", 2)
        return first[uid], int(session), int(index)

    order = sorted(range(len(batch.keys)), key=rank)
    return KVBatchMeta(partition_id=batch.partition_id, keys=[batch.keys[i] for i in order],
                       tags=[batch.tags[i] for i in order])


def fetch_extra(batch: KVBatchMeta, fields: tuple[str, ...] = ("extra_fields",)) -> TensorDict:
    return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(fields))


def extra_fields(data: TensorDict) -> list[dict[str, Any]]:
    """Each row's `extra_fields`, with orch's trajectory rebuilt: TransferQueue returns dataclasses as dicts."""
    rows = [dict(getattr(value, "data", value)) for value in list(data["extra_fields"])]
    for row in rows:
        row["orch_trajectory"] = as_trajectory(row["orch_trajectory"])
        row["orch_generated"] = {text: plain(ids) for text, ids in (row.get("orch_generated") or {}).items()}
    return rows


def plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def as_trajectory(value: Any) -> Any:
    """An `envs.trajectory.Trajectory` from what TransferQueue gives back (the object, or its fields as a dict)."""
    from envs.trajectory import Trajectory, Turn

    if isinstance(value, Trajectory):
        return value
    turns = [turn if isinstance(turn, Turn) else Turn(**turn) for turn in value["turns"]]
    return Trajectory(**{**value, "turns": turns})


class OrchCheckpointCallback(CheckpointCallback):
    """orch's state beside each veRL checkpoint (`trainer.checkpoint_callback_class`)."""

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
                **kwargs: Any) -> None:
        if isinstance(trainer, OrchV1Trainer):
            folder = Path(checkpoint_dir)
            if trainer.loader_state is not None:  # a rewound checkpoint: the dataloader's position at its step's end
                torch.save(trainer.loader_state, folder / "data.pt")
                trainer.loader_state = None
            trainer.write_state(folder)


class _Sink:
    """veRL's `Tracking` with every `log` also handed to orch (what patch P3 does on the legacy path)."""

    def __init__(self, inner: Any, fn: Any) -> None:
        self.inner, self.fn = inner, fn

    def log(self, data: dict, step: int, backend: Any = None) -> None:
        self.inner.log(data=data, step=step, backend=backend)
        if backend is None:
            self.fn(data, step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@register_trainer(TRAINER_NAME)
class OrchV1Trainer(OrchTrainerBase, PPOTrainerSync):
    """veRL's V1 sync trainer with orch's filter, diagnostics, metrics and stop control (module docstring); orch's
    state, stops, checkpoints, cross-scoring and metrics are `recipes.verl.orch_base.OrchTrainerBase`'s, shared with
    the legacy trainer.

    Registered with veRL's `@register_trainer` as "orch_sync"; `trainer.v1.trainer_mode` itself stays "sync", because
    veRL's base class branches on that literal (trainer_base.py:153, 731, 902, 912, 1004, 1499)."""

    TRAINER = "v1"  # `verl.trainer`, written into orch's state file

    def __init__(self, config: Any, orch: dict[str, Any]) -> None:
        super().__init__(config, orch=orch)
        self.replay_buffer.trainer = self  # the custom sampler veRL built (trainer_base.py:131)
        self._training = False  # veRL's loop has begun (its validation before training is over)
        self._val_seen: list[tuple[Any, dict]] = []
        self._validated = False

    # -- set-up ----------------------------------------------------------------------------------------------------

    def _init_resource_pool_mgr(self) -> None:
        """veRL's resource pools, with orch's actor worker (veRL's `ActorRolloutRefWorker` + orch's cross-scoring
        and gradient-split methods): V1 hard-codes the worker class (trainer_base.py:805) and has no setting."""
        from recipes.verl.workers import OrchActorRolloutRefWorker

        super()._init_resource_pool_mgr()
        for role in (Role.ActorRollout, Role.ActorRolloutRef):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(OrchActorRolloutRefWorker)

    def on_init_end(self) -> None:
        super().on_init_end()  # the loaded weights to the replicas
        self.restore_state()  # resumed (veRL's _load_checkpoint, trainer_base.py:850): orch's state

    def fit(self, agent_loop_manager: Any) -> dict[str, Any]:  # noqa: D102  (veRL's loop; returns how it ended)
        return self.run_fit(lambda: super(OrchV1Trainer, self).fit(agent_loop_manager))

    def _wrap_logger(self) -> None:
        if not isinstance(self.logger, _Sink):
            self.logger = _Sink(self.logger, self._log)

    def on_train_begin(self) -> None:
        self._wrap_logger()
        self._training = True
        super().on_train_begin()

    # -- the step --------------------------------------------------------------------------------------------------

    def on_step_begin(self) -> None:
        """The step begins, before veRL draws its prompts (`prepare_step`): what a stop inside it rewinds to."""
        self._step_started = time.perf_counter()
        self.step_end = self.resume_point()  # the previous step's end (its validation included)
        report(step=int(self.global_steps), phase="rollout")
        super().on_step_begin()

    def resume_point(self) -> dict[str, Any]:
        """`OrchTrainerBase.resume_point`, taken on veRL's V1 dataloader at the step's beginning."""
        return {**super().resume_point(), "step": int(self.global_steps) - 1}

    def after_rollout(self, batch: KVBatchMeta) -> KVBatchMeta:
        """orch's step on the whole rollout, before any update: rewards per turn, statistics, hooks, the filter.
        Returns the kept groups' trajectories (the dropped ones are cleared from TransferQueue)."""
        self._stop_inside_step("rollout")  # the agent loops ended their episodes early: drop the step
        self.step_metrics, self.step_tags = {GEN_BATCHES: 1.0}, {}
        self.skip_update, self.advantage_scale = False, 1.0
        extras = extra_fields(fetch_extra(batch))
        place_turn_rewards(batch, extras)
        if self.cfg.algorithm.dynamic_sampling:
            batch, extras = dynamic_sampling(self, batch, extras)
        self.rollout_batch = batch  # the unfiltered batch, in trajectory order (the gradient split scores it)
        trajectories = [extra["orch_trajectory"] for extra in extras]
        generated: dict[str, list[int]] = {}
        for extra in extras:
            generated.update(extra.get("orch_generated") or {})
        keep = filtered_step(self, trajectories, generated, WorkerPolicyV1(self))
        if keep.any():
            lengths = [int(sum(extra_mask)) for extra_mask in response_masks(batch)]
            self.step_metrics["rollout/update_trajectories"] = float(keep.sum())
            self.step_metrics["rollout/update_tokens"] = float(sum(n for n, k in zip(lengths, keep, strict=True) if k))
        else:
            group_ids = np.array([t.seed for t in trajectories])
            keep = group_ids == group_ids[0]  # one group through veRL's phases; no update (`_update_actor`)
        return shrink(batch, keep)

    @property
    def encoder(self) -> Any:
        if not hasattr(self, "_encoder"):
            from recipes.policy.chat import ChatEncoder

            self._encoder = ChatEncoder(self.tokenizer)
        return self._encoder

    def _save_checkpoint(self) -> None:
        """veRL's checkpoint (orch's state beside it: `OrchCheckpointCallback`); a full disk is one error naming the
        step, its half-written folder removed (`writing_checkpoint`)."""
        with self.writing_checkpoint():
            super()._save_checkpoint()

    def _update_critic(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        self._stop_inside_step("log-prob, reference and value passes")  # the critic updates first: the last exit
        if self.skip_update:
            return batch
        return super()._update_critic(batch, metrics)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if not self.use_critic:
            self._stop_inside_step("log-prob and reference passes")
        report(phase="update")
        self.step_metrics["rollout/pad_trajectories"] = float(sum(bool(t.get("is_padding")) for t in batch.tags))
        if self.skip_update:
            return batch
        if self.advantage_scale != 1.0:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["advantages"])
            scaled = TensorDict({"advantages": scaled_advantages(data["advantages"], self.advantage_scale)},
                                batch_size=len(batch))
            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=scaled)
        return super()._update_actor(batch, metrics)

    def on_step_end(self) -> None:
        """The step's work is done (checkpointed by veRL when due), its metrics not yet logged: a requested stop
        (the stop file), the time limit, or a decided one checkpoint it; `_log` ends the run once it is logged."""
        super().on_step_end()  # the new weights to the rollout replicas
        self.stop_at_step_end()

    # -- validation ------------------------------------------------------------------------------------------------

    def on_validate_begin(self) -> None:
        self._wrap_logger()
        report(phase="validation")
        self._val_seen = []
        super().on_validate_begin()

    def saw_validation(self, batch: KVBatchMeta) -> None:
        """The validation episodes of one val batch (partition "val"), as the sampler hands them over."""
        for extra in extra_fields(fetch_extra(batch)):
            self._val_seen.append((extra["orch_trajectory"], extra.get("orch_generated") or {}))

    def on_validate_end(self) -> None:
        from recipes.stats.rollout_stats import validation_metrics

        if Path(self.orch["stop_file"]).exists():
            self._validation_stopped()
            super().on_validate_end()
            return
        self.validation_pending = False
        generated: dict[str, list[int]] = {}
        for _, seen in self._val_seen:
            generated.update(seen)
        self.validation = validation_metrics([t for t, _ in self._val_seen], generated)
        self._validated = True
        self.keep_if_best()
        super().on_validate_end()

    def _validation_stopped(self) -> None:
        """A stop requested during a validation: its episodes ended at their current turn (the agent loop), so
        nothing of it is kept (no `val/*`, no best checkpoint), as on the legacy path. veRL's validation before
        training ends the run at once; a step's validation (V1 runs it after `on_step_end`) marks the step's
        checkpoint `validation_pending` (saved now if it had none), the run ends `preempted` once the step is logged,
        and the resume runs that validation first, logged at that step."""
        self._val_seen = []
        step = int(self.global_steps)
        if not self._training:
            where = f"checkpoint at step {step}" if step > 0 else "no step done, nothing to checkpoint"
            raise Stop("preempted", f"stop requested during the validation before training; {where}")
        log.info("step %d: stop requested during validation; it runs first on resume", step)
        self.validation_pending = True
        if self.pending_stop is None:
            self.pending_stop = Stop("preempted", f"stop requested; checkpoint at step {step}")
        if self._checkpointed_step() != step:
            self._save_checkpoint()
        else:  # saved by veRL or `on_step_end` before the validation: mark it there
            self.write_state(Path(self.config.trainer.default_local_dir) / f"global_step_{step}")

    # -- cross-scoring (the MI diagnostics), through the actor workers: `OrchTrainerBase.cross_score` ---------------

    def cross_score(self, prompts: list[list[int]], samples: list[list[int]]) -> Any:
        if self.cfg.diagnostics.method != "prefix":
            raise NotImplementedError("diagnostics.method=naive is not on the V1 path yet")
        return super().cross_score(prompts, samples)

    # -- metrics ---------------------------------------------------------------------------------------------------

    def _log(self, data: dict[str, Any], step: int) -> None:
        """Every metric veRL logs into the cell's MLflow run, orch's values over veRL's, orch's `val/*` for veRL's
        validation metrics; the legacy path's rules for re-run steps and its one line per step."""
        metrics = {key: scalar(value) for key, value in data.items() if not key.startswith(VERL_VAL_PREFIXES)}
        in_step = "training/global_step" in data  # veRL's step log; the validation before training has none
        if self._validated:
            metrics.update(self.validation)
            self._validated = False
        self.log_step(metrics, step, in_step)


class WorkerPolicyV1:
    """`recipes.diagnostics.hooks.PolicyAccess` on the V1 path: cross-scoring and the gradient split through the
    actor workers, over the step's unfiltered batch (`OrchV1Trainer.rollout_batch`)."""

    def __init__(self, trainer: OrchV1Trainer) -> None:
        self.trainer = trainer

    def cross_score(self, prompts: list[Any], samples: list[list[int]]) -> Any:
        return self.trainer.cross_score(prompts, samples)

    def gradient_norms(self, row_sets: list[np.ndarray]) -> list[dict[str, float]]:
        return gradient_norms(self.trainer, self.trainer.rollout_batch, row_sets)


def gradient_norms(trainer: OrchV1Trainer, batch: KVBatchMeta, row_sets: list[np.ndarray]) -> list[dict[str, float]]:
    """`PolicyAccess.gradient_norms` on the V1 path, the legacy path's split
    (`recipes.verl.trainer.OrchPPOTrainer.gradient_norms`): the unfiltered `batch` scored as V1's step scores its
    update batch (`scored`), then per row set the actor workers' `orch_gradient_norms` (recipes.verl.workers) on those rows of TransferQueue, every row normalised by the whole
    batch. Nothing is applied. A row set is padded to the actor's data-parallel size with veRL's no-op rows (response
    mask 0), scored with the batch."""
    dp = actor_dp_size(trainer)
    count = (-len(batch)) % dp  # pads: the scored batch a multiple of dp, with at least dp - 1 of them
    padded = scored(trainer, batch, pads=count + dp if count < dp - 1 else count)
    pads = padded.keys[len(batch):]
    try:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        tokens = float(sum(int(mask.sum()) for mask in data["response_mask"].unbind()))
        norms = []
        for row_set in row_sets:
            rows = [int(row) for row in row_set]
            extra = pads[: (-len(rows)) % dp]
            part = KVBatchMeta(partition_id=batch.partition_id, keys=[batch.keys[row] for row in rows] + extra,
                               tags=[batch.tags[row] for row in rows] + padded.tags[len(batch):][: len(extra)])
            part.extra_info.update({"orch_batch_num_tokens": tokens, "orch_global_batch_size": len(batch),
                                    "calculate_entropy": True, "compute_loss": True,
                                    "temperature": trainer.config.actor_rollout_ref.rollout.temperature})
            metrics = tu.get(trainer.actor_rollout_wg.orch_gradient_norms(part), "metrics")
            norms.append(metrics[0] if isinstance(metrics, list) else metrics)
    finally:
        if pads:
            tq.kv_clear(keys=pads, partition_id=batch.partition_id)
    return norms


def scored(trainer: OrchV1Trainer, batch: KVBatchMeta, pads: int) -> KVBatchMeta:
    """`batch` (and `pads` of veRL's no-op rows after it, `upsample_batch_to_divisible_size`) with old log-probs,
    reference log-probs, values and advantages in TransferQueue, by V1's own step calls (trainer_base.py:586-600:
    `_compute_old_log_prob`, `_compute_ref_log_prob`, `_compute_values`, `_compute_advantage`, over all groups; orch
    never puts a KL penalty in the reward). They write under the batch's own keys: the step computes them again for
    the rows the filter keeps (at the same policy: nothing is updated in between), so the update reads its own."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    copy = KVBatchMeta(partition_id=batch.partition_id, keys=list(batch.keys), tags=list(batch.tags))
    if pads:
        copy = upsample_batch_to_divisible_size(copy, len(copy) + pads, trainer.tokenizer.eos_token_id)
    metrics: dict[str, Any] = {}  # the step logs its own
    copy = trainer._compute_old_log_prob(copy, metrics)
    if trainer.use_reference_policy:
        copy = trainer._compute_ref_log_prob(copy, metrics)
    if trainer.use_critic:
        copy = trainer._compute_values(copy, metrics)
    return trainer._compute_advantage(copy, metrics)


def actor_dp_size(trainer: OrchV1Trainer) -> int:
    """The actor's data-parallel ranks, as V1's `_balance_batch` reads them (trainer_base.py:1610-1617)."""
    group = trainer.actor_rollout_wg
    if "actor" not in group._dispatch_info:
        group._dispatch_info["actor"] = group._query_dispatch_info("actor")
    return max(group._dispatch_info["actor"]) + 1


def response_masks(batch: KVBatchMeta) -> list[list[int]]:
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
    return [row.tolist() for row in data["response_mask"].unbind()]


def place_turn_rewards(batch: KVBatchMeta, extras: list[dict[str, Any]]) -> None:
    """Each turn's reward on the last token of its reply (`rm_scores`, which veRL turns into token-level rewards),
    as the torch backend and the legacy path place them; veRL put the episode return on the last token."""
    rows = [turn_scores(int(tag["response_len"]), extra["orch_turn_ends"], extra["orch_turn_rewards"])
            for tag, extra in zip(batch.tags, extras, strict=True)]
    nested = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                    fields=TensorDict({"rm_scores": nested}, batch_size=len(rows)))


def shrink(batch: KVBatchMeta, keep: np.ndarray) -> KVBatchMeta:
    """The batch of the kept trajectories; the others are cleared from TransferQueue."""
    dropped = [key for key, kept in zip(batch.keys, keep, strict=True) if not kept]
    if dropped:
        tq.kv_clear(keys=dropped, partition_id=batch.partition_id)
    return KVBatchMeta(partition_id=batch.partition_id,
                       keys=[key for key, kept in zip(batch.keys, keep, strict=True) if kept],
                       tags=[tag for tag, kept in zip(batch.tags, keep, strict=True) if kept])


class OrchAgentLoopManager(AgentLoopManagerTQ):
    """veRL's V1 agent-loop manager (the class veRL's `TaskRunnerV1` creates, main_ppo.py:152-156; orch's TaskRunner
    creates this one) with the planted-collapse control: every prompt batch the trainer dispatches goes through
    the public `generate_sequences` (trainer_base.py:1510 for training, 1070 for validation), where a planted
    step's training prompts get their marks (`mark_blinded`) before the agent loops start. The legacy path marks
    them in its override of `_get_gen_batch`; V1 builds the batch in `_next_train_batch` (1479-1494), no hook."""

    def generate_sequences(self, prompts: TensorDict) -> None:
        mark_blinded(prompts, train_config(self.config))
        return super().generate_sequences(prompts)


def mark_blinded(prompts: TensorDict, cfg: Any) -> None:
    """CONTROL (`control.blind_from_step`, `control.blind_strength`): from that step on, a training batch's prompts
    carry the legacy path's marks (`recipes.verl.agent_loop.blind_marks`: the step's first seed, and which of a
    prompt's samples are blinded), in place; validation batches and earlier steps are left alone. The step is the
    one veRL stamps on the batch (`global_steps`, trainer_base.py:1493)."""
    control = cfg.control
    if not control.blind_from_step or tu.get(prompts, "validate", False):
        return
    step = int(tu.get(prompts, "global_steps", 0))
    infos = tu.get(prompts, "extra_info")
    if step < control.blind_from_step or not infos or infos[0].get("split") == "val":
        return
    tu.assign_non_tensor_stack(prompts, "extra_info", blind_marks(
        list(infos), cfg.trainer.samples_per_prompt, control.blind_strength, cfg.seed, step))


def dynamic_sampling(trainer: OrchV1Trainer, batch: KVBatchMeta,
                     extras: list[dict[str, Any]]) -> tuple[KVBatchMeta, list[dict[str, Any]]]:
    """DAPO's dynamic sampling, the rule of every backend (`recipes.stats.dynamic_sampling.gather_groups`): the
    groups with reward variance of the step's batch and of up to `algorithm.max_extra_gen_batches` extra
    generation batches of orch's seeds (`extra_batch`), gathered and cut to the step's prompts. Not V1's own refill
    (`algorithm.filter_groups`: evict k, refill 2k from veRL's dataloader, replay_buffer.py:104-114, 469-486),
    which draws other prompts. Returns the batch (each generation batch's kept groups in turn; every other row
    cleared from TransferQueue) and its rows' extra fields."""

    def group_ids(keys: list[str]) -> np.ndarray:
        return np.array([key.split("_")[0] for key in keys])

    def returns(rows: list[dict[str, Any]]) -> list[float]:
        return [row["orch_trajectory"].episode_return for row in rows]

    step, cap = int(trainer.global_steps), trainer.cfg.algorithm.max_extra_gen_batches

    def batches() -> Any:
        yield (batch, extras), returns(extras), group_ids(batch.keys)
        for extra in range(1, cap + 1):
            fresh = extra_batch(trainer, step, extra)
            fresh_extras = extra_fields(fetch_extra(fresh))
            place_turn_rewards(fresh, fresh_extras)
            yield (fresh, fresh_extras), returns(fresh_extras), group_ids(fresh.keys)

    gathered = gather_groups(batches(), trainer.cfg.trainer.prompts_per_step, cap + 1)
    keys, tags, rows = [], [], []
    for (part, part_extras), keep in gathered.parts:
        kept = shrink(part, keep)
        keys, tags = keys + kept.keys, tags + kept.tags
        rows += [row for row, k in zip(part_extras, keep, strict=True) if k]
    trainer.step_metrics.update(gathered.metrics())
    return KVBatchMeta(partition_id=batch.partition_id, keys=keys, tags=tags), rows


def extra_batch(trainer: OrchV1Trainer, step: int, extra: int) -> KVBatchMeta:
    """DAPO's extra generation batch `extra` of `step` (the legacy path's prompts: `recipes.verl.data`, the
    `orch.extra_file` rows of that step and batch), generated by the rollout replicas, which are awake while the
    sampler waits (V1's sync trainer sleeps them after `sample`, trainer_sync.py:40-42), and waited for by veRL's
    own sync sampling: the step's first batch is out of TransferQueue's prompt list by then
    (`_materialize_batch`), so the replay buffer hands back these prompts' groups alone."""
    import uuid

    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    if getattr(trainer, "extra_dataset", None) is None:
        trainer.extra_dataset = RLHFDataset(trainer.config.orch.extra_file, trainer.tokenizer, trainer.config.data,
                                            trainer.processor)
    prompts = trainer.config.data.train_batch_size
    first = ((step - 1) * trainer.cfg.algorithm.max_extra_gen_batches + extra - 1) * prompts
    rows = collate_fn([trainer.extra_dataset[first + i] for i in range(prompts)])
    rows["uid"] = np.array([str(uuid.uuid4()) for _ in range(prompts)], dtype=object)
    batch = tu.get_tensordict(rows)
    tu.assign_non_tensor_data(batch, "global_steps", step)
    # registered as veRL's sync trainer registers a batch (trainer_base.py:1496-1512; the replay buffer's documented
    # prompt tags, replay_buffer.py:85-92), then dispatched through the manager's public method
    tq.kv_batch_put(keys=list(rows["uid"]), partition_id="train",
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": step} for _ in range(prompts)])
    trainer.agent_loop_manager.generate_sequences(batch)
    fresh, _ = ReplayBuffer.sample(trainer.replay_buffer, global_steps=step, partition_id="train", batch_size=prompts)
    return ordered(fresh)
