"""In-batch cross-scoring: score every reasoning sample under every prompt column, teacher-forced.

For M samples z_i (token ids) and N prompt columns x_j (token ids), with the current policy p:

    L_sum[i, j] = sum_t log p(z_i[t] | x_j, z_i[:t])      shape (M, N)
    L[i, j]     = L_sum[i, j] / len(z_i)                  (per-token mean)

These feed :func:`recipes.stats.mi.mi_proxies`. Two methods compute the same matrices:

* ``naive`` -- the reference implementation: one forward pass per (column, sample) pair over the full sequence
  ``x_j + z_i`` (N x M sequences, batched with right padding).
* ``prefix`` -- encode each distinct prompt once and reuse its key/value cache for all M continuations: per column
  one forward of ``x_j`` (batch 1), then the samples ``batch_size`` rows at a time on top of the cache (shortest
  first, right-padded), positions continuing from the prompt length. Their attention
  (:func:`_shared_prefix_attention`, registered with transformers' ``AttentionInterface``, switched on for these forwards only)
  takes the prompt's keys once for all rows -- no per-row copy of the cache, which cost more than the attention
  itself on CPU -- and each row's own keys as a (Z, Z) causal block, one softmax over both. Tokens processed drop
  from ``N*M*(P+Z)`` to ``N*P + N*M*Z``, the multi-turn win (prompts of thousands of tokens, reasoning of a few
  hundred); columns with identical prompt tokens (first turns of one prompt in the trajectory set) are scored
  once and copied.

Both methods score each distinct sample once (:func:`distinct_rows`): identical samples get identical rows.

Both run under ``torch.inference_mode`` (``torch.no_grad`` for FSDP-sharded models) with the model in eval mode and restore its training flag afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from recipes.runtime.stop import poll

if TYPE_CHECKING:
    import torch

TokenIds = Sequence[int]


@dataclass(frozen=True)
class CrossScores:
    """Cross-scoring matrices and what it cost.

    L, L_sum: (M, N) float64. tokens_processed: non-padding tokens fed through the model (distinct samples only).
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
        poll()  # a stop may end the diagnostics between forwards (recipes.runtime.stop)
        chunk = pairs[start : start + batch_size]
        rows = [list(prompts[j]) + list(samples[i]) for i, j in chunk]
        tokens += sum(len(row) for row in rows)
        ids, mask = _pad_right(rows, pad_id, device)
        logprobs = _token_logprobs(model(input_ids=ids, attention_mask=mask).logits[:, :-1], ids[:, 1:])
        for row, (i, j) in enumerate(chunk):
            first, count = len(prompts[j]) - 1, len(samples[i])  # logits at p-1 .. p+z-2 predict z
            L_sum[i, j] = logprobs[row, first : first + count].double().sum().item()
    return L_sum, tokens


PREFIX_ATTENTION = "orch_shared_prefix"


def _attend(query, key, value, scaling: float, causal: bool):
    """Softmax attention (B, H, L, d) and its log-sum-exp (B, H, L): CPU's fused flash kernel, else plain matmuls."""
    import torch

    if query.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, causal,
                                                                                scale=scaling)
        return out, lse
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=query.device).triu_(1)
        scores = scores.masked_fill(future, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), value), lse


def _shared_prefix_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, prefix=None,
                             sliding_window=None, **kwargs):
    """Attention of B continuation rows over ONE shared prompt cache plus each row's own earlier tokens.

    query (B, H, Z, d); key, value (B, Hkv, Z, d): the rows' own tokens (right-padded: causal order keeps every real
    token off the padding); ``prefix``: the prompt's key/value cache (batch 1). The prompt part is one attention
    call with all rows (and the query heads of a key/value head) as one long query -- no per-row copy of the
    cache --, the own part a causal (Z, Z) attention per row, and the two are merged by their log-sum-exps: the
    same weights as one softmax over the concatenated keys. Returns (B, Z, H, d).
    """
    import torch

    if sliding_window is not None:
        raise ValueError("cross-scoring method 'prefix' does not support sliding-window attention; use method naive")
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    layer = prefix.layers[module.layer_idx]
    grouped = query.reshape(batch, kv_heads, groups * length, dim).transpose(0, 1).reshape(1, kv_heads, -1, dim)
    on_prompt, prompt_lse = _attend(grouped, layer.keys, layer.values, scaling, causal=False)
    on_prompt = on_prompt.reshape(kv_heads, batch, groups, length, dim).transpose(0, 1).reshape(query.shape)
    prompt_lse = prompt_lse.reshape(kv_heads, batch, groups * length).transpose(0, 1).reshape(batch, heads, length)
    own_keys, own_values = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    on_self, self_lse = _attend(query, own_keys, own_values, scaling, causal=True)
    total = torch.logaddexp(prompt_lse, self_lse)
    out = on_prompt * (prompt_lse - total).exp()[..., None] + on_self * (self_lse - total).exp()[..., None]
    return out.to(query.dtype).transpose(1, 2), None


