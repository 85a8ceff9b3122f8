"""MI diagnostics: sample sets drawn from a batch, metrics named per set, EMA/detector state through checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from envs.trajectory import Trajectory, Turn
from recipes.diagnostics import (
    CollapseMonitor,
    DiagnosticsConfig,
    TurnEncoder,
    first_turn_set,
    raw_reasoning,
    trajectory_set,
)


def char_ids(text: str) -> list[int]:
    return [ord(c) % 90 + 1 for c in text]


ENCODER = TurnEncoder(lambda messages: char_ids("|".join(m["content"] for m in messages) + ">"), char_ids)


def trajectory(seed: int, replies: list[str]) -> Trajectory:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": f"state {seed} turn 1"}]
    turns = []
    for number, reply in enumerate(replies, start=1):
        turns.append(Turn(list(messages), reply, raw_reasoning(reply) or "", ["Up"], 0.0, True))
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"state {seed} turn {number + 1}"}]
    return Trajectory("sokoban", seed, messages, turns, success=False)


def batch() -> list[Trajectory]:
    out = []
    for prompt in range(4):
        for sample in range(3):
            replies = [f"<think> p{prompt} s{sample} t{t} </think> <answer>Up</answer>" for t in range(2)]
            if sample == 2:
                replies[1] = "no tags at all"  # a turn without reasoning is never sampled
            out.append(trajectory(prompt, replies))
    return out


def test_raw_reasoning_extracts_the_first_think_block():
    assert raw_reasoning("<think> a b </think><answer>x</answer>") == " a b "
    assert raw_reasoning("no think") is None
    assert raw_reasoning("<think> never closed") is None


def test_first_turn_set_uses_distinct_prompts_as_columns():
    sample_set = first_turn_set(batch(), ENCODER, 64, np.random.default_rng(0))
    assert len(sample_set.samples) == 12 and len(sample_set.prompts) == 4
    # samples of the same prompt share a column, different prompts differ
    prompt_of_sample = [i // 3 for i in range(12)]
    for a in range(12):
        for b in range(12):
            assert (sample_set.column[a] == sample_set.column[b]) == (prompt_of_sample[a] == prompt_of_sample[b])
    subsample = first_turn_set(batch(), ENCODER, 5, np.random.default_rng(0))
    assert len(subsample.samples) == 5


def test_trajectory_set_draws_are_columns_with_equivalence_classes():
    sample_set = trajectory_set(batch(), ENCODER, 64, np.random.default_rng(1))
    assert len(sample_set.prompts) == len(sample_set.samples) == 64
    assert sample_set.column.tolist() == list(range(64))
    for a in range(64):
        for b in range(64):
            same = sample_set.prompts[a] == sample_set.prompts[b]
            assert (sample_set.column_classes[a] == sample_set.column_classes[b]) == same
    # turns without a think block are never drawn
    for ids in sample_set.samples:
        assert ids != char_ids("no tags at all")
    assert trajectory_set([trajectory(0, ["nothing"])], ENCODER, 8, np.random.default_rng(0)) is None


def test_monitor_metrics_and_state_roundtrip():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                    intermediate_size=64, max_position_embeddings=512)
    )
    config = DiagnosticsConfig(num_samples=16, batch_size=8)
    assert config.due(1) and config.due(5) and not config.due(3)
    monitor = CollapseMonitor(config, seed=7)
    first = monitor.compute(1, model, ENCODER, batch(), success=None, pad_id=0)
    for name in ("first_turn", "trajectory"):
        for proxy in ("retrieval_acc", "retrieval_chance", "mi_est", "mi_zscore", "mi_zscore_ema", "recall@2"):
            assert f"collapse/{name}/{proxy}" in first
    assert first["collapse/first_turn/retrieval_chance"] == pytest.approx(1 / 4)
    assert first["collapse/alert"] == 0.0
    # same seed and step -> same draws -> same numbers; a restored monitor continues identically
    again = CollapseMonitor(config, seed=7).compute(1, model, ENCODER, batch(), success=None, pad_id=0)
    assert again == first
    restored = CollapseMonitor(config, seed=7)
    restored.load_state_dict(monitor.state_dict())
    assert restored.compute(5, model, ENCODER, batch(), 0.1, 0) == monitor.compute(5, model, ENCODER, batch(), 0.1, 0)


def test_config_rejects_unknown_sets():
    with pytest.raises(ValueError, match="valid choices: first_turn, trajectory"):
        DiagnosticsConfig(sets=("all",))
