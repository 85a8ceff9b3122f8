"""Image observations as vision-language model tokens (Qwen2-VL / Qwen2.5-VL family).

An environment with `observation: image` shows each state as the text placeholder `envs.protocol.IMAGE_PLACEHOLDER`
in its user turn, the frame itself travelling beside the chat (`Turn.image`). For a vision-language policy the
placeholder becomes the model's image markup (Qwen: `<|vision_start|><|image_pad|><|vision_end|>`), rendered by the
chat encoder like any text (`ChatEncoder(tokenizer, image_markup=...)`), and then, at the token level, the one image
pad token of each frame is repeated as many times as the vision tower yields features for it
(`grid_t x grid_h x grid_w / merge_size**2`, the processor's own rule), as the model's processor does. Image tokens
are never in the loss: they are user-turn tokens.

The torch backend (`ImageTokens.encode`) writes a frame's pad tokens as *keyed ids*: each one is the negative
`frame_key` of its frame's pixels instead of the pad id, so that token sequences that show different frames differ
(the sampler's prefix cache, identical-context merging and the MI sample sets' column identity all compare ids).
`ImageTokens.resolve` turns keyed ids back into the model's inputs: the real ids, the frames' `pixel_values` and
`image_grid_thw`. Qwen2-VL's positions are 3-D (M-RoPE: an image spans a grid of positions and the text after it
continues from the grid's largest one); `rope_positions` computes them for whole sequences with the model's own
`get_rope_index`, and a cache reused across turns is extended at those positions, so KV reuse stays exact.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchlib.errors import OrchError
from recipes.policy.chat import ChatEncoder, EncodedChat

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
PROCESSOR_FILE = "preprocessor_config.json"
# Processed frames kept, by their pixels' size: one sampler call, batch or MI set resolves the frames it encoded, so
# this must hold a step's distinct frames (640 frames of 196 patches, a paper-sized Qwen2.5-VL batch, take 0.6 GiB).
FRAME_CACHE_BYTES = 1 << 30


def is_vision_folder(folder: Path) -> bool:
    """Whether the checkpoint in `folder` is a vision-language model (its config.json has a `vision_config`)."""
    import json

    return "vision_config" in json.loads((Path(folder) / "config.json").read_text())


def frame_digest(frame: Any) -> str:
    """SHA-256 (hex) of a frame's shape and pixels: how the rollout-batch dump refers to an image observation."""
    pixels = np.ascontiguousarray(np.asarray(frame))
    return hashlib.sha256(repr(pixels.shape).encode() + pixels.tobytes()).hexdigest()


def frame_key(frame: Any) -> int:
    """A negative integer naming a frame by its pixels (the keyed id of its image tokens)."""
    return -1 - int(frame_digest(frame)[:14], 16)


