"""Packed forward passes: the rows of a batch as one unpadded sequence (issue 59 item 4).

One unpadded trajectory per pass keeps SDPA's fused causal kernel but leaves the core idle between a 128-wide
model's small matmuls and the modules' Python; padding the rows to the longest wastes the padding and forces the
masked attention path (both measured, docs/training.md). Packing does neither: the rows' real tokens are laid end
to end in one sequence of N tokens with positions restarting at 0 for each row, so every linear layer (projections,
MLP, output head) runs once over all N tokens, and attention runs per row with the fused causal kernel (an
attention function registered with transformers as `orch_packed`, switched on only for the packed call). A row's
result is the one its own unpadded pass gives, to float tolerance (tests/recipes/policy/test_packing.py).

Text models only: a vision-language model keeps the padded path (its M-RoPE positions and frames are per row),
its text-only batches too (a VL cell reading the grid as text, Table 4's modality row): neither its policy nor its
value model (`recipes.policy.vision.VisionCritic`) is packed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from recipes.policy.batch import TrainBatch

PACKED_ATTENTION = "orch_packed"
_registered = False


def _packed_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      orch_lengths: list[int] | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention of each packed row on its own ((1, heads, N, d) in, (1, N, heads, d) out); without
    `orch_lengths` (a call not packed by `packed_forward`), transformers' SDPA attention."""
    if orch_lengths is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    parts = [
        torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling)
        for q, k, v in zip(query.split(orch_lengths, dim=2), key.split(orch_lengths, dim=2),
                           value.split(orch_lengths, dim=2), strict=True)
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
        _registered = True


@contextlib.contextmanager
def packed_attention(model: torch.nn.Module) -> Iterator[None]:
    """Every config of `model`'s modules set to the packed attention for the call; restored afterwards.

    `packed_forward` switches it around each pass. Passes of one model running at once in several threads (the
    warm start's shards) need it held around them all by their caller: otherwise the first pass to finish
    restores the model's own attention under the others' feet (their later layers attend across packed rows)."""
    from transformers import PretrainedConfig

    _register()
    configs = [config for module in model.modules()
               if isinstance(config := getattr(module, "config", None), PretrainedConfig)]
    with attention_implementation(configs, PACKED_ATTENTION):
        yield


@contextlib.contextmanager
def attention_implementation(configs: Iterable[Any], implementation: str) -> Iterator[None]:
    """Each of `configs` (model configs; one object may come more than once) set to the attention `implementation`
    (an AttentionInterface name) inside the block, its own implementation restored afterwards: the packed passes
    here and the prefix cross-scoring (`recipes.stats.cross_scoring`) both switch a model's attention this way."""
    distinct = {id(config): config for config in configs}
    was = {key: config._attn_implementation_internal for key, config in distinct.items()}
    try:
        for config in distinct.values():
            config._attn_implementation_internal = implementation
        yield
    finally:
        for key, config in distinct.items():
            config._attn_implementation_internal = was[key]


@dataclass(frozen=True)
class Packed:
    """The real tokens of T right-padded rows, end to end.

    input_ids, position_ids: (1, N); lengths: each row's token count; starts: (T,) each row's first index in N.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    lengths: list[int]
    starts: torch.Tensor

    def index(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The packed positions of the batch's (row, column) pairs."""
        return self.starts[rows] + cols


def packs(batch: TrainBatch, model: torch.nn.Module) -> bool:
    """Whether `packed_forward` takes `batch` for `model`: more than one row, no images, and a text model (no
    `vision_config`; a model without a `config` of its own, such as a vision-language value head, is not packed)."""
    config = getattr(model, "config", None)
    return (len(batch) > 1 and batch.images is None and config is not None
            and getattr(config, "vision_config", None) is None)


def pack(batch: TrainBatch) -> Packed:
    """The rows of a right-padded `batch` packed end to end."""
    mask = batch.attention_mask.bool()
    lengths = mask.sum(dim=-1)
    starts = torch.cumsum(lengths, dim=0) - lengths
    positions = torch.arange(batch.input_ids.shape[1], device=mask.device).expand_as(mask)
    return Packed(input_ids=batch.input_ids[mask][None], position_ids=positions[mask][None],
                  lengths=lengths.tolist(), starts=starts)


def packed_forward(model: torch.nn.Module, packed: Packed) -> Any:
    """`model` (a causal LM, its backbone, or a token-classification model on it) over a packed sequence: its
    output for the (1, N) packed tokens, each row attending only to itself."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    masks = {layer_type: None for layer_type in set(getattr(config, "layer_types", None) or ["full_attention"])}
    with packed_attention(model):
        return model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=masks,
                     orch_lengths=packed.lengths)
