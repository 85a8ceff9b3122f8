"""In-batch cross-scoring: score every reasoning sample under every prompt column, teacher-forced.

For M samples z_i (token ids) and N prompt columns x_j (token ids), with the current policy p:

    L_sum[i, j] = sum_t log p(z_i[t] | x_j, z_i[:t])      shape (M, N)
    L[i, j]     = L_sum[i, j] / len(z_i)                  (per-token mean)

These feed :func:`recipes.mi.mi_proxies`. Two methods compute the same matrices:

* ``naive`` -- the reference implementation: one forward pass per (column, sample) pair over the full sequence
  ``x_j + z_i`` (N x M sequences, batched with right padding).
* ``prefix`` -- encode each prompt once and reuse its key/value cache for all M continuations: per column one
  forward of ``x_j`` (batch 1), then the M samples in batches on top of the cache. Tokens processed drop from
  ``N*M*(P+Z)`` to ``N*P + N*M*Z``, which is the multi-turn win (prompts of thousands of tokens, reasoning of a few
  hundred). Padding is exact: the prefix has none, continuations are right-padded behind a causal mask, and
  positions continue from the prefix length.

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


def _repeat_cache(cache, batch: int):
    """A fresh cache holding ``batch`` views of a batch-1 prefix cache (the original is not modified)."""
    from transformers import DynamicCache

    return DynamicCache(
        [(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1)) for layer in cache.layers]
    )


def _score_prefix(model, prompts: Sequence[TokenIds], samples: Sequence[TokenIds], batch_size: int, pad_id: int):
    import torch

    device = next(model.parameters()).device
    L_sum = np.zeros((len(samples), len(prompts)))
    tokens = 0
    for j, prompt in enumerate(prompts):
        prompt_ids = torch.as_tensor([list(prompt)], dtype=torch.long, device=device)
        prefix = model(input_ids=prompt_ids, use_cache=True)
        tokens += len(prompt)
        first_logprobs = torch.log_softmax(prefix.logits[0, -1].float(), dim=-1)  # predicts every z_i[0]
        length = len(prompt)
        for start in range(0, len(samples), batch_size):
            chunk = list(range(start, min(start + batch_size, len(samples))))
            first_tokens = torch.as_tensor([samples[i][0] for i in chunk], device=device)
            sums = first_logprobs[first_tokens].double()
            rest = [list(samples[i][:-1]) for i in chunk]  # inputs whose logits predict z[1:]
            if max(len(row) for row in rest) > 0:
                ids, mask = _pad_right([row or [pad_id] for row in rest], pad_id, device)
                mask[[r for r, row in enumerate(rest) if not row], 0] = 0
                tokens += int(mask.sum())
                width = ids.shape[1]
                out = model(
                    input_ids=ids,
                    attention_mask=torch.cat([mask.new_ones(len(chunk), length), mask], dim=1),
                    position_ids=torch.arange(length, length + width, device=device).expand(len(chunk), -1),
                    past_key_values=_repeat_cache(prefix.past_key_values, len(chunk)),
                    use_cache=True,
                )
                targets, _ = _pad_right([list(samples[i][1:]) or [pad_id] for i in chunk], pad_id, device)
                logprobs = _token_logprobs(out.logits, targets[:, :width].contiguous())
                sums = sums + (logprobs * mask).double().sum(dim=1)
            L_sum[chunk, j] = sums.cpu().numpy()
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
