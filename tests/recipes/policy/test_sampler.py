"""The batched sampler: left-padded static-cache decoding equals unpadded full forwards, replies are recorded."""

from __future__ import annotations

import pytest
import torch

from envs import demonstrations
from orchlib.errors import OrchError
from recipes.policy.models import load_policy
from recipes.policy.sampler import Sampler


def greedy_reference(model, context: list[int], steps: int, stop: int) -> list[int]:
    """Greedy decoding by full forward passes of one unpadded sequence (no cache, no mask)."""
    ids = list(context)
    for _ in range(steps):
        with torch.no_grad():
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token == stop:
            break
    return ids[len(context):]


def test_cached_multi_turn_decoding_matches_unpadded_forwards(micro_folder, encoder) -> None:
    """Left-padded batches, KV reuse across turns and shared first-turn contexts change nothing (greedy decoding)."""
    model = load_policy(micro_folder, "float32", "cpu")
    chats = demonstrations("sokoban", 2, seed=4)
    histories = [chats[0][:2], chats[0][:2], chats[1][:4] if len(chats[1]) > 4 else chats[1][:2]]
    sampler = Sampler(model, encoder, max_new_tokens=12, temperature=1e-5, max_context_tokens=4096)
    for turn in range(3):
        replies = sampler(histories)
        for history, reply in zip(histories, replies, strict=True):
            context = encoder.encode(history, sampler.generated, add_generation_prompt=True).input_ids
            expected = greedy_reference(model, context, 12, encoder.end_of_turn_id)
            assert sampler.generated[reply] == expected, f"turn {turn}"
            body = expected[:-1] if expected[-1] == encoder.end_of_turn_id else expected
            assert reply == encoder.tokenizer.decode(body, skip_special_tokens=True)
        histories = [[*history, {"role": "assistant", "content": reply},
                      {"role": "user", "content": f"Turn {turn + 2}: observation {row}"}]
                     for row, (history, reply) in enumerate(zip(histories, replies, strict=True))]


def test_context_limit_is_a_clear_error(micro_folder, encoder) -> None:
    sampler = Sampler(load_policy(micro_folder, "float32", "cpu"), encoder, 16, 1.0, max_context_tokens=32)
    with pytest.raises(OrchError, match="trainer.max_context_tokens=32"):
        sampler([demonstrations("countdown", 1, seed=0)[0][:2]])


def test_sampling_follows_the_softmax_at_the_temperature() -> None:
    from recipes.policy.sampler import sample

    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(40000, 1)
    for temperature in (1.0, 0.5):
        counts = torch.bincount(sample(logits, temperature)[:, 0], minlength=4).float() / len(logits)
        assert torch.allclose(counts, torch.softmax(logits[0] / temperature, dim=-1), atol=0.01)
    rows = torch.randn(64, 11)
    assert torch.equal(sample(rows, 0.0), rows.argmax(dim=-1, keepdim=True))  # 0: greedy (orch eval --temperature 0)


def test_the_blind_sampler_generates_every_reply_from_the_first_chat_and_keeps_the_episodes_order() -> None:
    """`control.blind_from_step` (docs/diagnostics.md#controls): replies cannot depend on their own input."""
    from recipes.policy.sampler import BlindSampler

    class Echo:  # stands in for the real sampler: replies name the chat they were generated from
        takes_images = False
        generated: dict = {}

        def __init__(self) -> None:
            self.seen = []

        def __call__(self, histories, frames=None):
            self.seen.append((histories, frames))
            return [f"{history[-1]['content']}#{index}" for index, history in enumerate(histories)]

    inner = Echo()
    blind = BlindSampler(inner)
    chats = [[{"role": "user", "content": name}] for name in ("a", "b", "c")]
    assert blind(chats, [["fa"], ["fb"], ["fc"]]) == ["a#0", "a#1", "a#2"]  # all from the first chat, in order
    assert inner.seen[-1][1] == [["fa"], ["fa"], ["fa"]]  # its frames too
    later = [[*chat, {"role": "assistant", "content": "x"}, {"role": "user", "content": f"{chat[0]['content']}2"}]
             for chat in chats[1:]]
    assert blind(later, [["f"], ["f"]]) == ["a#0", "a#1"]  # later turns: still that one first chat, not turn 2's
    assert blind.generated is inner.generated and blind.takes_images is False


def test_the_row_rule_blinds_round_strength_times_rows_by_seed_and_step() -> None:
    """`control.blind_strength` (#46 item 1): one rule for both backends picks which of a step's rows are blinded."""
    from recipes.runtime.seeds import blinded_rows

    for count in (1, 7, 16, 32):
        for strength in (0.0, 0.25, 0.5, 0.75, 1.0):
            rows = blinded_rows(count, strength, 3, 11)
            assert len(rows) == round(strength * count) and rows == sorted(set(rows))
            assert all(0 <= row < count for row in rows)
            assert rows == blinded_rows(count, strength, 3, 11)  # deterministic: a resumed step blinds the same rows
        assert blinded_rows(count, 1.0, 3, 11) == list(range(count))  # strength 1: every row, the total plant
        assert blinded_rows(count, 0.0, 3, 11) == []  # strength 0: nothing planted
    half = blinded_rows(32, 0.5, 3, 11)
    assert half != blinded_rows(32, 0.5, 3, 12) and half != blinded_rows(32, 0.5, 4, 11)  # by (seed, step)
    assert set(blinded_rows(32, 0.25, 3, 11)) <= set(half) <= set(blinded_rows(32, 0.75, 3, 11))  # nested


