"""The sampler's lean decode step (recipes.policy.sampler.LeanDecoder, issue 59 item 4) computes what the model's own
forward does over the same static cache: the same logits at every decoded token, to float tolerance, and the same
replies on a fixed seed."""

from __future__ import annotations

import pytest
import torch

import recipes.policy.sampler as sampler_module
from recipes.policy.models import load_policy
from recipes.policy.sampler import LeanDecoder, Sampler


@pytest.fixture(scope="module")
def histories():
    from envs import demonstrations

    return [chat[:2] for chat in demonstrations("frozenlake", 6, seed=11)]  # system + first observation


def test_lean_step_matches_the_models_forward(micro_folder, encoder, histories, monkeypatch) -> None:
    model = load_policy(micro_folder, "float32", "cpu")
    assert LeanDecoder.applies(model)
    lean_call, compared = LeanDecoder.__call__, []

    def checked(self, token, bias, position, cache, column):
        logits = lean_call(self, token, bias, position, cache, column)
        reference = model(input_ids=token, attention_mask=bias, position_ids=position, past_key_values=cache,
                          use_cache=True, cache_position=torch.tensor([column])).logits[:, -1]
        assert torch.allclose(logits, reference, rtol=1e-4, atol=1e-4)
        compared.append(column)
        return logits

    monkeypatch.setattr(LeanDecoder, "__call__", checked)
    Sampler(model, encoder, max_new_tokens=24, temperature=1.0, max_context_tokens=4096)(histories)
    assert len(compared) > 10


def test_replies_match_the_models_forward(micro_folder, encoder, histories, monkeypatch) -> None:
    model = load_policy(micro_folder, "float32", "cpu")
    replies = []
    for lean in (False, True):
        monkeypatch.setattr(sampler_module.LeanDecoder, "applies", staticmethod(lambda _model, lean=lean: lean))
        torch.manual_seed(3)
        sampler = Sampler(model, encoder, max_new_tokens=32, temperature=1.0, max_context_tokens=4096)
        first = sampler(histories)
        second = sampler([[*history, {"role": "assistant", "content": reply}, history[1]]
                          for history, reply in zip(histories, first, strict=True)])  # the prefix cache reused
        replies.append((first, second))
    assert replies[0] == replies[1]


def test_an_adapted_model_runs_its_own_forward(micro_folder) -> None:
    from recipes.config.schema import compose_train_config
    from recipes.policy.lora import add_adapters
    from tests.recipes.conftest import MICRO

    model = load_policy(micro_folder, "float32", "cpu")
    add_adapters(model, compose_train_config([*MICRO, "model.lora.rank=4"]).model.lora)
    assert not LeanDecoder.applies(model)


def test_the_sampled_log_probs_are_the_scored_ones(micro_folder, encoder, histories) -> None:
    """The log-probs the sampler records for each reply token (`Sampler.reply_log_probs`) are the ones the trainer's
    scoring pass computes for the same two-turn trajectories (packed, the old log-probs PPO reads), to float
    tolerance; a reply moved to another context (as `BlindSampler` hands a blinded row's reply back) leaves its row
    uncovered, so its row is scored, not read."""
    from recipes.policy.actor import token_log_probs
    from recipes.policy.batch import build_batch, sampled_log_probs

    model = load_policy(micro_folder, "float32", "cpu")
    torch.manual_seed(3)
    sampler = Sampler(model, encoder, max_new_tokens=32, temperature=1.0, max_context_tokens=4096,
                      keep_log_probs=True)
    first = sampler(histories)
    second = sampler([[*history, {"role": "assistant", "content": reply}, history[1]]
                      for history, reply in zip(histories, first, strict=True)])
    chats = [[*history, {"role": "assistant", "content": a}, history[1], {"role": "assistant", "content": b}]
             for history, a, b in zip(histories, first, second, strict=True)]
    batch = build_batch(chats, [[0.0, 0.0]] * len(chats), range(len(chats)), encoder, sampler.generated)
    recorded, covered = sampled_log_probs(batch, sampler.reply_log_probs)
    assert covered.all()
    scored, _ = token_log_probs(model, batch)
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) > 50 and bool((recorded[~mask] == 0).all())
    assert torch.allclose(recorded[mask], scored[mask], rtol=1e-4, atol=1e-4)

    other = next(index for index in range(1, len(first)) if first[index] != first[0] and histories[index] != histories[0])
    moved = [[*histories[0], {"role": "assistant", "content": first[other]}], chats[1]]
    batch = build_batch(moved, [[0.0], [0.0, 0.0]], range(2), encoder, sampler.generated)
    assert sampled_log_probs(batch, sampler.reply_log_probs)[1].tolist() == [False, True]
