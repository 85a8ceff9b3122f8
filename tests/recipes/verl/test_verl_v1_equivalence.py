"""Issue #50 item 2: on one fixed rollout batch, the V1 path (`verl.trainer: v1`) and the legacy path keep the same
groups, compute the same advantages and the same loss; and what dropping the filtered groups (orch, RAGEN) changes
against masking them (verl#7894).

The batch: 4 prompts x 4 samples, two replies per trajectory with an observation between them (response mask 0 on
it), each turn's reward on its reply's last token. Each path runs its own code on it, without Ray and without a
model; line numbers are veRL 0.9.1's (`verl/`):

* legacy: `OrchPPOTrainer._orch_step` (what its `_balance_batch` override runs first: the turn rewards, the filter
  `recipes.stats.filtering.filter_step`, `keep_rows` with orch's no-op rows), then what `RayPPOTrainer.fit` does with
  the batch (`trainer/ppo/ray_trainer.py:1568, 1633, 1645, 1663-1675`: `rm_scores` as token-level scores and rewards,
  `compute_advantage`), then `OrchPPOTrainer._update_actor` (the filter's loss scale on the advantages).
* V1: orch's sampler step (`ordered`, `OrchV1Trainer.after_rollout`: the same turn rewards and filter, the dropped
  groups cleared), veRL's `PPOTrainer._balance_batch` (`trainer/ppo/v1/trainer_base.py:1608-1631`, which pads with
  `upsample_batch_to_divisible_size`, `trainer/ppo/padding_utils.py:144-215`), veRL's `_compute_advantage`
  (`trainer_base.py:1743-1802`, calling `compute_advantage_for_multi_trajectories`, `trainer/ppo/v1/utils.py:148-217`),
  then `OrchV1Trainer._update_actor`. The rows live in a key-value store with TransferQueue's three calls
  (`kv_batch_put`, `kv_batch_get`, `kv_clear`), each `get` building its fields with veRL's
  `list_of_dict_to_tensordict` as V1's agent loop puts them (`trainer/ppo/v1/agent_loop_tq.py:222-227`): jagged
  tensors where row shapes differ. `test_the_store_answers_as_transfer_queue` (slow: a local Ray) runs the V1 side
  through real TransferQueue 0.1.11 and gets the same advantages.

The loss is veRL's policy loss (`core_algos.get_policy_loss_fn("vanilla")`, `trainer/ppo/core_algos.py:1286-1376`)
normalised as veRL's actor worker normalises one mini-batch (`workers/utils/losses.py:65-68`: `batch_num_tokens`, the
mini-batch's loss-mask tokens, `workers/engine/fsdp/transformer_impl.py:729-734`; `global_batch_size`, the configured
mini-batch rows, `ray_trainer.py:1352-1362` and `trainer_base.py:1845-1851`), on fixed per-token log-probs.

Tolerance: float32 throughout, as veRL computes. The two paths hold the kept rows in other orders and with other
padding rows (legacy: copies of the first row; V1: one 128-token EOS row each), so the sums inside the GRPO group
statistics, GAE's whitening and the loss run in other orders and widths: equal up to float32 rounding, not
bit-for-bit. A float32 sum of n <= 64 terms of magnitude <= 1 is off by at most about n * 2**-24 ~ 4e-6 relative;
asserted: rtol 1e-5, atol 1e-6 (measured: at most 6e-8 on an advantage, 1.5e-8 on a loss; `-s` prints them).

What is equal, and what is not (veRL 0.9.1's actor normalises token-mean by each mini-batch's tokens and seq-mean-*
by the configured mini-batch rows): with the update in one mini-batch, the two paths give the same loss and gradient,
and so do dropping and masking under token-mean and seq-mean-token-mean alike. With several mini-batches per step the
rows are grouped into mini-batches differently (by veRL's two `_balance_batch`s; by masking's larger batch), which
changes token-mean's summed gradient (measured here: |difference| / |gradient| 0.32 between the paths, 1.09 and
1.52 between masking and dropping) and leaves seq-mean-token-mean's equal.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from recipes.config.schema import compose_train_config
from tests.recipes.conftest import MICRO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                                reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")

N = 4  # samples per prompt
# prompt seed -> the episode returns of its 4 trajectories; unbiased reward std 0.5, 0.577, 0 and 0.854
RETURNS = {10: (1.0, 0.0, 0.0, 0.0), 11: (1.0, 1.0, 0.0, 0.0), 12: (0.0, 0.0, 0.0, 0.0), 13: (2.0, 0.5, 1.0, 0.0)}
EOS = 2
RTOL, ATOL = 1e-5, 1e-6
MEASURED: dict[str, float] = {}  # largest |legacy - V1| per quantity, over every case


@dataclass
class Row:
    key: str  # V1's TransferQueue key, `{uid}_{session}_{index}` (agent_loop_tq.py:179-183)
    uid: str
    seed: int
    prompt: list[int]
    response: list[int]
    mask: list[int]
    turn_ends: list[int]
    turn_rewards: list[float]
    trajectory: Any
    old_log_probs: torch.Tensor  # what the actor's old-log-prob pass would give (fixed here)
    log_probs: torch.Tensor  # the current policy's, in the update (fixed here)
    values: torch.Tensor  # the critic's (GAE)


def fixed_rows() -> list[Row]:
    """The fixed batch, in the legacy row order (prompt x n + sample)."""
    from envs.trajectory import Trajectory, Turn

    gen = torch.Generator().manual_seed(0)
    rows = []
    for seed, returns in RETURNS.items():
        for sample, episode_return in enumerate(returns):
            first, observation, second = 2 + sample % 2, 2, 2 + (seed + sample) % 3
            length = first + observation + second
            rewards = [0.25 * episode_return, 0.75 * episode_return]
            turns = [Turn(prompt_messages=[], response=f"reply {seed}.{sample}.{t}", reasoning="", actions=[],
                          reward=reward, format_valid=True) for t, reward in enumerate(rewards)]
            old = -1.0 - torch.rand(length, generator=gen)
            rows.append(Row(
                key=f"p{seed}_{sample}_0", uid=f"p{seed}", seed=seed, prompt=list(range(10, 13 + seed % 2)),
                response=list(range(20, 20 + length)), mask=[1] * first + [0] * observation + [1] * second,
                turn_ends=[first - 1, length - 1], turn_rewards=rewards,
                trajectory=Trajectory(task="fixed", seed=seed, messages=[], turns=turns, success=episode_return > 0),
                old_log_probs=old, log_probs=old + 0.8 * (torch.rand(length, generator=gen) - 0.5),
                values=torch.randn(length, generator=gen)))
    return rows


def generated(row: Row) -> dict[str, list[int]]:
    return {turn.response: [7] * (2 + i) for i, turn in enumerate(row.trajectory.turns)}


def train_config(algorithm: str, filter_overrides: list[str], mini_batch_size: int = 16) -> Any:
    return compose_train_config([
        *MICRO, "backend=verl", f"algorithm={algorithm}", "trainer.prompts_per_step=4",
        f"trainer.samples_per_prompt={N}", f"trainer.mini_batch_size={mini_batch_size}", "trainer.dump_every=0",
        "trainer.max_empty_steps=0", *filter_overrides])


def verl_config(cfg: Any) -> Any:
    """The keys of veRL's config both paths read here, with the values orch maps (recipes.verl.config_map)."""
    from omegaconf import OmegaConf

    from recipes.policy.algorithms import get_algorithm

    algorithm = cfg.algorithm
    mini = max(1, cfg.trainer.mini_batch_size // cfg.trainer.samples_per_prompt)
    return OmegaConf.create({
        "algorithm": {"adv_estimator": get_algorithm(algorithm.name).verl_estimator, "gamma": algorithm.gamma,
                      "lam": algorithm.lam, "norm_adv_by_std_in_grpo": algorithm.norm_adv_by_std,
                      "use_kl_in_reward": False},
        "actor_rollout_ref": {
            "rollout": {"n": cfg.trainer.samples_per_prompt, "temperature": 1.0, "multi_turn": {"enable": True},
                        "calculate_log_probs": False},
            "actor": {"ppo_mini_batch_size": mini, "ppo_epochs": 1, "data_loader_seed": 0, "shuffle": False,
                      "calculate_entropy": False, "entropy_coeff": 0.0}},
        "critic": {"ppo_mini_batch_size": mini},
        "trainer": {"critic_warmup": 0},
    })


class Workers:
    """The actor worker group as both trainers' `_update_actor` and batch sizing call it (one data-parallel rank)."""

    def __init__(self) -> None:
        self._dispatch_info = {"actor": [0]}
        self.updates: list[Any] = []

    def update_actor(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        self.updates.append(data)
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"mfu": 0.0}})


