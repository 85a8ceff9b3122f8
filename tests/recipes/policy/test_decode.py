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
