"""The torch backend's value model scores without dropout, as veRL's critic does
(verl/workers/engine/fsdp/transformer_impl.py:297 sets `classifier_dropout = 0.0`): GAE's values and the critic's
loss are functions of the weights, not of a random mask, though the critic stays in training mode."""

from __future__ import annotations

import torch

from recipes.policy.models import load_critic


def test_the_critic_in_training_mode_scores_the_same_tokens_the_same_twice(micro_folder) -> None:
    critic = load_critic(micro_folder, "float32", "cpu")
    assert critic.training
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first, second = critic(input_ids=ids).logits, critic(input_ids=ids).logits
    assert first.shape == (2, 12, 1)
    assert torch.equal(first, second)  # with transformers' default head dropout (0.1) a tenth of the features differ