@contextmanager
def _attention(model, implementation: str):
    """Run the model's attention layers with ``implementation`` (an AttentionInterface name) inside the block."""
    from recipes.policy.packing import attention_implementation

    with attention_implementation((m.config for m in model.modules() if hasattr(m, "layer_idx")
                                   and hasattr(m, "config")), implementation):
        yield


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _score_prefix(model, prompts: Sequence[TokenIds], samples: Sequence[TokenIds], batch_size: int, pad_id: int):
    """Each distinct prompt encoded once into a key/value cache, then the samples `batch_size` rows at a time on top
    of it (`_score_on_cache`). The prompts go in sorted order, each extending the cache of the one before from
    their longest common prefix (turns of one trajectory, trajectories of one prompt); identical prompts are scored
    once."""
    import torch
    from transformers import AttentionInterface, DynamicCache

    AttentionInterface.register(PREFIX_ATTENTION, _shared_prefix_attention)
    device = next(model.parameters()).device
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]))  # similar lengths share a batch
    columns: dict[tuple[int, ...], np.ndarray] = {}
    tokens, previous, cache = 0, (), DynamicCache()
    for prompt in sorted({tuple(p) for p in prompts}):  # a sorted neighbour shares the longest prefix
        shared = _common_prefix(previous, prompt)
        if shared:
            cache.crop(shared)
        else:
            cache = DynamicCache()
        out = model(input_ids=torch.as_tensor([prompt[shared:]], device=device), past_key_values=cache, use_cache=True)
        tokens += len(prompt) - shared
        first_logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # predicts every z_i[0]
        columns[prompt], scored = _score_on_cache(model, cache, first_logprobs, samples, order, batch_size, pad_id)
        tokens += scored
        previous = prompt
    return np.stack([columns[tuple(p)] for p in prompts], axis=1), tokens


def _score_on_cache(model, cache, first_logprobs, samples: Sequence[TokenIds], order: list[int], batch_size: int,
                    pad_id: int) -> tuple[np.ndarray, int]:
    """L_sum of every sample behind the prompt in `cache`, `batch_size` rows per forward in `order`, and the tokens
    fed."""
    import torch

    device, length = first_logprobs.device, cache.get_seq_length()
    sums, tokens = np.zeros(len(samples)), 0
    for start in range(0, len(order), batch_size):
        poll()
        chunk = order[start : start + batch_size]
        chunk_sums = first_logprobs[torch.as_tensor([samples[i][0] for i in chunk], device=device)].double()
        width = max(len(samples[i]) for i in chunk) - 1  # inputs z[:-1] predict z[1:]
        if width:
            ids = torch.full((len(chunk), width + 1), pad_id, dtype=torch.long, device=device)
            for row, i in enumerate(chunk):
                ids[row, : len(samples[i])] = torch.as_tensor(list(samples[i]), device=device)
            positions = torch.arange(length, length + width, device=device).expand(len(chunk), -1)
            with _attention(model, PREFIX_ATTENTION):
                logits = model(input_ids=ids[:, :-1], position_ids=positions, prefix=cache, use_cache=False).logits
            real = torch.arange(width, device=device)[None] < torch.as_tensor(
                [len(samples[i]) - 1 for i in chunk], device=device)[:, None]
            tokens += int(real.sum())
            logprobs = _token_logprobs(logits[real][None], ids[:, 1:][real][None])[0].double()
            rows = torch.arange(len(chunk), device=device)[:, None].expand(-1, width)[real]
            chunk_sums = chunk_sums.index_add(0, rows, logprobs)
        sums[chunk] = chunk_sums.cpu().numpy()
    return sums, tokens


SCORING_METHODS: dict[str, Callable] = {"naive": _score_naive, "prefix": _score_prefix}


def distinct_rows(samples: Sequence[TokenIds]) -> tuple[list[TokenIds], np.ndarray]:
    """The distinct token sequences of `samples` (first-seen order) and, per sample, the index of its own: identical
    samples (a turn drawn twice, a policy repeating itself) are scored once and their rows copied."""
    index: dict[tuple[int, ...], int] = {}
    inverse = np.array([index.setdefault(tuple(sample), len(index)) for sample in samples], dtype=np.int64)
    return [list(sample) for sample in index], inverse


def cross_score(
    model,
    prompts: Sequence[TokenIds],
    samples: Sequence[TokenIds],
    *,
    method: str = "prefix",
    batch_size: int = 16,
    pad_id: int = 0,
    inference_mode: bool = True,
) -> CrossScores:
    """Score every sample under every prompt column with a Hugging Face causal LM.

    Args:
        model: a ``transformers`` causal LM (``model(input_ids, attention_mask, ...)`` returning ``.logits``).
        prompts: N token-id sequences, each non-empty (the full context up to and including the opening tag).
        samples: M token-id sequences, each non-empty (the reasoning).
        method: ``prefix`` (key/value reuse, default) or ``naive`` (the reference N x M full forwards).
        batch_size: sequences per forward pass.
        pad_id: id used for padding (never scored).
        inference_mode: run under ``torch.inference_mode`` (else ``torch.no_grad``: FSDP2-sharded models, whose
            hooks refuse inference tensors).
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
    distinct, inverse = distinct_rows(samples)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode() if inference_mode else torch.no_grad():
            L_sum, tokens = SCORING_METHODS[method](model, prompts, distinct, batch_size, pad_id)
    finally:
        model.train(was_training)
    L_sum = L_sum[inverse]
    lengths = np.array([len(s) for s in samples], dtype=np.float64)[:, None]
    return CrossScores(L=L_sum / lengths, L_sum=L_sum, tokens_processed=tokens)