@dataclass(frozen=True)
class ImageTokens:
    """How a processor's model sees an image: `markup` (the text that stands for one image in the chat), the id of
    its pad token (`pad_id`, repeated once per visual feature) and the processor's image processor."""

    markup: str
    pad_id: int
    image_processor: Any
    vision_ids: tuple[int, ...] = ()  # the vision tokens the policy must never generate (they stand for frames)
    _frames: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)  # key -> (pixels, grid)

    @classmethod
    def from_folder(cls, folder: Path, tokenizer: Any) -> ImageTokens | None:
        """For a vision-language checkpoint folder (Qwen2-VL family: an image processor config and the
        `<|image_pad|>` token), else None. The PIL image processor is used (no torchvision needed)."""
        if not (Path(folder) / PROCESSOR_FILE).is_file() or IMAGE_PAD not in tokenizer.get_vocab():
            return None
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        vocab = tokenizer.get_vocab()
        framed = VISION_START in vocab and VISION_END in vocab
        vision_ids = tuple(vocab[token] for token in (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD) if token in vocab)
        return cls(markup=f"{VISION_START}{IMAGE_PAD}{VISION_END}" if framed else IMAGE_PAD,
                   pad_id=int(vocab[IMAGE_PAD]), image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder),
                   vision_ids=vision_ids)

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

    # -- keyed ids (the torch backend) ----------------------------------------------------------------------------

    @property
    def merge(self) -> int:
        return int(getattr(self.image_processor, "merge_size", 1))

    def frame(self, frame: Any) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(key, pixel_values (patches, dim), image_grid_thw (3,)) of one frame, remembered by key."""
        key = frame_key(frame)
        if key not in self._frames:
            out = self.image_processor(images=[to_image(frame)], return_tensors="pt")
            self._frames[key] = (out["pixel_values"], out["image_grid_thw"][0])
            while sum(pixels.nbytes for pixels, _ in self._frames.values()) > FRAME_CACHE_BYTES:
                self._frames.popitem(last=False)
        self._frames.move_to_end(key)
        return key, *self._frames[key]

    def encode(self, encoder: ChatEncoder, messages: Sequence[Mapping[str, str]], frames: Sequence[Any],
               generated: Mapping[str, Sequence[int]] | None = None, add_generation_prompt: bool = False,
               ) -> EncodedChat:
        """`encoder.encode(...)` with the k-th image placeholder as `frames[k]`'s keyed image tokens."""
        chat = encoder.encode(messages, generated, add_generation_prompt)
        shown = [self.frame(frame) for frame in frames]
        expanded = self.expand(chat, [int(grid.prod()) // self.merge**2 for _, _, grid in shown])
        keys = iter(key for key, _, grid in shown for _ in range(int(grid.prod()) // self.merge**2))
        expanded.input_ids = [next(keys) if token == self.pad_id else token for token in expanded.input_ids]
        return expanded

    def resolve(self, keyed: Sequence[int]) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None]:
        """Keyed ids -> (token ids, pixel_values of the frames in order, image_grid_thw (frames, 3)); None, None
        when no frame is shown. Only whole frames: a sequence cut inside a frame's tokens raises OrchError."""
        ids, pixels, grids = [], [], []
        index = 0
        while index < len(keyed):
            token = keyed[index]
            if token >= 0:
                ids.append(token)
                index += 1
                continue
            if token not in self._frames:
                raise OrchError("an image observation's pixels are no longer cached: a step's distinct frames "
                                f"exceed {FRAME_CACHE_BYTES >> 20} MiB of pixel values (recipes.policy.vision.FRAME_CACHE_BYTES)")
            pixel_values, grid = self._frames[token]
            count = int(grid.prod()) // self.merge**2
            if list(keyed[index : index + count]) != [token] * count:
                raise OrchError("a token sequence starts or ends inside an image's tokens")
            ids.extend([self.pad_id] * count)
            pixels.append(pixel_values)
            grids.append(grid)
            index += count
        if not grids:
            return ids, None, None
        return ids, torch.cat(pixels), torch.stack(grids)

    def rope_positions(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       grids: torch.Tensor) -> torch.Tensor:
        """(3, B, L) M-RoPE position ids of right-padded `input_ids` (B, L) showing frames of `grids` (row order),
        by the model's own `get_rope_index` (padding gets position 0)."""
        types = (input_ids == self.pad_id).int()
        positions, _ = model.base_model.get_rope_index(input_ids, types, image_grid_thw=grids.to(input_ids.device),
                                                       attention_mask=attention_mask)
        return positions


@dataclass
class BatchImages:
    """The frames of a batch's rows: per row, the pixel_values and image_grid_thw of its frames in order."""

    rows: list[tuple[torch.Tensor | None, torch.Tensor | None]]
    tokens: ImageTokens

    def __getitem__(self, index: Any) -> BatchImages:
        return BatchImages([self.rows[int(row)] for row in torch.as_tensor(index).reshape(-1)], self.tokens)

    def model_inputs(self, model: torch.nn.Module, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor) -> dict[str, Any]:
        """pixel_values, image_grid_thw and the 3-D position_ids of the rows (input_ids and mask (B, L))."""
        shown = [(pixels, grid) for pixels, grid in self.rows if grid is not None]
        if not shown:
            return {}
        device = input_ids.device
        grids = torch.cat([grid for _, grid in shown]).to(device)
        return {
            "pixel_values": torch.cat([pixels for pixels, _ in shown]).to(device),
            "image_grid_thw": grids,
            "position_ids": self.tokens.rope_positions(model, input_ids, attention_mask, grids),
        }


class VisionCritic(torch.nn.Module):
    """A value model of a vision-language checkpoint: its backbone (`base_model`, images and M-RoPE included) and a
    fresh scalar head per token, called like a token-classification model (`.logits` (B, L, 1))."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        super().__init__()
        self.model = backbone
        hidden = backbone.config.get_text_config().hidden_size
        self.score = torch.nn.Linear(hidden, 1)

    @property
    def base_model(self) -> torch.nn.Module:
        return self.model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **inputs: Any) -> Any:
        from types import SimpleNamespace

        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, **inputs).last_hidden_state
        return SimpleNamespace(logits=self.score(hidden))


def to_image(frame: Any) -> Any:
    """An environment frame ((H, W, 3) uint8 RGB array) as a PIL image, what VL processors and vLLM take."""
    from PIL import Image

    return frame if isinstance(frame, Image.Image) else Image.fromarray(frame, mode="RGB")
