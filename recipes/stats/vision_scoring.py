"""In-batch cross-scoring (`recipes.stats.cross_scoring`) of reasoning under prompts that show frames (image observations
on a vision-language policy).

Prompts are keyed ids (`recipes.policy.vision`): each frame's image tokens carry the frame's key, so prompts that show
different frames are different columns. The two methods compute the same matrices as their text versions:

* ``naive`` -- one forward per (column, sample) pair over ``x_j + z_i``, with the frames of ``x_j`` and the
  M-RoPE positions of the whole sequence (right padding, batched).
* ``prefix`` -- per column one forward of ``x_j`` with its frames into a key/value cache (vision features and 3-D
  positions included), then the samples packed on top of it exactly as the text method does; the text after a
  prompt continues from the prompt's largest position (Qwen2-VL's rule), so the result equals the naive one.

Prompts without frames go to `recipes.stats.cross_scoring.cross_score` unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from recipes.policy.vision import ImageTokens
from recipes.stats.cross_scoring import (
    SCORING_METHODS,
    CrossScores,
    TokenIds,
    _pad_right,
    _token_logprobs,
    cross_score,
    distinct_rows,
)


def _packed_mask(owner: torch.Tensor, positions: torch.Tensor, prefix_length: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask (1, 1, n, prefix + n) for n packed continuation tokens behind a shared prefix: every
    token sees the whole prefix and the earlier tokens of its own sample (`owner`), nothing of the others."""
    allowed = (owner[:, None] == owner[None, :]) & (positions[None, :] <= positions[:, None])
    mask = torch.zeros((1, 1, len(owner), prefix_length + len(owner)), dtype=dtype, device=owner.device)
    mask[0, 0, :, prefix_length:] = torch.where(allowed, 0.0, float("-inf"))
    return mask


def _score_naive(model: Any, vision: ImageTokens, prompts: Sequence[TokenIds], samples: Sequence[TokenIds],
                 batch_size: int, pad_id: int) -> tuple[np.ndarray, int]:
    device = next(model.parameters()).device
    L_sum = np.zeros((len(samples), len(prompts)))
    resolved = [vision.resolve(prompt) for prompt in prompts]
    pairs = [(i, j) for j in range(len(prompts)) for i in range(len(samples))]
    tokens = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        rows = [resolved[j][0] + list(samples[i]) for i, j in chunk]
        tokens += sum(len(row) for row in rows)
        ids, mask = _pad_right(rows, pad_id, device)
        inputs: dict[str, Any] = {}
        shown = [resolved[j] for _, j in chunk if resolved[j][2] is not None]
        if shown:
            grids = torch.cat([grid for _, _, grid in shown]).to(device)
            inputs = {"pixel_values": torch.cat([pixels for _, pixels, _ in shown]).to(device),
                      "image_grid_thw": grids, "position_ids": vision.rope_positions(model, ids, mask, grids)}
        logprobs = _token_logprobs(model(input_ids=ids, attention_mask=mask, **inputs).logits[:, :-1], ids[:, 1:])
        for row, (i, j) in enumerate(chunk):
            first, count = len(resolved[j][0]) - 1, len(samples[i])
            L_sum[i, j] = logprobs[row, first : first + count].double().sum().item()
    return L_sum, tokens


def _score_prefix(model: Any, vision: ImageTokens, prompts: Sequence[TokenIds], samples: Sequence[TokenIds],
                  batch_size: int, pad_id: int) -> tuple[np.ndarray, int]:
    from transformers import DynamicCache

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    L_sum = np.zeros((len(samples), len(prompts)))
    tokens = 0
    for j, prompt in enumerate(prompts):
        ids, pixels, grids = vision.resolve(prompt)
        prompt_ids = torch.as_tensor([ids], device=device)
        inputs: dict[str, Any] = {}
        last = len(ids) - 1
        if grids is not None:
            positions = vision.rope_positions(model, prompt_ids, None, grids)
            inputs = {"pixel_values": pixels.to(device), "image_grid_thw": grids.to(device), "position_ids": positions}
            last = int(positions[:, 0, -1].max())
        cache = DynamicCache()
        prefix = model(input_ids=prompt_ids, past_key_values=cache, use_cache=True, **inputs)
        length = len(ids)
        tokens += length
        first_logprobs = torch.log_softmax(prefix.logits[0, -1].float(), dim=-1)  # predicts every z_i[0]
        for start in range(0, len(samples), batch_size):
            chunk = range(start, min(start + batch_size, len(samples)))
            sums = first_logprobs[torch.as_tensor([samples[i][0] for i in chunk], device=device)].double()
            rows = [list(samples[i][:-1]) for i in chunk]  # their logits predict z[1:]
            if any(rows):
                owner = torch.as_tensor([r for r, row in enumerate(rows) for _ in row], device=device)
                steps = torch.as_tensor([t for row in rows for t in range(len(row))], device=device)
                out = model(
                    input_ids=torch.as_tensor([[token for row in rows for token in row]], device=device),
                    position_ids=(last + 1 + steps)[None],  # text after the prompt: one position per token
                    attention_mask=_packed_mask(owner, length + steps, length, dtype),
                    past_key_values=cache, use_cache=True,
                )
                cache.crop(length)
                tokens += len(owner)
                targets = torch.as_tensor([[token for i in chunk for token in samples[i][1:]]], device=device)
                sums = sums.index_add(0, owner, _token_logprobs(out.logits, targets)[0].double())
            L_sum[list(chunk), j] = sums.cpu().numpy()
    return L_sum, tokens


IMAGE_METHODS = {"naive": _score_naive, "prefix": _score_prefix}  # every exact method but naive reuses the prefix


def cross_score_images(model: Any, vision: ImageTokens, prompts: Sequence[TokenIds], samples: Sequence[TokenIds],
                       *, method: str = "prefix", batch_size: int = 16, pad_id: int = 0) -> CrossScores:
    """`recipes.stats.cross_scoring.cross_score` for prompts given as keyed ids (frames shown); same arguments, checks
    and result."""
    if not any(min(prompt, default=0) < 0 for prompt in prompts):
        return cross_score(model, prompts, samples, method=method, batch_size=batch_size, pad_id=pad_id)
    if method not in SCORING_METHODS:
        raise ValueError(f"unknown cross-scoring method {method!r}; valid choices: {', '.join(SCORING_METHODS)}")
    if not samples or any(len(s) == 0 for s in samples) or batch_size < 1:
        raise ValueError("cross-scoring needs >= 1 non-empty sample and batch_size >= 1")
    distinct, inverse = distinct_rows(samples)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            L_sum, tokens = IMAGE_METHODS["naive" if method == "naive" else "prefix"](model, vision, prompts, distinct,
                                                                                       batch_size, pad_id)
    finally:
        model.train(was_training)
    L_sum = L_sum[inverse]
    lengths = np.array([len(s) for s in samples], dtype=np.float64)[:, None]
    return CrossScores(L=L_sum / lengths, L_sum=L_sum, tokens_processed=tokens)
