"""The MI proxy family from in-batch cross-scoring: the single implementation (RAGEN-2 (arXiv 2604.06268): in-batch cross-scoring).

Input: M reasoning samples, each produced from one of N prompt columns, scored teacher-forced under *every*
column by the current policy:

    L[i, j]     = mean over tokens of log p(z_i | x_j)   (per-token, length-normalised), shape (M, N)
    L_sum[i, j] = sum over tokens of log p(z_i | x_j)    (per-sequence), shape (M, N)
    column[i]   = c(i), the column sample i was generated from, shape (M,)

    matched_i  = L[i, c(i)]
    marginal_i = logsumexp_j L[i, j] - log N

If the policy ignores its input, every row of L is constant, matched = marginal and every proxy sits at its
collapse value. Columns whose prompt tokens are identical are *equivalent* (``column_classes``): retrieving any
column equivalent to c(i) counts as correct.

All arithmetic is float64; logsumexp is shifted by the row maximum.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

RECALL_KS = (2, 4, 8)
ZSCORE_EPS = 1e-3
EMA_DECAY = 0.9


def _as_float_matrix(values: Any, name: str) -> np.ndarray:
    if hasattr(values, "detach"):  # torch.Tensor, without importing torch
        values = values.detach().cpu().numpy()
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] == 0 or matrix.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty (M samples x N columns) matrix, got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name} contains NaN or infinite log-probabilities")
    return matrix


def logsumexp_rows(matrix: np.ndarray) -> np.ndarray:
    """Row-wise log-sum-exp, (M, N) -> (M,), stable for large negative log-probabilities."""
    top = matrix.max(axis=1, keepdims=True)
    return (top + np.log(np.exp(matrix - top).sum(axis=1, keepdims=True)))[:, 0]


def matched_and_marginal(scores: np.ndarray, column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``matched_i = scores[i, c(i)]`` and ``marginal_i = logsumexp_j scores[i, j] - log N``, each (M,)."""
    matched = scores[np.arange(scores.shape[0]), column]
    marginal = logsumexp_rows(scores) - math.log(scores.shape[1])
    return matched, marginal


def _expected_hit(scores_row: np.ndarray, equivalent: np.ndarray, k: int) -> float:
    """Probability that some column equivalent to the true one ranks in the top-k, ties broken uniformly at random.

    Exact for ties: with ``g`` non-equivalent columns strictly above the best equivalent score, ``t`` non-equivalent
    and ``e`` equivalent columns tied with it, a hit needs one of the ``e`` among the first ``k - g`` tied slots.
    """
    best = scores_row[equivalent].max()
    others = scores_row[~equivalent]
    above = int(np.count_nonzero(others > best))
    slots = k - above
    if slots <= 0:
        return 0.0
    tied_others = int(np.count_nonzero(others == best))
    tied_equivalent = int(np.count_nonzero(scores_row[equivalent] == best))
    slots = min(slots, tied_others + tied_equivalent)
    if slots > tied_others:
        return 1.0
    return 1.0 - math.comb(tied_others, slots) / math.comb(tied_others + tied_equivalent, slots)


@dataclass(frozen=True)
class MIProxies:
    """The proxies of one cross-scoring matrix (names as in RAGEN-2; collapse values in comments)."""

    num_samples: int
    num_columns: int
    retrieval_acc: float  # -> chance
    retrieval_chance: float
    recall_at: dict[int, float]  # k -> recall@k for k in (2, 4, 8), evaluated at min(k, N)
    recall_chance_at: dict[int, float]
    mi_est: float  # -> 0; upper bound log N
    mi_seq_est: float  # -> 0
    mi_zscore: float  # -> 0
    mi_seq_zscore: float  # -> 0
    marginal_std: float  # population std of the per-token marginals; feeds the EMA z-score
    conditional_entropy: float  # -mean(matched), per token
    reasoning_entropy: float  # -mean(marginal), per token
    conditional_entropy_seq: float
    reasoning_entropy_seq: float
    mean_gap: float = field(repr=False)  # mean_i (matched_i - marginal_i) on L

    def to_metrics(self, prefix: str) -> dict[str, float]:
        """Flat metric dict, e.g. ``prefix/retrieval_acc``, ``prefix/recall_at_2`` (MLflow-valid names: no ``@``)."""
        flat = {k: v for k, v in asdict(self).items() if not isinstance(v, dict) and k != "mean_gap"}
        flat.update({f"recall_at_{k}": v for k, v in self.recall_at.items()})
        flat.update({f"recall_at_{k}_chance": v for k, v in self.recall_chance_at.items()})
        return {f"{prefix}/{name}": float(value) for name, value in flat.items()}


