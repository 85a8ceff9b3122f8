"""Packed forward passes (recipes.policy.packing, issue 59 item 4) give what one unpadded trajectory per pass gave, to
float tolerance, on a fixed batch and seed: the log-probs and entropies, the values, the actor's and the critic's
losses and the weights after their updates, and the warm start's supervised step."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import recipes.torch_trainer.warmstart as warmstart
from recipes.config.schema import compose_train_config
from recipes.policy.actor import (
    UpdateSettings,
    actor_config,
    batched_forward,
    state_values,
    token_log_probs,
    update_actor,
    update_critic,
)
from recipes.policy.batch import build_batch
from recipes.policy.models import load_critic, load_policy
from tests.recipes.conftest import MICRO

ROWS = 8


@pytest.fixture(scope="module")
def batch(encoder):
    """8 FrozenLake demonstrations cut after their second reply (two turns, different lengths: the padded batch
    has padding), with fixed advantages, returns, old values and log-probs."""
    from envs import demonstrations

    chats = [chat[:5] for chat in demonstrations("frozenlake", ROWS, seed=5)]
    turns = [[0.5] * sum(message["role"] == "assistant" for message in chat) for chat in chats]
    batch = build_batch(chats, turns, np.repeat(np.arange(ROWS // 2), 2), encoder)
    assert not bool(batch.attention_mask.all())
    generator = torch.Generator().manual_seed(0)
    mask = batch.loss_mask
    batch.advantages = torch.randn(batch.input_ids.shape, generator=generator) * mask
    batch.returns = torch.randn(batch.input_ids.shape, generator=generator) * mask
    batch.values = torch.randn(batch.input_ids.shape, generator=generator) * 0.1 * mask
    batch.old_log_probs = (torch.randn(batch.input_ids.shape, generator=generator) * 0.05 - 3.0) * mask
    return batch


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_scoring_matches_one_trajectory_per_pass(micro_folder, batch) -> None:
    model = load_policy(micro_folder, "float32", "cpu")

    def with_entropy(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = batched_forward(lambda m, b: token_log_probs(m, b)[0], model, batch, rows)
        entropy = batched_forward(lambda m, b: token_log_probs(m, b, with_entropy=True)[1], model, batch, rows)
        return log_probs, entropy

    (one_lp, one_ent), (packed_lp, packed_ent) = with_entropy(1), with_entropy(ROWS)
    assert close(one_lp, packed_lp) and close(one_ent, packed_ent)
    assert bool((packed_lp[batch.loss_mask == 0] == 0).all())
    critic = load_critic(micro_folder, "float32", "cpu").eval()  # eval: no dropout draws (their order differs)
    one, packed = batched_forward(state_values, critic, batch, 1), batched_forward(state_values, critic, batch, 4)
    assert close(one, packed) and bool((packed[batch.attention_mask == 0] == 0).all())
    assert model.config._attn_implementation == "sdpa"  # the packed attention is on only for the packed call


def test_updates_match_one_trajectory_per_pass(micro_folder, batch) -> None:
    cfg = compose_train_config([*MICRO, "algorithm=ppo", "algorithm.entropy_coeff=0.01"])
    base_policy = load_policy(micro_folder, "float32", "cpu")
    base_critic = load_critic(micro_folder, "float32", "cpu").eval()
    results = {}
    for rows in (1, 4):
        settings = UpdateSettings(mini_batch_size=ROWS // 2, micro_batch_size=rows, epochs=1, grad_clip=1.0,
                                  loss_scale_factor=64)
        policy, critic = copy.deepcopy(base_policy), copy.deepcopy(base_critic)
        actor = update_actor(policy, torch.optim.AdamW(policy.parameters(), lr=1e-3), batch,
                             actor_config(cfg.algorithm, settings, 2), settings)
        values = update_critic(critic, torch.optim.AdamW(critic.parameters(), lr=1e-3), batch, 0.5, settings)
        results[rows] = actor, values, policy, critic
    (actor_1, critic_1, policy_1, value_1), (actor_4, critic_4, policy_4, value_4) = results[1], results[4]
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss",
                "critic/grad_norm"):
        one, packed = (actor_1 | critic_1)[key], (actor_4 | critic_4)[key]
        assert one == pytest.approx(packed, rel=1e-4, abs=1e-6), key
    for one, packed in ((policy_1, policy_4), (value_1, value_4)):
        for (name, a), (_, b) in zip(one.named_parameters(), packed.named_parameters(), strict=True):
            assert close(a, b), name


def test_warm_start_step_matches_one_chat_per_pass(micro_folder, batch, monkeypatch) -> None:
    results = []
    sharded = []  # the packed (sharded) steps taken: none on the one-chat-per-pass side, or it compares packed twice
    packed_step = warmstart.sharded_step
    monkeypatch.setattr(warmstart, "sharded_step", lambda *args: sharded.append(1) or packed_step(*args))
    for packed in (False, True):
        monkeypatch.setattr(warmstart, "packs", lambda rows, model, packed=packed: packed and len(rows) > 1)
        model = load_policy(micro_folder, "float32", "cpu")
        torch.manual_seed(0)
        taken = len(sharded)
        loss = warmstart.supervised_epoch(model, torch.optim.AdamW(model.parameters(), lr=2e-3), batch, 4, 1.0)
        assert (len(sharded) > taken) == packed
        results.append((loss, model))
    (loss_one, one), (loss_packed, packed) = results
    assert loss_one == pytest.approx(loss_packed, rel=1e-5)
    for (name, a), (_, b) in zip(one.named_parameters(), packed.named_parameters(), strict=True):
        assert close(a, b), name
