"""Image observations as vision-language model tokens (Qwen2-VL / Qwen2.5-VL family).

An environment with `observation: image` shows each state as the text placeholder `envs.protocol.IMAGE_PLACEHOLDER`
in its user turn, the frame itself travelling beside the chat (`Turn.image`). For a vision-language policy the
placeholder becomes the model's image markup (Qwen: `<|vision_start|><|image_pad|><|vision_end|>`), rendered by the
chat encoder like any text (`ChatEncoder(tokenizer, image_markup=...)`), and then, at the token level, the one image
pad token of each frame is repeated as many times as the vision tower yields features for it
(`grid_t x grid_h x grid_w / merge_size**2`, the processor's own rule), as the model's processor does. Image tokens
are never in the loss: they are user-turn tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchlib.errors import OrchError
from recipes.chat import EncodedChat

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"


@dataclass(frozen=True)
class ImageTokens:
    """How a processor's model sees an image: `markup` (the text that stands for one image in the chat), the id of
    its pad token (`pad_id`, repeated once per visual feature) and the processor's image processor."""

    markup: str
    pad_id: int
    image_processor: Any

    @classmethod
    def from_processor(cls, processor: Any) -> ImageTokens:
        """From a Hugging Face VL processor (its `image_token`, `tokenizer` and `image_processor`)."""
        image_token = getattr(processor, "image_token", None)
        tokenizer = getattr(processor, "tokenizer", None)
        if image_token is None or tokenizer is None or getattr(processor, "image_processor", None) is None:
            raise OrchError("image observations need a vision-language checkpoint whose processor has an image token "
                            "(Qwen2-VL / Qwen2.5-VL); this model's processor has none")
        vocab = tokenizer.get_vocab()
        framed = VISION_START in vocab and VISION_END in vocab
        markup = f"{VISION_START}{image_token}{VISION_END}" if framed else image_token
        return cls(markup=markup, pad_id=int(tokenizer.convert_tokens_to_ids(image_token)),
                   image_processor=processor.image_processor)

    def feature_counts(self, images: Sequence[Any]) -> list[int]:
        """Visual features per image: the pad tokens each one takes in the sequence."""
        if not images:
            return []
        grids = self.image_processor(images=list(images), return_tensors="pt")["image_grid_thw"]
        merge = int(getattr(self.image_processor, "merge_size", 1))
        return [int(grid.prod()) // (merge * merge) for grid in grids]

    def expand(self, chat: EncodedChat, counts: Sequence[int]) -> EncodedChat:
        """`chat` with its k-th image pad token repeated `counts[k]` times (loss mask 0; reply ends shifted)."""
        pads = [index for index, token in enumerate(chat.input_ids) if token == self.pad_id]
        if len(pads) != len(counts):
            raise OrchError(f"the chat holds {len(pads)} image(s) but {len(counts)} frame(s) were given")
        out, shift, ends = EncodedChat(), 0, iter(chat.turn_ends)
        extra = dict(zip(pads, counts, strict=True))
        next_end = next(ends, None)
        for index, (token, in_loss) in enumerate(zip(chat.input_ids, chat.loss_mask, strict=True)):
            repeat = extra.get(index, 1)
            out.extend([token] * repeat, in_loss=bool(in_loss))
            shift += repeat - 1
            if index == next_end:
                out.turn_ends.append(index + shift)
                next_end = next(ends, None)
        return out


def to_image(frame: Any) -> Any:
    """An environment frame ((H, W, 3) uint8 RGB array) as a PIL image, what VL processors and vLLM take."""
    from PIL import Image

    return frame if isinstance(frame, Image.Image) else Image.fromarray(frame, mode="RGB")
