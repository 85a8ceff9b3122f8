"""Advantages of every algorithm equal veRL's functions (and the textbook formulas) on constructed batches.

The trainer runs veRL's estimators over whole multi-turn sequences, where prompt and observation tokens sit between
the replies (loss mask 0). These tests check that this equals veRL on the plain layout it was written for (the
generated tokens only, back to back), and the closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_gae_advantage_return, compute_grpo_outcome_advantage
from verl.utils.torch_functional import masked_whiten

from envs import demonstrations
from recipes.config.schema import compose_train_config
from recipes.policy.algorithms import algorithm_names, get_algorithm
from recipes.policy.batch import build_batch

GROUPS, SAMPLES = 3, 4


@pytest.fixture(scope="module")
def batch(encoder):
    """12 multi-turn transcripts in 3 groups with random turn rewards (a constructed batch)."""
    rng = np.random.default_rng(0)
    chats = demonstrations("sokoban", GROUPS * SAMPLES, seed=5)
    rewards = [list(rng.normal(size=sum(m["role"] == "assistant" for m in chat)).round(2)) for chat in chats]
    rewards[SAMPLES:2 * SAMPLES] = [[1.0] + [0.0] * (len(r) - 1) for r in rewards[SAMPLES:2 * SAMPLES]]  # zero RV
    batch = build_batch(chats, rewards, np.repeat(np.arange(GROUPS) + 100, SAMPLES), encoder)
    batch.values = torch.from_numpy(rng.normal(size=batch.input_ids.shape).astype(np.float32))
    return batch


def compact(batch, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss-mask positions of each row, back to back and right-padded: veRL's plain response layout."""
    rows = [tensor[i][batch.loss_mask[i].bool()] for i in range(len(batch))]
    width = max(len(row) for row in rows)
    out, mask = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)], mask[i, : len(row)] = row, 1
    return out, mask


def test_registry_has_the_paper_algorithms() -> None:
    assert algorithm_names() == ["dapo", "dapo_dynamic", "drgrpo", "grpo", "ppo"]
    assert get_algorithm("ppo").uses_critic and not get_algorithm("grpo").uses_critic
    assert get_algorithm("dapo").uses_critic  # RAGEN-2's DAPO: scripts/runs/run_main_table_diff_algo.sh:232-233


@pytest.mark.parametrize("name", ["grpo", "dapo_dynamic", "drgrpo"])
def test_group_advantages_equal_verl_on_the_plain_layout(batch, name) -> None:
    cfg = compose_train_config([f"algorithm={name}"]).algorithm
    advantages, returns = get_algorithm(name).advantages(batch, cfg)
    episode = batch.episode_returns
    expected, _ = compute_grpo_outcome_advantage(
        episode[:, None], torch.ones(len(batch), 1), batch.group_ids, norm_adv_by_std_in_grpo=cfg.norm_adv_by_std
    )
    mask = batch.loss_mask.bool()
    for row in range(len(batch)):
        assert torch.allclose(advantages[row][mask[row]], expected[row, 0].expand(int(mask[row].sum())))
    assert torch.all(advantages[~mask] == 0)
    # closed form: (R - mean_group) / (std_group + eps) for GRPO/DAPO, R - mean_group for Dr.GRPO
    grouped = episode.view(GROUPS, SAMPLES)
    centred = (grouped - grouped.mean(dim=1, keepdim=True))
    closed = centred / (grouped.std(dim=1, keepdim=True) + 1e-6) if cfg.norm_adv_by_std else centred
    assert torch.allclose(expected[:, 0], closed.flatten(), atol=1e-5)
    assert torch.all(expected[SAMPLES : 2 * SAMPLES] == 0)  # a zero-variance group carries no signal


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95)])
def test_gae_over_multi_turn_sequences_equals_verl_on_the_generated_tokens(batch, gamma, lam) -> None:
    cfg = compose_train_config(["algorithm=ppo", f"algorithm.gamma={gamma}", f"algorithm.lam={lam}"]).algorithm
    advantages, returns = get_algorithm("ppo").advantages(batch, cfg)
    rewards, mask = compact(batch, batch.token_rewards)
    values, _ = compact(batch, batch.values)
    expected_adv, expected_ret = compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)
    got_adv, _ = compact(batch, advantages)
    got_ret, _ = compact(batch, returns)
    assert torch.allclose(got_adv, expected_adv * mask, atol=1e-5)
    assert torch.allclose(got_ret * mask, expected_ret * mask, atol=1e-5)
    if gamma == lam == 1.0:  # closed form: return-to-go minus value, whitened over the batch's generated tokens
        to_go = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
        assert torch.allclose(got_adv, masked_whiten(to_go - values, mask) * mask, atol=1e-4)
