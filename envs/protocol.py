"""The multi-turn chat protocol (the prompt and reply format of RAGEN-2, arXiv 2604.06268): user-turn text, reply format, and the strict reply parser.

A reply must be exactly ``<think> reasoning </think> <answer> action || action </answer>`` (whitespace allowed
around and between the blocks, nothing else). `parse_response` is total: any string gives either the parsed
actions or one failure code from `FAILURES`, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
ACTION_SEPARATOR = "||"
# Stands for the state image in a user turn when a grid task runs with `observation: image`. Images follow in the
# order of these markers (`Trajectory.images`), the multimodal convention of veRL and Qwen2.5-VL processors.
IMAGE_PLACEHOLDER = "<image>"

# Failure code -> the sentence shown to the agent on its next turn.
FAILURES: dict[str, str] = {
    "not_text": "the reply was not text",
    "missing_think": "the <think> ... </think> block is missing",
    "missing_answer": "the <answer> ... </answer> block is missing",
    "duplicate_tag": "a tag appears more than once",
    "wrong_order": "the tags are out of order (think first, then answer)",
    "extra_text": "there is text outside the <think> and <answer> blocks",
    "empty_answer": "the answer is empty",
    "empty_action": "an action between '||' separators is empty",
    "unknown_action": "an action is not one of the valid actions",
    "invalid_action": "the environment could not apply the action",
}


@dataclass(frozen=True)
class ParsedResponse:
    """Outcome of parsing one reply. `actions` are canonical names, at most `max_actions`, and empty unless ok;
    `extra_actions` counts the valid actions dropped beyond `max_actions`."""

    ok: bool
    reasoning: str = ""
    actions: list[str] = field(default_factory=list)
    failure: str | None = None
    extra_actions: int = 0


def _fail(code: str, reasoning: str = "") -> ParsedResponse:
    return ParsedResponse(ok=False, reasoning=reasoning, failure=code)


def parse_response(text: str, valid_actions: list[str] | None = None, max_actions: int = 2) -> ParsedResponse:
    """Parse a reply. With `valid_actions`, each action must match one of them ignoring case (it is returned in
    the canonical spelling); with None, actions are free text (stripped). Never raises."""
    if not isinstance(text, str):
        return _fail("not_text")
    counts = [text.count(tag) for tag in TAGS]
    if not counts[0] or not counts[1]:
        return _fail("missing_think")
    if not counts[2] or not counts[3]:
        return _fail("missing_answer")
    if max(counts) > 1:
        return _fail("duplicate_tag")
    starts = [text.index(tag) for tag in TAGS]
    if starts != sorted(starts):
        return _fail("wrong_order")
    think_end, answer_end = starts[1] + len(THINK_CLOSE), starts[3] + len(ANSWER_CLOSE)
    reasoning = text[starts[0] + len(THINK_OPEN) : starts[1]].strip()
    outside = text[: starts[0]] + text[think_end : starts[2]] + text[answer_end:]
    if outside.strip():
        return _fail("extra_text", reasoning)
    answer = text[starts[2] + len(ANSWER_OPEN) : starts[3]].strip()
    if not answer:
        return _fail("empty_answer", reasoning)
    actions = [part.strip() for part in answer.split(ACTION_SEPARATOR)]
    if not all(actions):
        return _fail("empty_action", reasoning)
    if valid_actions is not None:
        canonical = {name.lower(): name for name in valid_actions}
        if any(action.lower() not in canonical for action in actions):
            return _fail("unknown_action", reasoning)
        actions = [canonical[action.lower()] for action in actions]
    return ParsedResponse(
        ok=True,
        reasoning=reasoning,
        actions=actions[:max_actions],
        extra_actions=max(0, len(actions) - max_actions),
    )


def format_response(reasoning: str, actions: list[str]) -> str:
    """The reply `parse_response` reads back as (`reasoning`, `actions`)."""
    return f"{THINK_OPEN} {reasoning} {THINK_CLOSE} {ANSWER_OPEN} {f' {ACTION_SEPARATOR} '.join(actions)} {ANSWER_CLOSE}"


def format_reward(reward: float) -> str:
    """A reward as shown to the agent: at most 4 decimals, no trailing zeros (e.g. -0.2, 10.9, 1)."""
    return f"{round(reward, 4) + 0.0:g}"


def user_turn(
    turn: int,
    state: str,
    actions_left: int,
    max_actions_per_turn: int,
    last_reward: float | None = None,
    last_failure: str | None = None,
) -> str:
    """The user message of turn `turn` (1-based): the previous turn's reward and any format failure, the state,
    the remaining action budget and the required reply format."""
    lines = [f"Turn {turn}:"]
    if last_reward is not None:
        lines.append(f"Reward of your previous turn: {format_reward(last_reward)}")
    if last_failure is not None:
        lines.append(f"Your previous reply was invalid: {FAILURES[last_failure]}.")
    lines += ["State:", state, f"You have {actions_left} action{'' if actions_left == 1 else 's'} left."]
    if max_actions_per_turn > 1:
        request = f"up to {max_actions_per_turn} actions separated by '{ACTION_SEPARATOR}'"
    else:
        request = "exactly one answer"
    lines.append(
        f"Reply with {THINK_OPEN} your reasoning {THINK_CLOSE} {ANSWER_OPEN} {request} {ANSWER_CLOSE}"
        " and no other text."
    )
    return "\n".join(lines)
