"""In-batch cross-scoring: score every reasoning sample under every prompt column, teacher-forced.

For M samples z_i (token ids) and N prompt columns x_j (token ids), with the current policy p:

    L_sum[i, j] = sum_t log p(z_i[t] | x_j, z_i[:t])      shape (M, N)
    L[i, j]     = L_sum[i, j] / len(z_i)                  (per-token mean)

These feed :func:`recipes.mi.mi_proxies`. Two methods compute the same matrices:

* ``naive`` -- the reference implementation: one forward pass per (column, sample) pair over the full sequence
  ``x_j + z_i`` (N x M sequences, batched with right padding).
* ``prefix`` -- encode each prompt once and reuse its key/value cache for all M continuations: per column one
  forward of ``x_j`` (batch 1), then the samples packed ``batch_size`` at a time into one row on top of the cache,
  each seeing the prompt and its own earlier tokens only (a block-diagonal causal mask; positions continue from
  the prompt length). Tokens processed drop from ``N*M*(P+Z)`` to ``N*P + N*M*Z``, which is the multi-turn win
  (prompts of thousands of tokens, reasoning of a few hundred). There is no padding at all, and the prompt's cache
  is never copied per sample (expanding it to a batch cost more than the attention itself on CPU).

Both run under ``torch.inference_mode`` with the model in eval mode and restore its training flag afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

TokenIds = Sequence[int]


@dataclass(frozen=True)
class CrossScores:
    """Cross-scoring matrices and what it cost.

    L, L_sum: (M, N) float64. tokens_processed: non-padding tokens fed through the model.
    """

    L: np.ndarray
    L_sum: np.ndarray
    tokens_processed: int


def _pad_right(rows: Sequence[TokenIds], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids padded with ``pad_id`` and the (B, T) 0/1 attention mask."""
    import torch

    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.as_tensor(list(row), dtype=torch.long, device=device)
        mask[r, : len(row)] = 1
    return ids, mask


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits (B, T, V), targets (B, T) -> (B, T), computed in float32."""
    import torch

    logits = logits.float()
    return torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _score_naive(model, prompts: Sequence[TokenIds], samples: Sequence[TokenIds], batch_size: int, pad_id: int):
    device = next(model.parameters()).device
    L_sum = np.zeros((len(samples), len(prompts)))
    pairs = [(i, j) for j in range(len(prompts)) for i in range(len(samples))]
    tokens = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        rows = [list(prompts[j]) + list(samples[i]) for i, j in chunk]
        tokens += sum(len(row) for row in rows)
        ids, mask = _pad_right(rows, pad_id, device)
        logprobs = _token_logprobs(model(input_ids=ids, attention_mask=mask).logits[:, :-1], ids[:, 1:])
        for row, (i, j) in enumerate(chunk):
            first, count = len(prompts[j]) - 1, len(samples[i])  # logits at p-1 .. p+z-2 predict z
            L_sum[i, j] = logprobs[row, first : first + count].double().sum().item()
    return L_sum, tokens


def _packed_mask(owner: torch.Tensor, positions: torch.Tensor, prefix_length: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask (1, 1, n, prefix + n) for n packed continuation tokens behind a shared prefix: every
    token sees the whole prefix and the earlier tokens of its own sample (`owner`), nothing of the others."""
    import torch

    allowed = (owner[:, None] == owner[None, :]) & (positions[None, :] <= positions[:, None])
    mask = torch.zeros((1, 1, len(owner), prefix_length + len(owner)), dtype=dtype, device=owner.device)
    mask[0, 0, :, prefix_length:] = torch.where(allowed, 0.0, float("-inf"))
    return mask


def _score_prefix(model, prompts: Sequence[TokenIds], samples: Sequence[TokenIds], batch_size: int, pad_id: int):
    """Per column: one forward of the prompt into a key/value cache, then the samples `batch_size` at a time packed
    into ONE row on top of it (block-diagonal causal mask, positions continuing from the prompt), cropping the cache
    back to the prompt after each pack. No padding and no per-sample copy of the prompt's cache."""
    import torch
    from transformers import DynamicCache

    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    L_sum = np.zeros((len(samples), len(prompts)))
    tokens = 0
    for j, prompt in enumerate(prompts):
        length = len(prompt)
        cache = DynamicCache()
        prefix = model(input_ids=torch.as_tensor([list(prompt)], device=device), past_key_values=cache, use_cache=True)
        tokens += length
        first_logprobs = torch.log_softmax(prefix.logits[0, -1].float(), dim=-1)  # predicts every z_i[0]
        for start in range(0, len(samples), batch_size):
            chunk = range(start, min(start + batch_size, len(samples)))
            sums = first_logprobs[torch.as_tensor([samples[i][0] for i in chunk], device=device)].double()
            inputs = [list(samples[i][:-1]) for i in chunk]  # their logits predict z[1:]
            if any(inputs):
                owner = torch.as_tensor([r for r, row in enumerate(inputs) for _ in row], device=device)
                positions = torch.as_tensor([length + t for row in inputs for t in range(len(row))], device=device)
                out = model(
                    input_ids=torch.as_tensor([[token for row in inputs for token in row]], device=device),
                    position_ids=positions[None], attention_mask=_packed_mask(owner, positions, length, dtype),
                    past_key_values=cache, use_cache=True,
                )
                cache.crop(length)
                tokens += len(owner)
                targets = torch.as_tensor([[token for i in chunk for token in samples[i][1:]]], device=device)
                logprobs = _token_logprobs(out.logits, targets)[0].double()
                sums = sums.index_add(0, owner, logprobs)
            L_sum[list(chunk), j] = sums.cpu().numpy()
    return L_sum, tokens


SCORING_METHODS: dict[str, Callable] = {"naive": _score_naive, "prefix": _score_prefix}


def cross_score(
    model,
    prompts: Sequence[TokenIds],
    samples: Sequence[TokenIds],
    *,
    method: str = "prefix",
    batch_size: int = 16,
    pad_id: int = 0,
) -> CrossScores:
    """Score every sample under every prompt column with a Hugging Face causal LM.

    Args:
        model: a ``transformers`` causal LM (``model(input_ids, attention_mask, ...)`` returning ``.logits``).
        prompts: N token-id sequences, each non-empty (the full context up to and including the opening tag).
        samples: M token-id sequences, each non-empty (the reasoning).
        method: ``prefix`` (key/value reuse, default) or ``naive`` (the reference N x M full forwards).
        batch_size: sequences per forward pass.
        pad_id: id used for padding (never scored).
    """
    import torch

    if method not in SCORING_METHODS:
        raise ValueError(f"unknown cross-scoring method {method!r}; valid choices: {', '.join(SCORING_METHODS)}")
    if not prompts or not samples:
        raise ValueError(f"cross-scoring needs >= 1 prompt and >= 1 sample, got {len(prompts)} and {len(samples)}")
    if any(len(p) == 0 for p in prompts) or any(len(s) == 0 for s in samples):
        raise ValueError("every prompt and every sample must hold at least one token")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            L_sum, tokens = SCORING_METHODS[method](model, prompts, samples, batch_size, pad_id)
    finally:
        model.train(was_training)
    lengths = np.array([len(s) for s in samples], dtype=np.float64)[:, None]
    return CrossScores(L=L_sum / lengths, L_sum=L_sum, tokens_processed=tokens)
