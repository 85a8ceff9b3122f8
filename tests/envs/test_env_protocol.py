"""The reply parser and the user-turn text of the chat protocol."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.protocol import FAILURES, format_response, parse_response, user_turn

MOVES = ["Up", "Down", "Left", "Right"]


@pytest.mark.parametrize(
    ("text", "failure"),
    [
        ("<answer>Up</answer>", "missing_think"),
        ("<think>go up</think>", "missing_answer"),
        ("<think>a</think> <answer>Up", "missing_answer"),
        ("think>a</think><answer>Up</answer>", "missing_think"),
        ("<answer>Up</answer><think>a</think>", "wrong_order"),
        ("<think>a<answer>Up</think></answer>", "wrong_order"),
        ("<think>a</think><think>b</think><answer>Up</answer>", "duplicate_tag"),
        ("<think>a</think><answer>Up</answer><answer>Down</answer>", "duplicate_tag"),
        ("Sure! <think>a</think><answer>Up</answer>", "extra_text"),
        ("<think>a</think><answer>Up</answer> Hope this helps", "extra_text"),
        ("<think>a</think> so: <answer>Up</answer>", "extra_text"),
        ("<think>a</think><answer>   </answer>", "empty_answer"),
        ("<think>a</think><answer>Up || </answer>", "empty_action"),
        ("<think>a</think><answer>Up |||| Down</answer>", "empty_action"),
        ("<think>a</think><answer>Jump</answer>", "unknown_action"),
        ("<think>a</think><answer>Up, Down</answer>", "unknown_action"),
        ("<think>a</think><answer>Up || Dance</answer>", "unknown_action"),
        ("<THINK>a</THINK><ANSWER>Up</ANSWER>", "missing_think"),
        ("＜think＞a＜/think＞＜answer＞Up＜/answer＞", "missing_think"),  # full-width brackets
        ("\u200b<think>a</think><answer>Up</answer>", "extra_text"),  # zero-width space is not whitespace
        ("<think>a</think><answer>Up\u0301</answer>", "unknown_action"),  # combining accent
        ("", "missing_think"),
    ],
)
def test_malformed_replies_are_classified(text, failure):
    parsed = parse_response(text, MOVES)
    assert not parsed.ok
    assert parsed.failure == failure
    assert parsed.actions == []


def test_valid_reply_gives_reasoning_and_canonical_actions():
    parsed = parse_response("  <think> box is left </think>\n<answer> left || UP </answer>\n", MOVES)
    assert parsed.ok and parsed.failure is None
    assert parsed.reasoning == "box is left"
    assert parsed.actions == ["Left", "Up"]
    assert parsed.extra_actions == 0


def test_only_the_first_max_actions_are_kept():
    parsed = parse_response("<think>x</think><answer>Up || Up || Left || Down</answer>", MOVES, max_actions=2)
    assert parsed.ok
    assert parsed.actions == ["Up", "Up"]
    assert parsed.extra_actions == 2


def test_free_text_actions_keep_their_content():
    parsed = parse_response("<think>3+5=8</think><answer> (3 + 5) * 2 </answer>", None, max_actions=1)
    assert parsed.ok
    assert parsed.actions == ["(3 + 5) * 2"]


def test_empty_reasoning_is_allowed():
    assert parse_response("<think></think><answer>Down</answer>", MOVES).actions == ["Down"]


def test_non_string_reply_is_a_failure_not_an_exception():
    assert parse_response(None, MOVES).failure == "not_text"  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("<>/|thinkasweruUpDo \n\u200bé√")) | st.characters(), max_size=80)
)
def test_parser_is_total(text):
    parsed = parse_response(text, MOVES)
    assert parsed.ok == (parsed.failure is None)
    if parsed.ok:
        assert 1 <= len(parsed.actions) <= 2
        assert set(parsed.actions) <= set(MOVES)
    else:
        assert parsed.failure in FAILURES and parsed.actions == []


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40),
    st.lists(st.sampled_from(MOVES), min_size=1, max_size=2),
)
def test_format_response_round_trips(reasoning, actions):
    parsed = parse_response(format_response(reasoning, actions), MOVES)
    assert parsed.ok
    assert parsed.reasoning == reasoning.strip()
    assert parsed.actions == actions


def test_user_turn_carries_turn_state_budget_reward_and_format():
    text = user_turn(
        turn=3,
        state="#P#",
        actions_left=4,
        max_actions_per_turn=2,
        last_reward=-0.2,
        last_failure="unknown_action",
    )
    assert text.startswith("Turn 3:")
    assert "#P#" in text
    assert "4 actions left" in text
    assert "-0.2" in text
    assert FAILURES["unknown_action"] in text
    assert "<think>" in text and "</answer>" in text and "||" in text


def test_first_user_turn_has_no_reward_line():
    text = user_turn(turn=1, state="s", actions_left=1, max_actions_per_turn=1)
    assert "Reward" not in text
    assert "1 action left" in text
