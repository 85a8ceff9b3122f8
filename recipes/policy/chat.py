"""Chat transcripts to token sequences, with the loss mask of what the policy generated.

A whole trajectory is one sequence: the rendered chat (system, user, assistant, user, ...). Only the tokens of the
assistant replies are in the loss (including the end-of-turn token when the policy emitted it), never system,
user/observation or template tokens, never padding. The same encoder builds generation contexts, so a training
sequence is token for token the context the policy sampled from (no re-tokenisation drift): replies are taken
from the ids the sampler recorded, keyed by their text, and encoded from text only when unknown (demonstrations).

Works with any chat template that re-renders earlier messages unchanged (ChatML / Qwen2.5, Llama 3, ...);
otherwise `ChatEncoder.encode` raises an OrchError naming the problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.protocol import IMAGE_PLACEHOLDER
from orchlib.errors import OrchError

_PROBE_USER, _PROBE_REPLY = "orch-probe-user", "orch-probe-reply"


@dataclass
class EncodedChat:
    """One chat as tokens.

    input_ids: (L,) token ids.
    loss_mask: (L,) 1 on tokens the policy generated (assistant replies), else 0.
    turn_ends: index in `input_ids` of the last token of each assistant reply, in turn order.
    """

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)

    def extend(self, ids: Sequence[int], in_loss: bool) -> None:
        self.input_ids.extend(ids)
        self.loss_mask.extend([int(in_loss)] * len(ids))


class ChatEncoder:
    """Renders chats with the tokenizer's chat template and tokenises them segment by segment. With `image_markup`
    (a vision-language model's image text, see `recipes.policy.vision`) the image placeholder of user turns is rendered as it.
    With `vision` (a `recipes.policy.vision.ImageTokens`, the torch backend's vision-language models) its markup is used, and
    `vision.encode` tokenises chats with their frames.

    Attributes:
        end_of_turn_id: the token the template closes an assistant reply with (generation stops on it).
        end_of_turn_text: its text.
    """

    def __init__(self, tokenizer: Any, image_markup: str | None = None, vision: Any = None) -> None:
        self.tokenizer = tokenizer
        self.vision = vision  # recipes.policy.vision.ImageTokens of a vision-language model, else None
        # replaces the image placeholder of user turns (recipes.policy.vision)
        self.image_markup = vision.markup if vision is not None else image_markup
        self.end_of_turn_id, self.end_of_turn_text = self._probe_end_of_turn()

    def _render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
        if self.image_markup is not None:
            messages = [message if message["role"] == "assistant" else
                        {**message, "content": message["content"].replace(IMAGE_PLACEHOLDER, self.image_markup)}
                        for message in messages]
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _probe_end_of_turn(self) -> tuple[int, str]:
        chat = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]
        rendered = self._render(chat, add_generation_prompt=False)
        after = rendered[rendered.index(_PROBE_REPLY) + len(_PROBE_REPLY) :]
        ids = self._encode_text(after)
        special = set(self.tokenizer.all_special_ids) | set(getattr(self.tokenizer, "added_tokens_decoder", {}))
        if not ids or ids[0] not in special:
            raise OrchError(
                "the tokenizer's chat template does not close assistant replies with a special token; "
                "the trainer needs one to stop generation (e.g. <|im_end|>)"
            )
        text = self.tokenizer.convert_ids_to_tokens(ids[0])
        if not after.startswith(text):
            raise OrchError(f"chat template: the end-of-turn token {text!r} does not start the text after a reply")
        return ids[0], text

    def reply_ids(self, text: str) -> list[int]:
        """Token ids of a reply known only as text (a demonstration): its tokens plus the end-of-turn token."""
        return [*self._encode_text(text), self.end_of_turn_id]

    def encode(
        self,
        messages: Sequence[Mapping[str, str]],
        generated: Mapping[str, Sequence[int]] | None = None,
        add_generation_prompt: bool = False,
    ) -> EncodedChat:
        """Tokenise `messages` (HF chat format).

        Args:
            messages: system/user/assistant messages.
            generated: reply text -> the ids the sampler produced for it (end-of-turn id included when emitted);
                replies not found here are encoded from text and closed with the end-of-turn token.
            add_generation_prompt: end with the template's assistant header (a generation context).
        """
        generated = generated or {}
        out = EncodedChat()
        consumed = ""
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            self._append_template(out, messages[:index], consumed, True)
            reply = message["content"]
            ids = list(generated.get(reply) or self.reply_ids(reply))
            out.extend(ids, in_loss=True)
            out.turn_ends.append(len(out.input_ids) - 1)
            closed = bool(ids) and ids[-1] == self.end_of_turn_id
            consumed = self._render(messages[:index], True) + reply + (self.end_of_turn_text if closed else "")
        if add_generation_prompt:
            self._append_template(out, messages, consumed, True)
        return out

    def _append_template(
        self, out: EncodedChat, messages: Sequence[Mapping[str, str]], consumed: str, generation_prompt: bool
    ) -> None:
        rendered = self._render(messages, generation_prompt)
        if not rendered.startswith(consumed):
            raise OrchError(
                "the chat template re-renders earlier turns differently (e.g. it drops reasoning from history); "
                "a trajectory cannot be one token sequence with this template"
            )
        out.extend(self._encode_text(rendered[len(consumed) :]), in_loss=False)
