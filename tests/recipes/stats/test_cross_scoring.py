"""Cross-scoring: prefix reuse equals the naive reference; an input-agnostic policy shows no MI."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from recipes.stats.cross_scoring import cross_score
from recipes.stats.mi import mi_proxies

VOCAB = 97


def tiny_model(seed: int = 0, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=512,
    )
    return Qwen2ForCausalLM(config).float()


def random_ids(rng: np.random.Generator, low: int, high: int, count: int) -> list[list[int]]:
    return [rng.integers(1, VOCAB, size=int(rng.integers(low, high + 1))).tolist() for _ in range(count)]


def direct_scores(model, prompts, samples) -> np.ndarray:
    """One unpadded forward per pair: the definition, independent of both methods' batching."""
    out = np.zeros((len(samples), len(prompts)))
    with torch.no_grad():
        for j, prompt in enumerate(prompts):
            for i, sample in enumerate(samples):
                ids = torch.tensor([prompt + sample])
                logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
                targets = ids[0, 1:]
                picked = logprobs[torch.arange(targets.numel()), targets][len(prompt) - 1 :]
                out[i, j] = picked.sum().item()
    return out


@pytest.mark.parametrize(
    ("prompt_len", "sample_len", "batch_size", "seed"),
    [
        ((3, 30), (1, 9), 4, 0),  # ragged prompts, length-1 samples, batch not dividing M
        ((20, 20), (5, 5), 16, 1),  # no padding at all
        ((1, 4), (10, 25), 1, 2),  # one-token prompts, long samples, batch of one
        ((40, 60), (1, 2), 64, 3),  # everything in one batch, mostly length 1-2
    ],
)
def test_prefix_reuse_equals_naive_and_direct(prompt_len, sample_len, batch_size, seed):
    rng = np.random.default_rng(seed)
    model = tiny_model(seed)
    prompts = random_ids(rng, *prompt_len, count=5)
    samples = random_ids(rng, *sample_len, count=11)
    naive = cross_score(model, prompts, samples, method="naive", batch_size=batch_size)
    prefix = cross_score(model, prompts, samples, method="prefix", batch_size=batch_size)
    assert np.abs(naive.L - prefix.L).max() <= 1e-4
    assert np.abs(naive.L_sum - prefix.L_sum).max() <= 1e-4 * max(len(s) for s in samples)
    np.testing.assert_allclose(naive.L_sum, direct_scores(model, prompts, samples), atol=1e-3)
    lengths = np.array([len(s) for s in samples])[:, None]
    np.testing.assert_allclose(prefix.L * lengths, prefix.L_sum)
    # tokens: naive feeds every pair in full; prefix feeds each prompt once (less what it shares with its sorted
    # neighbour, whose cache it extends) plus all but the last sample token
    assert naive.tokens_processed == sum(len(p) + len(s) for p in prompts for s in samples)
    ordered = sorted(prompts)
    shared = sum(len(os.path.commonprefix([a, b])) for a, b in zip(ordered, ordered[1:], strict=False))
    assert prefix.tokens_processed == sum(map(len, prompts)) - shared + len(prompts) * sum(len(s) - 1 for s in samples)


def test_repeated_and_overlapping_prompts_score_once_and_equal_naive():
    # The trajectory set's columns: first turns of one prompt repeat exactly, later turns extend earlier ones.
    rng = np.random.default_rng(5)
    model = tiny_model(seed=5)
    first, other = [[1, *ids] for ids in random_ids(rng, 12, 12, count=2)]  # sharing their first token only
    other[1] = first[1] % (VOCAB - 1) + 1
    second_turn = first + random_ids(rng, 9, 9, count=1)[0]
    prompts = [first, second_turn, first, other, second_turn, first]
    samples = random_ids(rng, 1, 14, count=13)
    naive = cross_score(model, prompts, samples, method="naive", batch_size=5)
    prefix = cross_score(model, prompts, samples, method="prefix", batch_size=5)
    assert np.abs(naive.L - prefix.L).max() <= 1e-4
    for j, same in ((2, 0), (5, 0), (4, 1)):
        np.testing.assert_array_equal(prefix.L_sum[:, j], prefix.L_sum[:, same])
    # each distinct prompt encoded once, extending the cache of a prompt it shares a prefix with (first -> its second
    # turn: 9 new tokens; first -> other: all but the shared first token), each scoring every sample's inputs once
    encoded = len(first) + 9 + len(other) - 1
    assert prefix.tokens_processed == encoded + 3 * sum(len(s) - 1 for s in samples)


def test_attention_implementation_is_restored():
    model = tiny_model()
    ids = torch.tensor([[5, 6, 7, 8]])
    before, implementation = model(input_ids=ids).logits, model.config._attn_implementation
    cross_score(model, [[1, 2, 3]], [[3, 4], [5, 6, 7]])
    assert model.config._attn_implementation == implementation
    torch.testing.assert_close(model(input_ids=ids).logits, before)


def test_model_training_flag_is_restored():
    model = tiny_model()
    model.train()
    cross_score(model, [[1, 2]], [[3, 4]])
    assert model.training


def test_input_agnostic_policy_shows_no_mutual_information():
    # Zeroing every attention output makes position t depend on token t alone; prompts that all end in the
    # same token (the opening tag) then give every sample the same score under every column.
    model = tiny_model(seed=4)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    rng = np.random.default_rng(4)
    think = 7
    prompts = [p + [think] for p in random_ids(rng, 3, 20, count=8)]
    samples = random_ids(rng, 2, 10, count=64)
    scores = cross_score(model, prompts, samples)
    proxies = mi_proxies(scores.L, scores.L_sum, np.arange(64) % 8)
    assert proxies.mi_est == pytest.approx(0.0, abs=1e-5)
    assert proxies.retrieval_acc == pytest.approx(1 / 8, abs=0.02)
    # the same model with attention intact does depend on the prompt
    intact = cross_score(tiny_model(seed=4), prompts, samples)
    assert np.ptp(intact.L, axis=1).max() > 1e-3


@pytest.mark.parametrize(
    ("prompts", "samples", "kwargs", "message"),
    [
        ([], [[1]], {}, ">= 1 prompt"),
        ([[1]], [[]], {}, "at least one token"),
        ([[1]], [[1]], {"method": "cached"}, "valid choices: naive, prefix"),
        ([[1]], [[1]], {"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_arguments(prompts, samples, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cross_score(tiny_model(), prompts, samples, **kwargs)


@pytest.mark.parametrize("method", ["prefix", "naive"])
def test_identical_samples_are_scored_once_with_identical_rows(method):
    # a turn drawn twice in the trajectory set, or a policy repeating itself: one scoring, the row copied
    rng = np.random.default_rng(9)
    model = tiny_model(seed=9)
    prompts = random_ids(rng, 5, 9, count=3)
    distinct = random_ids(rng, 2, 7, count=3)
    samples = [distinct[0], distinct[1], distinct[0], distinct[2], distinct[0]]
    repeated = cross_score(model, prompts, samples, method=method, batch_size=2)
    once = cross_score(model, prompts, distinct, method=method, batch_size=2)
    np.testing.assert_array_equal(repeated.L_sum, once.L_sum[[0, 1, 0, 2, 0]])
    np.testing.assert_array_equal(repeated.L, once.L[[0, 1, 0, 2, 0]])
    assert repeated.tokens_processed == once.tokens_processed
