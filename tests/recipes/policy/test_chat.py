"""Chat encoding: only generated tokens are in the loss, and training sequences equal the sampled contexts."""

from __future__ import annotations

import pytest
import torch

from envs import demonstrations
from recipes.config.schema import compose_train_config
from recipes.policy.actor import UpdateSettings, actor_config, actor_loss, global_batch_info, token_log_probs
from recipes.policy.batch import build_batch


@pytest.fixture(scope="module")
def chat() -> list[dict[str, str]]:
    """A multi-turn solver transcript (system, user, assistant, user, assistant, ...)."""
    return next(d for d in demonstrations("sokoban", 20, seed=1) if sum(m["role"] == "assistant" for m in d) >= 3)


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every run of ones."""
    spans, start = [], None
    for index, value in enumerate([*mask, 0]):
        if value and start is None:
            start = index
        if not value and start is not None:
            spans.append((start, index))
            start = None
    return spans


def test_loss_mask_covers_exactly_the_replies(encoder, chat) -> None:
    encoded = encoder.encode(chat)
    replies = [m["content"] for m in chat if m["role"] == "assistant"]
    spans = runs(encoded.loss_mask)
    assert len(spans) == len(replies) == len(encoded.turn_ends)
    for (start, end), reply, turn_end in zip(spans, replies, encoded.turn_ends, strict=True):
        ids = encoded.input_ids[start:end]
        assert ids[-1] == encoder.end_of_turn_id and turn_end == end - 1
        assert encoder.tokenizer.decode(ids[:-1]) == reply
    outside = encoder.tokenizer.decode([i for i, m in zip(encoded.input_ids, encoded.loss_mask, strict=True) if not m])
    for message in chat:
        if message["role"] != "assistant":
            assert message["content"] in outside  # system and observations are all there, none in the loss


def test_generation_contexts_are_prefixes_of_the_training_sequence(encoder, chat) -> None:
    full = encoder.encode(chat).input_ids
    for index, message in enumerate(chat):
        if message["role"] == "assistant":
            context = encoder.encode(chat[:index], add_generation_prompt=True).input_ids
            assert full[: len(context)] == context


def test_sampled_ids_are_used_verbatim(encoder, chat) -> None:
    reply = next(m["content"] for m in chat if m["role"] == "assistant")
    odd = [*encoder.tokenizer(reply[:5])["input_ids"], *encoder.tokenizer(reply[5:])["input_ids"]]
    sampled = {reply: [*odd, encoder.end_of_turn_id]}
    encoded = encoder.encode(chat, sampled)
    start, end = runs(encoded.loss_mask)[0]
    assert encoded.input_ids[start:end] == sampled[reply]


def test_truncated_reply_leaves_the_closing_token_out_of_the_loss(encoder, chat) -> None:
    reply = next(m["content"] for m in chat if m["role"] == "assistant")
    cut = encoder.tokenizer(reply)["input_ids"][:7]  # hit the length cap: no end-of-turn token sampled
    encoded = encoder.encode(chat, {reply: cut})
    start, end = runs(encoded.loss_mask)[0]
    assert encoded.input_ids[start:end] == cut
    assert encoded.input_ids[end] == encoder.end_of_turn_id and encoded.loss_mask[end] == 0


def test_turn_rewards_sit_on_the_last_token_of_each_reply(encoder, chat) -> None:
    rewards = [float(i + 1) for i, m in enumerate(m for m in chat if m["role"] == "assistant")]
    batch = build_batch([chat], [rewards], [7], encoder)
    positions = torch.nonzero(batch.token_rewards[0]).flatten().tolist()
    assert positions == encoder.encode(chat).turn_ends
    assert batch.token_rewards[0, positions].tolist() == rewards
    assert float(batch.episode_returns[0]) == sum(rewards)


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "drgrpo"])
def test_prompt_and_observation_tokens_get_zero_gradient(encoder, micro_folder, chat, algorithm) -> None:
    from recipes.policy.models import load_policy

    cfg = compose_train_config(["trainer=test", f"algorithm={algorithm}", "algorithm.use_kl=true"])
    model = load_policy(micro_folder, "float32", "cpu")
    other = next(d for d in demonstrations("sokoban", 20, seed=2) if len(d) > 3)
    rewards = [[1.0] * sum(m["role"] == "assistant" for m in transcript) for transcript in (chat, other)]
    batch = build_batch([chat, other], rewards, [0, 0], encoder)
    generator = torch.Generator().manual_seed(0)
    batch.old_log_probs = torch.randn(batch.input_ids.shape, generator=generator) - 3
    batch.ref_log_probs = torch.randn(batch.input_ids.shape, generator=generator) - 3
    batch.advantages = torch.randn(batch.input_ids.shape, generator=generator)  # nonzero everywhere on purpose
    settings = UpdateSettings(2, 2, 1, 1.0, 64)
    config = actor_config(cfg.algorithm, settings, 2)
    info = global_batch_info(batch, settings.loss_scale_factor)
    config.global_batch_info.update(info)
    log_probs, entropy = token_log_probs(model, batch, with_entropy=True)
    log_probs.retain_grad()
    entropy.retain_grad()
    loss, _ = actor_loss(log_probs, entropy, batch, config, info)
    loss.backward()
    outside = batch.loss_mask == 0
    assert torch.all(log_probs.grad[outside] == 0) and torch.all(entropy.grad[outside] == 0)
    assert torch.count_nonzero(log_probs.grad[~outside]) > 0


def test_log_probs_on_loss_positions_equal_the_full_forward(encoder, micro_folder, chat) -> None:
    from recipes.policy.models import load_policy

    model = load_policy(micro_folder, "float32", "cpu")
    batch = build_batch([chat], [[0.0] * sum(m["role"] == "assistant" for m in chat)], [0], encoder)
    log_probs, entropy = token_log_probs(model, batch, with_entropy=True)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=batch.input_ids).logits[0, :-1].float(), dim=-1)
    expected = full.gather(-1, batch.input_ids[0, 1:, None])[:, 0] * batch.loss_mask[0, 1:]
    assert torch.allclose(log_probs[0, 1:], expected, atol=1e-5)
    expected_entropy = -(full.exp() * full).sum(-1) * batch.loss_mask[0, 1:]
    assert torch.allclose(entropy[0, 1:], expected_entropy, atol=1e-4)


def test_a_template_that_rewrites_history_is_refused(micro_folder, chat) -> None:
    from orchlib.errors import OrchError
    from recipes.policy.chat import ChatEncoder
    from recipes.policy.models import load_tokenizer

    tokenizer = load_tokenizer(micro_folder)
    tokenizer.chat_template = (  # drops the reasoning of earlier replies, as some reasoning-model templates do
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' }}"
        "{%- if m['role'] == 'assistant' and not loop.last %}{{- m['content'].split('</think>')[-1] }}"
        "{%- else %}{{- m['content'] }}{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    with pytest.raises(OrchError, match="re-renders earlier turns differently"):
        ChatEncoder(tokenizer).encode(chat)