def test_the_blind_sampler_at_half_strength_blinds_exactly_the_chosen_rows() -> None:
    """A graded plant: the chosen rows' replies come from the first call's first chat (frames too), every other row's
    from its own, whichever episodes are still running (the driver names each history's row: `rows=`)."""
    from recipes.policy.sampler import BlindSampler
    from recipes.runtime.seeds import blinded_rows

    class Echo:  # replies name the chat (and frame) they were generated from
        takes_images = False
        generated: dict = {}

        def __call__(self, histories, frames=None):
            return [f"{history[-1]['content']}|{shown}" for history, shown in zip(histories, frames, strict=True)]

    chosen = blinded_rows(8, 0.5, 0, 10)
    assert chosen == [2, 4, 5, 7]  # row 0 unblinded: the fixed chat is still the first episode's
    blind = BlindSampler(Echo(), chosen)
    assert blind.takes_rows
    chats = [[{"role": "user", "content": f"c{row}"}] for row in range(8)]
    replies = blind(chats, [f"f{row}" for row in range(8)], rows=list(range(8)))
    assert replies == [("c0|f0" if row in chosen else f"c{row}|f{row}") for row in range(8)]
    running = [1, 2, 5, 6]  # a later turn: some episodes have ended (2 and 5 blinded, 1 and 6 not)
    later = [[*chats[row], {"role": "assistant", "content": "x"}, {"role": "user", "content": f"t{row}"}]
             for row in running]
    replies = blind(later, [f"g{row}" for row in running], rows=running)
    assert replies == [("c0|f0" if row in chosen else f"t{row}|g{row}") for row in running]


def test_the_torch_rollout_tells_the_blind_sampler_each_episodes_row() -> None:
    """The torch backend's rollout (`play`, G prompts x K samples through `envs.run_episodes`) numbers its episodes
    as the rule does: at every turn, each chosen row is asked the first episode's first chat, every other its own."""
    from recipes.config.schema import compose_train_config
    from recipes.policy.sampler import BlindSampler
    from recipes.runtime.seeds import blinded_rows
    from recipes.torch_trainer.trainer import play

    class Recorder:  # the inner sampler: records what it is asked, replies with an unparsable turn
        takes_images = False
        generated: dict = {}

        def __init__(self) -> None:
            self.asked = []

        def __call__(self, histories, frames=None):
            self.asked.append(histories)
            return ["hm"] * len(histories)

    cfg = compose_train_config(["trainer=test", "task=frozenlake"])
    chosen = blinded_rows(3 * 2, 0.5, 0, 4)
    assert 0 < len(chosen) < 6
    inner = Recorder()
    trajectories = play(cfg, BlindSampler(inner, chosen), [5, 6, 7], 2)
    fixed = trajectories[0].messages[:2]
    assert len(inner.asked) == max(t.num_turns for t in trajectories) >= 2
    for turn, asked in enumerate(inner.asked):
        assert asked == [fixed if row in chosen else t.messages[: 2 + 2 * turn]
                         for row, t in enumerate(trajectories) if t.num_turns > turn]


def test_the_blind_control_is_part_of_a_runs_identity_on_both_backends() -> None:
    """Planted on the torch backend by `BlindSampler`, on veRL by its agent loop (tests/recipes/verl/test_verl_parts.py).
    `control.blind_strength` came later: at its default 1 a control cell keeps the identity it had without it."""
    from recipes.config.schema import compose_train_config
    from recipes.stats.collapse_alert import LEGACY_RULE

    verl = compose_train_config(["trainer=test", "backend=verl", "control.blind_from_step=2"])
    assert verl.control.blind_from_step == 2
    plain = compose_train_config(["trainer=test"])
    assert plain.digest() == compose_train_config(["trainer=test", "control.blind_from_step=0"]).digest()
    assert plain.digest() != compose_train_config(["trainer=test", "control.blind_from_step=2"]).digest()
    legacy_rule = [f"diagnostics.rule.{key}={value}" for key, value in LEGACY_RULE.model_dump().items()]
    planted = compose_train_config(["trainer=test", "control.blind_from_step=3", *legacy_rule])
    assert planted.digest() == "29fca7fb3d9336e2"  # as computed before blind_strength existed (and before #46's rule)
    for strength in ("1.0", "1"):
        assert compose_train_config(["trainer=test", "control.blind_from_step=3", *legacy_rule,
                                     f"control.blind_strength={strength}"]).digest() == planted.digest()
    graded = compose_train_config(["trainer=test", "control.blind_from_step=3", *legacy_rule,
                                   "control.blind_strength=0.5"])
    assert graded.control.blind_strength == 0.5 and graded.digest() != planted.digest()
    assert plain.digest() == compose_train_config(["trainer=test", "control.blind_strength=1.0"]).digest()