def trainer_state(trainer: Any, cfg: Any, tmp_path: Any) -> Any:
    """What orch's step reads of a trainer (set by its `__init__`, which starts workers: not run here)."""
    trainer.cfg, trainer.config, trainer.global_steps = cfg, verl_config(cfg), 1
    trainer.orch = {"stop_file": str(tmp_path / "stop")}
    trainer.hooks, trainer.validation, trainer.empty_steps, trainer.pending_stop = {}, {}, 0, None
    trainer.step_metrics, trainer.step_tags, trainer.skip_update, trainer.advantage_scale = {}, {}, False, 1.0
    trainer.tracker = None  # the run's MLflow run: only a step that dumps its rollout table writes to it
    trainer.use_critic = cfg.algorithm.name == "ppo"
    trainer.actor_rollout_wg = Workers()
    trainer.tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=EOS)
    return trainer


# -- the legacy path ---------------------------------------------------------------------------------------------------

def legacy_batch(rows: list[Row]) -> Any:
    """The rollout as the legacy fit loop holds it after the agent loop (prompts left-padded, responses right-padded,
    veRL's reward of the episode on the last response token)."""
    from verl import DataProto

    width_p, width_r = max(len(r.prompt) for r in rows), max(len(r.response) for r in rows)
    prompts = torch.full((len(rows), width_p), EOS)
    responses = torch.full((len(rows), width_r), EOS)
    prompt_mask = torch.zeros_like(prompts)
    response_mask = torch.zeros_like(responses)
    attention_response = torch.zeros_like(responses)
    rm_scores = torch.zeros(len(rows), width_r)
    for i, row in enumerate(rows):
        prompts[i, width_p - len(row.prompt):] = torch.tensor(row.prompt)
        prompt_mask[i, width_p - len(row.prompt):] = 1
        responses[i, :len(row.response)] = torch.tensor(row.response)
        response_mask[i, :len(row.mask)] = torch.tensor(row.mask)
        attention_response[i, :len(row.response)] = 1
        rm_scores[i, len(row.response) - 1] = row.trajectory.episode_return
    attention = torch.cat([prompt_mask, attention_response], dim=1)
    return DataProto.from_single_dict({
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention, "position_ids": torch.clamp(attention.cumsum(-1) - 1, min=0),
        "response_mask": response_mask, "rm_scores": rm_scores,
        "uid": np.array([r.uid for r in rows], dtype=object),
        "row_key": np.array([r.key for r in rows], dtype=object),
        "orch_trajectory": np.array([r.trajectory for r in rows], dtype=object),
        "orch_turn_ends": np.array([r.turn_ends for r in rows], dtype=object),
        "orch_turn_rewards": np.array([r.turn_rewards for r in rows], dtype=object),
        "orch_generated": np.array([generated(r) for r in rows], dtype=object)})


