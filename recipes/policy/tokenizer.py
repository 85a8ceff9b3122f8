"""A tokenizer built in code for the tiny model presets: byte-level BPE trained on the tasks' protocol text.

It is an ordinary Hugging Face fast tokenizer (saved as `tokenizer.json` + `tokenizer_config.json`) with a ChatML
chat template, so a preset model folder reloads like any checkpoint. Byte-level means every string is encodable;
the protocol tags are atomic tokens so a tiny model can emit them in one step, and every cell of a text grid is
its own token so that a tiny model can read coordinates off the grid.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"  # the end-of-turn token: generation stops on it and it is part of the response
SPECIAL_TOKENS = (PAD_TOKEN, TURN_START, TURN_END)
PROTOCOL_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
# One token per cell of a text grid (a line made only of the grid tasks' symbols, Sokoban's and FrozenLake's): BPE
# would merge runs such as "___#" into one token, and a tiny model could then not tell a cell's column by counting.
GRID_CELL = r"[#_OXPGS√](?=[#_OXPGS√]*\n)"
# Qwen2-VL's image markup and its video pad (vision presets; the trainer shows images only)
VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")

# ChatML, as Qwen2.5 renders it when a system message is present (no default system prompt injected).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(
    corpus: Iterable[str], vocab_size: int, extra_special: tuple[str, ...] = ()
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer of at most `vocab_size` entries on `corpus` (strings); `extra_special`
    tokens (e.g. `VISION_TOKENS`) are added as special tokens after the protocol tokens.

    Returns a `PreTrainedTokenizerFast` with `eos_token` = `<|im_end|>`, `pad_token` = `<|endoftext|>`, no BOS, and
    the ChatML `chat_template`.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GRID_CELL), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    backend.add_tokens([AddedToken(token, normalized=False, single_word=False) for token in PROTOCOL_TOKENS])
    if extra_special:
        backend.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in extra_special])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=TURN_END,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
