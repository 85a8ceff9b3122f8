"""MI diagnostics: sample sets drawn from a batch, metrics named per set, EMA and collapse-alert state through checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from envs.trajectory import Trajectory, Turn
from recipes.diagnostics.monitor import (
    CollapseMonitor,
    DiagnosticsConfig,
    TurnEncoder,
    first_turn_set,
    raw_reasoning,
    scorer,
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
    score = scorer(model, config, pad_id=0)
    first = monitor.compute(1, score, ENCODER, batch(), success=None)
    for name in ("first_turn", "trajectory"):
        for proxy in ("retrieval_acc", "retrieval_chance", "mi_est", "mi_zscore", "mi_zscore_ema", "recall_at_2"):
            assert f"collapse/{name}/{proxy}" in first
    assert first["collapse/first_turn/retrieval_chance"] == pytest.approx(1 / 4)
    assert first["collapse/alert"] == 0.0
    # same seed and step -> same draws -> same numbers; a restored monitor continues identically
    again = CollapseMonitor(config, seed=7).compute(1, score, ENCODER, batch(), success=None)
    assert again == first
    restored = CollapseMonitor(config, seed=7)
    restored.load_state_dict(monitor.state_dict())
    assert restored.compute(5, score, ENCODER, batch(), 0.1) == monitor.compute(5, score, ENCODER, batch(), 0.1)


def test_an_empty_sample_set_is_said_once_and_counted(caplog):
    """A batch without reasoning builds no sample set: the run is told once per set why, and every computation
    logs how many samples each set had (0 here), so an empty diagnostics section has a visible cause."""
    config = DiagnosticsConfig(num_samples=16, batch_size=8)
    monitor = CollapseMonitor(config, seed=0)
    no_reasoning = [trajectory(seed, ["<answer>Up</answer>", "Up"]) for seed in range(3)]
    never = lambda prompts, samples: pytest.fail("nothing to score")  # noqa: E731
    with caplog.at_level("WARNING", logger="recipes.diagnostics.monitor"):
        first = monitor.compute(1, never, ENCODER, no_reasoning, success=None)
        again = monitor.compute(5, never, ENCODER, no_reasoning, success=None)
    assert first == again == {"collapse/first_turn/num_samples": 0.0, "collapse/trajectory/num_samples": 0.0}
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2  # one per set, at the first step only
    assert "sample set 'first_turn': none of the 3 first-turn replies" in warnings[0]
    assert "sample set 'trajectory': none of the 6 replies" in warnings[1] and "<think>...</think>" in warnings[1]
    reasoning = CollapseMonitor(config, seed=0).compute(
        1, scorer(Qwen2ForCausalLM(Qwen2Config(vocab_size=97, hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1,
                                               intermediate_size=32)), config, pad_id=0),
        ENCODER, batch(), success=None)
    assert reasoning["collapse/first_turn/num_samples"] == 12.0 and reasoning["collapse/trajectory/num_samples"] == 16.0


def test_config_rejects_unknown_sets():
    with pytest.raises(ValueError, match="valid choices: first_turn, trajectory"):
        DiagnosticsConfig(sets=("all",))


# A brief warm start of the micro model on 8 Countdown demonstrations (their reasoning cites the prompt's numbers).
WARM = ["task=countdown", "model.warm_start.demos=8", "model.warm_start.epochs=60", "model.warm_start.eval_every=60",
        "model.warm_start.lr=1e-2", "model.warm_start.batch_size=4", "model.warm_start.eval_episodes=2",
        "model.warm_start.max_response_tokens=16"]


@pytest.fixture(scope="session")
def warm_countdown(micro_folder, session_dir):
    """(warm-started micro policy, its chat encoder, the demonstrated episodes as trajectories); cached per session."""
    from envs import demonstrations
    from recipes.config.schema import compose_train_config
    from recipes.policy.chat import ChatEncoder
    from recipes.policy.models import load_policy, load_tokenizer
    from recipes.torch_trainer.warmstart import warm_start_folder
    from tests.recipes.conftest import MICRO

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
        cfg = compose_train_config([*MICRO, *WARM])
        env = dict(cfg.task.env)
        folder, _ = warm_start_folder(cfg.model, micro_folder, "countdown", env, "cpu")
    demos = demonstrations("countdown", cfg.model.warm_start.demos, seed=0, env_config=env)
    trajectories = [
        Trajectory("countdown", seed, demo, [Turn(demo[:2], demo[2]["content"], "", [], 0.0, True)], success=True)
        for seed, demo in enumerate(demos)
    ]
    return load_policy(folder, "float32", "cpu"), ChatEncoder(load_tokenizer(folder)), trajectories


def first_turn_metrics(model, encoder, trajectories) -> dict[str, float]:
    from recipes.diagnostics.collapse_hook import turn_encoder

    config = DiagnosticsConfig(sets=("first_turn",), num_samples=len(trajectories), batch_size=8)
    score = scorer(model, config, encoder.tokenizer.pad_token_id)
    return CollapseMonitor(config, seed=0).compute(1, score, turn_encoder(encoder, {}), trajectories, None)


def test_first_turn_retrieval_is_above_chance_on_a_warm_started_policy(warm_countdown):
    """The warm-started policy's first-turn reasoning depends on its prompt (on the demonstrated prompts: a brief
    warm start of a micro model does not generalise the copying to new numbers)."""
    model, encoder, trajectories = warm_countdown
    metrics = first_turn_metrics(model, encoder, trajectories)
    chance = metrics["collapse/first_turn/retrieval_chance"]
    assert chance == pytest.approx(1 / len(trajectories))  # every demonstration has its own prompt
    assert metrics["collapse/first_turn/retrieval_acc"] >= 3 * chance
    assert metrics["collapse/first_turn/mi_est"] > 0.05


def test_first_turn_retrieval_is_at_chance_on_a_policy_that_ignores_its_input(warm_countdown):
    """The same policy without its transformer layers predicts each token from the previous one only: every
    prompt ends with <think>, so every sample scores the same under every column."""
    import copy

    model, encoder, trajectories = warm_countdown
    blind = copy.deepcopy(model)
    blind.model.layers = torch.nn.ModuleList()
    blind.config.num_hidden_layers = 0
    metrics = first_turn_metrics(blind, encoder, trajectories)
    assert metrics["collapse/first_turn/retrieval_acc"] == pytest.approx(metrics["collapse/first_turn/retrieval_chance"])
    assert metrics["collapse/first_turn/mi_est"] == pytest.approx(0.0, abs=1e-9)