def per_row(rows: list[Row], keys: list[str], field: str, width: int) -> torch.Tensor:
    """`field` of each row by key, right-padded to `width`; a padding row (no fixed row) gets noise, which must not
    matter."""
    by_key = {r.key: r for r in rows}
    out = torch.randn(len(keys), width) * 5.0
    for i, key in enumerate(keys):
        if key in by_key:
            value = getattr(by_key[key], field)
            out[i] = 0.0
            out[i, :len(value)] = value
    return out


def run_legacy(rows: list[Row], cfg: Any, tmp_path: Any) -> dict[str, Any]:
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from recipes.verl.trainer import OrchPPOTrainer

    trainer = trainer_state(OrchPPOTrainer.__new__(OrchPPOTrainer), cfg, tmp_path)
    trainer.encoder = None
    batch = legacy_batch(rows)
    metrics: dict[str, float] = {}
    trainer._balance_batch(batch, metrics)  # orch's step (`_orch_step`), then veRL's reorder (ray_trainer.py:1182-1250)
    keys = [str(k) if not str(u).startswith("orch-pad-") else f"pad{i}"
            for i, (k, u) in enumerate(zip(batch.non_tensor_batch["row_key"], batch.non_tensor_batch["uid"],
                                           strict=True))]
    width = batch.batch["responses"].shape[1]
    batch.batch["old_log_probs"] = per_row(rows, keys, "old_log_probs", width)  # `_compute_old_log_prob`
    if trainer.use_critic:
        batch.batch["values"] = per_row(rows, keys, "values", width)  # `_compute_values`
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]  # ray_trainer.py:1568 (extract_reward), 1633
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]  # 1645 (no KL in the reward)
    algorithm = trainer.config.algorithm
    batch = compute_advantage(batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma,  # 1663-1675
                              lam=algorithm.lam, num_repeat=trainer.config.actor_rollout_ref.rollout.n,
                              norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
                              config=algorithm)
    trainer._update_actor(batch)
    assert len(trainer.actor_rollout_wg.updates) == 1
    return {"keys": keys, "advantages": batch.batch["advantages"], "response_mask": batch.batch["response_mask"],
            "old_log_probs": batch.batch["old_log_probs"], "metrics": trainer.step_metrics,
            "scale": trainer.advantage_scale}