def mi_proxies(L: Any, L_sum: Any, column: Any, column_classes: Any | None = None) -> MIProxies:
    """Compute the MI proxy family from the cross-scoring matrices.

    Args:
        L: (M, N) per-token mean log-probabilities.
        L_sum: (M, N) per-sequence summed log-probabilities.
        column: (M,) integer column c(i) of every sample, in [0, N).
        column_classes: optional (N,) labels; columns with equal labels have identical prompt tokens. By default
            every column is its own class.
    """
    L = _as_float_matrix(L, "L")
    L_sum = _as_float_matrix(L_sum, "L_sum")
    if L.shape != L_sum.shape:
        raise ValueError(f"L has shape {L.shape} but L_sum has shape {L_sum.shape}; they must match")
    num_samples, num_columns = L.shape
    column = np.asarray(column)
    if column.shape != (num_samples,) or not np.issubdtype(column.dtype, np.integer):
        raise ValueError(f"column must hold {num_samples} integer column indices, got shape {column.shape}")
    if column.min() < 0 or column.max() >= num_columns:
        raise ValueError(f"column indices must lie in [0, {num_columns}), got range [{column.min()}, {column.max()}]")
    classes = np.arange(num_columns) if column_classes is None else np.asarray(column_classes)
    if classes.shape != (num_columns,):
        raise ValueError(f"column_classes must have one label per column ({num_columns}), got shape {classes.shape}")

    equivalent = classes[None, :] == classes[column][:, None]  # (M, N)
    chance = float(equivalent.sum(axis=1).mean() / num_columns)
    ks = (1, *RECALL_KS)  # recall@k is computed at min(k, N) but keeps its name, so metric names never vary
    hits = {
        k: float(np.mean([_expected_hit(L[i], equivalent[i], min(k, num_columns)) for i in range(num_samples)]))
        for k in ks
    }

    matched, marginal = matched_and_marginal(L, column)
    matched_seq, marginal_seq = matched_and_marginal(L_sum, column)
    gap, gap_seq = matched - marginal, matched_seq - marginal_seq
    marginal_std = float(marginal.std())
    return MIProxies(
        num_samples=num_samples,
        num_columns=num_columns,
        retrieval_acc=hits[1],
        retrieval_chance=chance,
        recall_at={k: hits[k] for k in RECALL_KS},
        recall_chance_at={k: min(1.0, min(k, num_columns) * chance) for k in RECALL_KS},
        mi_est=float(gap.mean()),
        mi_seq_est=float(gap_seq.mean()),
        mi_zscore=float(gap.mean() / (marginal_std + ZSCORE_EPS)),
        mi_seq_zscore=float(gap_seq.mean() / (float(marginal_seq.std()) + ZSCORE_EPS)),
        marginal_std=marginal_std,
        conditional_entropy=float(-matched.mean()),
        reasoning_entropy=float(-marginal.mean()),
        conditional_entropy_seq=float(-matched_seq.mean()),
        reasoning_entropy_seq=float(-marginal_seq.mean()),
        mean_gap=float(gap.mean()),
    )


def retrieval_excess(accuracy: Any, chance: Any) -> Any:
    """Retrieval accuracy's excess over its chance level, ``accuracy / chance - 1``: 0 at chance, 1 at twice chance.

    Scalars give a float, arrays (or pandas Series) an array of the same shape. Where chance is 0 (no column to
    tell apart) the excess is 0; NaN in either input stays NaN (no sample set, nothing measured).
    """
    acc = np.asarray(accuracy, dtype=np.float64)
    base = np.asarray(chance, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(base == 0.0, 0.0, acc / base - 1.0)
    excess = np.where(np.isnan(acc) | np.isnan(base), np.nan, excess)
    return float(excess) if excess.ndim == 0 else excess


def retrieval_p_value(accuracy: float, chance: float, num_samples: int) -> float:
    """How likely an input-blind policy retrieves this well: the binomial upper tail P(X >= hits), X ~ Bin(n, chance),
    with hits = round(accuracy * n) of n = ``num_samples`` (each sample retrieves its own column with the chance
    probability when the scores ignore the prompt). With 32 samples at chance 1/32, 2 hits (2x chance) come by luck
    26% of the time, 4 hits 1.7%. NaN when accuracy or chance is NaN or there are no samples."""
    from scipy.stats import binom

    if num_samples < 1 or math.isnan(accuracy) or math.isnan(chance):
        return float("nan")
    hits = round(accuracy * num_samples)
    return float(binom.sf(hits - 1, num_samples, min(max(chance, 0.0), 1.0)))


class ZScoreEMA:
    """MI-ZScore-EMA: the z-score with a smoothed denominator.

    ``sigma_t = decay * sigma_{t-1} + (1 - decay) * std_t``, initialised to the first ``std_t`` it sees and updated
    only on steps where the proxies are computed; ``value = mean(matched - marginal) / (sigma_t + 1e-3)``.
    Its state travels with training checkpoints (:meth:`state_dict` / :meth:`load_state_dict`).
    """

    def __init__(self, decay: float = EMA_DECAY) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.sigma: float | None = None

    def update(self, proxies: MIProxies) -> float:
        """Fold in this step's marginal std and return MI-ZScore-EMA for it."""
        std = proxies.marginal_std
        self.sigma = std if self.sigma is None else self.decay * self.sigma + (1.0 - self.decay) * std
        return proxies.mean_gap / (self.sigma + ZSCORE_EPS)

    def state_dict(self) -> dict[str, float | None]:
        return {"decay": self.decay, "sigma": self.sigma}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        self.decay = float(state["decay"])
        self.sigma = None if state["sigma"] is None else float(state["sigma"])