# -- the V1 path -------------------------------------------------------------------------------------------------------

class Store:
    """TransferQueue's key-value calls as veRL's V1 trainer and orch's sampler use them, in memory: `kv_batch_put`
    keeps each row's fields (and tags), `kv_batch_get` returns the asked fields of the asked keys, built as V1's agent
    loop builds what it puts (`list_of_dict_to_tensordict`: stacked where the rows' shapes agree, jagged where they
    differ, non-tensors as a NonTensorStack), `kv_clear` forgets keys."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any = None, tags: Any = None) -> None:
        from verl.utils import tensordict_utils as tu

        for name in (fields.keys() if fields is not None else ()):
            value = tu.get(fields, name)
            if isinstance(value, torch.Tensor):
                value = list(value.unbind()) if value.is_nested else list(value.unbind(0))
            elif not isinstance(value, list):
                value = [value] * len(keys)
            for key, item in zip(keys, value, strict=True):
                self.rows.setdefault((partition_id, key), {})[name] = item

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: Any = None) -> Any:
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        rows = [self.rows[(partition_id, key)] for key in keys]
        names = [name for name in (select_fields or rows[0]) if all(name in row for row in rows)]
        return list_of_dict_to_tensordict([{name: row[name] for name in names} for row in rows])

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for key in keys:
            self.rows.pop((partition_id, key))


@contextlib.contextmanager
def in_memory() -> Iterator[Store]:
    """A fresh `Store` as TransferQueue for orch's V1 code and veRL's V1 trainer and padding."""
    import verl.trainer.ppo.padding_utils as padding_utils
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    from recipes.verl import v1

    store = Store()
    with pytest.MonkeyPatch.context() as patched:
        for module in (v1, padding_utils, trainer_base):
            patched.setattr(module, "tq", store)
        yield store


def v1_put(tq: Any, rows: list[Row], partition: str = "train") -> Any:
    """The rollout as V1's agent loop puts it into TransferQueue (agent_loop_tq.py:179-227), in a shuffled order, as
    the replay buffer hands it over; veRL's reward of the episode on the last response token."""
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    order = list(range(len(rows)))
    random.Random(1).shuffle(order)
    shuffled = [rows[i] for i in order]
    fields, tags = [], []
    for row in shuffled:
        prompts, responses = torch.tensor(row.prompt), torch.tensor(row.response)
        input_ids = torch.cat([prompts, responses])
        rm_scores = torch.zeros(len(row.response))
        rm_scores[-1] = row.trajectory.episode_return
        fields.append({
            "prompts": prompts, "responses": responses, "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids), "position_ids": torch.arange(len(input_ids)),
            "response_mask": torch.tensor(row.mask), "loss_mask": torch.tensor(row.mask), "rm_scores": rm_scores,
            "uid": row.uid, "extra_fields": {"orch_trajectory": row.trajectory, "orch_turn_ends": row.turn_ends,
                                             "orch_turn_rewards": row.turn_rewards, "orch_generated": generated(row)}})
        tags.append({"status": "success", "prompt_len": len(row.prompt), "response_len": len(row.response),
                     "seq_len": len(row.prompt) + len(row.response), "global_steps": 1})
    keys = [row.key for row in shuffled]
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags)
    return KVBatchMeta(partition_id=partition, keys=keys, tags=tags)


def put_per_row(tq: Any, batch: Any, rows: list[Row], field: str, name: str) -> None:
    """A pass's output per row into TransferQueue (jagged, each row's response length), as V1's `_compute_old_log_prob`
    and `_compute_values` write theirs (trainer_base.py:1667-1671, 1738-1739)."""
    from tensordict import TensorDict

    lengths = [int(tag["response_len"]) for tag in batch.tags]
    padded = per_row(rows, batch.keys, field, max(lengths))
    nested = torch.nested.as_nested_tensor([padded[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged)
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                    fields=TensorDict({name: nested}, batch_size=len(batch)))


def run_v1(rows: list[Row], cfg: Any, tmp_path: Any, tq: Any, partition: str = "train") -> dict[str, Any]:
    from recipes.verl.v1 import OrchV1Trainer, ordered

    trainer = trainer_state(OrchV1Trainer.__new__(OrchV1Trainer), cfg, tmp_path)
    trainer._encoder = None
    metrics: dict[str, float] = {}
    batch = ordered(v1_put(tq, rows, partition))  # OrchSampler.sample
    batch = trainer.after_rollout(batch)
    batch = trainer._balance_batch(batch, metrics)  # trainer_base.py:582
    put_per_row(tq, batch, rows, "old_log_probs", "old_log_probs")  # 586
    if trainer.use_critic:
        put_per_row(tq, batch, rows, "values", "values")  # 596
    trainer._compute_advantage(batch, metrics)  # 600
    trainer._update_actor(batch, metrics)  # 608-610
    assert len(trainer.actor_rollout_wg.updates) == 1
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["advantages", "response_mask", "old_log_probs"]).to_padded_tensor()
    keys = [key if not tag.get("is_padding") else f"pad{i}" for i, (key, tag) in enumerate(zip(batch.keys, batch.tags,
                                                                                                 strict=True))]
    return {"keys": keys, "advantages": data["advantages"], "response_mask": data["response_mask"],
            "old_log_probs": data["old_log_probs"], "metrics": trainer.step_metrics, "scale": trainer.advantage_scale}


# -- the loss ----------------------------------------------------------------------------------------------------------

def actor_config(loss_agg_mode: str) -> Any:
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(strategy="fsdp2", ppo_mini_batch_size=4, use_dynamic_bsz=True,
                           ppo_max_token_len_per_gpu=1024, rollout_n=N, loss_agg_mode=loss_agg_mode)


def update_loss(path: dict[str, Any], rows: list[Row], loss_agg_mode: str, mini_rows: int) -> dict[str, Any]:
    """veRL's policy loss of the update batch `path` holds, mini-batch by mini-batch in the path's row order (as
    veRL's actor worker splits it, `workers/engine_workers.py:243-300`, unshuffled): each mini-batch's loss, and each
    row's gradient by its current log-probs summed over the mini-batches whose loss is finite (veRL skips the
    optimizer step of a non-finite gradient, `workers/engine/fsdp/transformer_impl.py:822-825`)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    config = actor_config(loss_agg_mode)
    keys, mask = path["keys"], path["response_mask"].bool()
    log_probs = per_row(rows, keys, "log_probs", mask.shape[1])
    grads, losses = torch.zeros_like(log_probs), []
    for start in range(0, len(keys), mini_rows):
        part = slice(start, start + mini_rows)
        leaf = log_probs[part].clone().requires_grad_(True)
        config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask[part].sum()),
                                        global_batch_size=mini_rows, loss_scale_factor=None)  # losses.py:65-68
        loss, _ = get_policy_loss_fn("vanilla")(
            old_log_prob=path["old_log_probs"][part], log_prob=leaf, advantages=path["advantages"][part],
            response_mask=mask[part], loss_agg_mode=loss_agg_mode, config=config, rollout_is_weights=None)
        losses.append(float(loss.detach()))
        if math.isfinite(losses[-1]):
            loss.backward()
            grads[part] += leaf.grad
    return {"losses": losses, "loss": sum(x for x in losses if math.isfinite(x)),
            "grads": {key: grads[i] for i, key in enumerate(keys)}}


def masked_path(rows: list[Row], cfg: Any, kept: set[str], tmp_path: Any) -> dict[str, Any]:
    """verl#7894's semantics on the same batch: every trajectory stays, the filtered groups' response masks are
    zeroed before the advantages (rewards untouched), the advantages computed over the whole batch as the legacy fit
    loop computes them; no loss scale."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage

    from recipes.verl.trainer import OrchPPOTrainer, place_turn_rewards

    batch = legacy_batch(rows)
    place_turn_rewards(batch)
    dropped = torch.tensor([uid not in kept for uid in batch.non_tensor_batch["uid"]])
    batch.batch["response_mask"][dropped] = 0
    trainer = trainer_state(OrchPPOTrainer.__new__(OrchPPOTrainer), cfg, tmp_path)
    RayPPOTrainer._balance_batch(trainer, batch, {})  # as the legacy fit loop orders its batch (ray_trainer.py:1182)
    keys = [str(k) for k in batch.non_tensor_batch["row_key"]]
    batch.batch["old_log_probs"] = per_row(rows, keys, "old_log_probs", batch.batch["responses"].shape[1])
    batch.batch["token_level_scores"] = batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    algorithm = verl_config(cfg).algorithm
    batch = compute_advantage(batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
                              num_repeat=N, norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
                              config=algorithm)
    return {"keys": keys, "advantages": batch.batch["advantages"], "response_mask": batch.batch["response_mask"],
            "old_log_probs": batch.batch["old_log_probs"]}


# -- the tests ---------------------------------------------------------------------------------------------------------

def kept_uids(path: dict[str, Any]) -> set[str]:
    return {key.split("_")[0] for key in path["keys"] if not key.startswith("pad")}


def by_key(path: dict[str, Any], name: str) -> dict[str, torch.Tensor]:
    """`name` of each kept trajectory on its response tokens (response mask 1)."""
    mask = path["response_mask"].bool()
    return {key: path[name][i][mask[i]] for i, key in enumerate(path["keys"]) if not key.startswith("pad")}


def close(legacy: dict[str, torch.Tensor], v1: dict[str, torch.Tensor], what: str) -> None:
    assert legacy.keys() == v1.keys()
    worst = max(float((legacy[k] - v1[k]).abs().max()) for k in legacy)
    MEASURED[what] = max(MEASURED.get(what, 0.0), worst)
    for key in legacy:
        torch.testing.assert_close(v1[key], legacy[key], rtol=RTOL, atol=ATOL, msg=lambda m, k=key: f"{what} {k}: {m}")


FILTERS = [  # (filter overrides, the prompts kept: by hand from the reward std, p13 0.854 > p11 0.577 > p10 0.5 > p12 0)
    (["filter=top_p", "filter.value=0.6", "filter.include_zero=false"], {"p13", "p11"}),
    (["filter=top_p", "filter.value=0.6", "filter.include_zero=true"], {"p13", "p11"}),
    (["filter=top_k", "filter.value=0.5", "filter.include_zero=true", "filter.loss_scaling=linear"], {"p13", "p11"}),
    (["filter=top_k", "filter.value=1.0", "filter.include_zero=false", "filter.loss_scaling=sqrt"],
     {"p13", "p11", "p10"}),
    (["filter=top_k", "filter.value=1.0", "filter.include_zero=true"], {"p13", "p11", "p10", "p12"}),
]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])  # the registry's two veRL estimators: grpo and gae (PPO)
@pytest.mark.parametrize(("filter_overrides", "kept"), FILTERS)
def test_v1_and_legacy_keep_the_same_groups_and_compute_the_same_advantages_and_loss(
        algorithm, filter_overrides, kept, tmp_path) -> None:
    """Each path's own code on the fixed batch, the update in one mini-batch of 16 rows (4 prompts x 4)."""
    cfg = train_config(algorithm, filter_overrides)
    rows = fixed_rows()
    legacy = run_legacy(rows, cfg, tmp_path)
    with in_memory() as store:
        new = run_v1(rows, cfg, tmp_path, store)

    # 1. the same groups, through orch's one filter (recipes.stats.filtering.filter_step), and the same filter metrics
    assert kept_uids(legacy) == kept_uids(new) == kept
    assert len(legacy["keys"]) == len(new["keys"]) == 16  # both padded to the mini-batch rows (4 prompts x 4)
    filter_keys = [k for k in legacy["metrics"] if k.startswith("rollout/")]
    assert {k: legacy["metrics"][k] for k in filter_keys} == {k: new["metrics"][k] for k in filter_keys}
    assert legacy["scale"] == new["scale"] == {"none": 1.0, "linear": len(kept) / 4,
                                                "sqrt": math.sqrt(len(kept) / 4)}[cfg.filter.loss_scaling]
    assert not any(key in store.rows for key in [("train", r.key) for r in rows if r.uid not in kept])  # cleared

    # 2. the same advantages (x the loss scale), padding rows contributing nothing
    close(by_key(legacy, "advantages"), by_key(new, "advantages"), f"advantages ({algorithm})")
    for path in (legacy, new):
        pads = [i for i, key in enumerate(path["keys"]) if key.startswith("pad")]
        assert float(path["response_mask"][pads].sum()) == 0.0
        if algorithm == "grpo":  # each kept group's advantages are centred
            for uid in kept:
                first = [by_key(path, "advantages")[k][0] for k in by_key(path, "advantages") if k.startswith(uid)]
                assert abs(float(sum(first))) < 1e-5

    # 3. the same loss (token-mean, one mini-batch of 16 rows), and the same gradient per token
    loss_legacy, loss_v1 = update_loss(legacy, rows, "token-mean", 16), update_loss(new, rows, "token-mean", 16)
    assert loss_legacy["loss"] != 0.0
    MEASURED[f"loss ({algorithm})"] = max(MEASURED.get(f"loss ({algorithm})", 0.0),
                                          abs(loss_legacy["loss"] - loss_v1["loss"]))
    assert loss_v1["loss"] == pytest.approx(loss_legacy["loss"], rel=RTOL, abs=ATOL)
    for path, loss in ((legacy, loss_legacy), (new, loss_v1)):
        assert all(float(loss["grads"][key].abs().sum()) == 0.0 for key in path["keys"] if key.startswith("pad"))
    close(row_grads(loss_legacy, rows), row_grads(loss_v1, rows), f"gradient ({algorithm})")
    print("largest |legacy - V1|:", MEASURED)


def row_grads(loss: dict[str, Any], rows: list[Row]) -> dict[str, torch.Tensor]:
    return {row.key: loss["grads"][row.key][:len(row.response)] for row in rows if row.key in loss["grads"]}


@pytest.mark.parametrize("mini_batch_size", [16, 8, 4])
def test_dropping_and_masking_the_filtered_groups(mini_batch_size, tmp_path) -> None:
    """orch drops the filtered groups (the update batch shrinks, then is padded with no-op rows to the mini-batch
    rows); verl#7894 masks them (response mask 0, the batch keeps its size). veRL 0.9.1 normalises each mini-batch's
    loss by its own loss-mask tokens (token-mean) or by the configured mini-batch rows (seq-mean-*, padding and
    masked rows counted alike), so: with the whole step in one mini-batch the two give the same gradient under both
    aggregations; with several, masking spreads the kept rows over more mini-batches and optimizer steps, which
    changes token-mean's summed gradient (not seq-mean-token-mean's). Both batches in the legacy fit loop's order
    (`_balance_batch`)."""
    cfg = train_config("grpo", ["filter=top_k", "filter.value=0.5", "filter.include_zero=true"], mini_batch_size)
    rows = fixed_rows()
    dropping = run_legacy(rows, cfg, tmp_path)
    kept = kept_uids(dropping)
    assert kept == {"p11", "p13"} and len(dropping["keys"]) == max(8, mini_batch_size)
    masking = masked_path(rows, cfg, kept, tmp_path)
    masked_advantages = by_key(masking, "advantages")
    assert all(len(masked_advantages[key]) == 0 for key in masked_advantages if key.split("_")[0] not in kept)
    close(by_key(dropping, "advantages"), {key: a for key, a in masked_advantages.items() if key.split("_")[0] in kept},
          "advantages (dropping - masking)")
    measured = {}
    for mode in ("token-mean", "seq-mean-token-mean"):
        drop, mask = (update_loss(path, rows, mode, mini_batch_size) for path in (dropping, masking))
        assert all(math.isfinite(x) for x in drop["losses"])
        g_drop, g_mask = row_grads(drop, rows), row_grads(mask, rows)
        assert all(float(g_mask[key].abs().sum()) == 0.0 for key in g_mask if key.split("_")[0] not in kept)
        g_mask = {key: g for key, g in g_mask.items() if key in g_drop}
        difference = torch.cat([g_mask[k] - g_drop[k] for k in g_drop]).norm() / torch.cat(list(g_drop.values())).norm()
        measured[mode] = {"steps (dropping, masking)": (len(drop["losses"]), len(mask["losses"])),
                          "non-finite masking losses": sum(not math.isfinite(x) for x in mask["losses"]),
                          "|g_mask - g_drop| / |g_drop|": round(float(difference), 4)}
        if mini_batch_size == 16 or mode == "seq-mean-token-mean":
            close(g_drop, g_mask, f"gradient {mode} (dropping - masking)")
        else:
            assert float(difference) > 0.1
    print(f"mini-batch {mini_batch_size} rows:", measured)
    assert measured["token-mean"]["steps (dropping, masking)"] == (max(1, 8 // mini_batch_size), 16 // mini_batch_size)
    assert measured["seq-mean-token-mean"]["non-finite masking losses"] == 0


def test_with_several_mini_batches_the_two_trainers_group_the_rows_differently(tmp_path) -> None:
    """veRL's two trainers order the update batch differently before the actor splits it into mini-batches: legacy
    sorts each data-parallel partition by workload and deals it to both ends (ray_trainer.py:1236-1241), V1 keeps the
    partitioner's order (trainer_base.py:1624-1625), and their padding rows differ in length. With several
    mini-batches per step, the kept rows share mini-batches differently: token-mean (normalised by each mini-batch's
    tokens) gives another summed gradient; seq-mean-token-mean (normalised by the configured rows) the same."""
    cfg = train_config("grpo", FILTERS[3][0], mini_batch_size=8)  # 12 kept + 4 padding rows: 2 mini-batches
    rows = fixed_rows()
    legacy = run_legacy(rows, cfg, tmp_path)
    with in_memory() as store:
        new = run_v1(rows, cfg, tmp_path, store)

    def mini_batches(path: dict[str, Any]) -> list[set[str]]:
        return [{k for k in path["keys"][start:start + 8] if not k.startswith("pad")} for start in (0, 8)]

    assert mini_batches(legacy) != mini_batches(new)
    measured = {"mini-batches (legacy)": mini_batches(legacy), "mini-batches (V1)": mini_batches(new)}
    for mode in ("token-mean", "seq-mean-token-mean"):
        g_legacy, g_v1 = (row_grads(update_loss(path, rows, mode, 8), rows) for path in (legacy, new))
        difference = float(torch.cat([g_v1[k] - g_legacy[k] for k in g_legacy]).norm()
                           / torch.cat(list(g_legacy.values())).norm())
        measured[mode] = round(difference, 4)
        if mode == "seq-mean-token-mean":
            close(g_legacy, g_v1, "gradient seq-mean-token-mean, 2 mini-batches")
        else:
            assert difference > 0.01
    print("two mini-batches, |g_V1 - g_legacy| / |g_legacy|:", measured)


@pytest.mark.slow
def test_the_store_answers_as_transfer_queue(tmp_path) -> None:
    """The V1 side of the equivalence test through real TransferQueue 0.1.11 (its controller and one storage unit on
    a local Ray) gives the in-memory store's kept keys, padding, filter metrics and advantages (GRPO and GAE): the
    store stands in faithfully."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf


    rows = fixed_rows()
    configs = {algorithm: train_config(algorithm, FILTERS[3][0]) for algorithm in ("grpo", "ppo")}  # 3 groups kept,
    # 4 padding rows, loss scale sqrt(3/4)
    with in_memory() as store:
        ours_all = {algorithm: run_v1(rows, cfg, tmp_path, store, partition=algorithm)
                    for algorithm, cfg in configs.items()}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        real = {algorithm: run_v1(rows, cfg, tmp_path, tq, partition=algorithm) for algorithm, cfg in configs.items()}
    finally:
        tq.close()
        ray.shutdown()
    for algorithm in configs:
        ours, theirs = ours_all[algorithm], real[algorithm]
        assert kept_uids(theirs) == kept_uids(ours) == FILTERS[3][1]
        assert sum(k.startswith("pad") for k in theirs["keys"]) == sum(k.startswith("pad") for k in ours["keys"]) == 4
        close(by_key(ours, "advantages"), by_key(theirs, "advantages"), "advantages (store - TransferQueue)")
        untimed = [key for key in ours["metrics"] if not key.startswith("timing_s/")]
        assert {k: theirs["metrics"][k] for k in untimed} == {k: ours["metrics"][k] for k in untimed}
