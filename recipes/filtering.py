"""SNR-Aware Filtering: the single implementation (PAPER.md section 4).

Each training iteration rolls out K trajectories for each of G prompts. A prompt's trajectories form a *group*; its
within-group reward spread (the reward variance, RV) bounds the task gradient it can contribute. The filter ranks
groups by that score and keeps a top-p prefix, so the update runs on the groups that carry signal.

Everything here is a pure function over numpy arrays (torch tensors are accepted and converted). Both trainers,
the CLI (`orch filter`) and the analysis code call these functions; nothing else re-implements them.

Knobs (all on :class:`FilterConfig`):

* ``metric`` -- the per-group score: ``std`` (unbiased standard deviation of episode rewards; the reference code's
  default, although its metric is called "reward_variance") or ``var`` (unbiased variance; the paper's text).
* ``strategy`` -- ``top_p`` (nucleus over groups), ``top_k`` (a fraction of groups), ``top_k_abs`` (a count),
  ``min_p`` (score >= value * max score), or ``none`` (keep every group; equivalent to top_p with rho = 1).
  Two ablations: ``quartile`` (Table 6: keep one RV quartile of the groups) and ``trajectory`` (Table 7: keep the
  top-n and bottom-n trajectories by reward *within* every group, instead of whole groups).
* ``value`` -- rho for top_p (in (0, 1]; 1 keeps every group), the fraction for top_k (in (0, 1]), the count for
  top_k_abs (>= 1), the ratio for min_p (in [0, 1]), the quartile for quartile (1, 2, 3 or 4; 1 = highest RV),
  n for trajectory (a whole number >= 1: trajectories kept at each end of every group's reward ranking).
* ``prob_mode`` (top_p only) -- ``linear``: walk groups by descending score and stop once the running score mass
  reaches ``rho * total - eps``, stopping early at any score <= 0 (then, if the threshold was never reached, keep
  nothing); ``softmax``: probabilities = softmax(scores), keep ``searchsorted(cumsum, rho) + 1`` groups (>= 1).
* ``select_type`` -- ``largest`` (the paper) or ``smallest`` (an ablation that keeps the *least* informative
  groups). ``smallest`` mirrors the scores, ``s' = max(s) + min(s) - s``, which reverses the order while keeping
  the scores' range and sign, so every strategy (including linear mass) keeps its meaning. ``quartile`` and
  ``trajectory`` take ``largest`` only (quartile 4 already is the lowest-RV quarter; trajectory keeps both ends).
* ``include_zero`` -- when false, groups whose score is within 1e-10 of zero are dropped before selection (the
  reference README's recommendation with ``linear``); the paper's main-table runs used ``softmax`` with them kept.
  This holds for every strategy but ``none`` and top_p with rho >= 1: ``quartile`` splits the eligible groups
  only, ``trajectory`` keeps no trajectory of a dropped group. The paper's ablations keep them (the Q3 and Q4 RV
  ranges of Table 6 start at 0; Table 7's trajectory-level row keeps 8/8 prompts).
* ``eps`` -- slack subtracted from the linear threshold (default 0.01, as the reference code).
* ``loss_scaling`` -- after filtering, multiply advantages by 1 (``none``), the kept ratio (``linear``) or its
  square root (``sqrt``) to keep the step size comparable with the shrunken batch.

The kept ratio (``rollout/kept_ratio``, the base of loss scaling) is always kept trajectories / all trajectories:
for whole-group strategies that is the kept groups' share of the batch, for ``trajectory`` the selected
trajectories' share (e.g. 64 / 128 for n = 4 of 16 per prompt).

Ties are broken deterministically: a stable sort by score, earlier groups first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

ZERO_TOL = 1e-10
# select_groups' strategies (whole groups); filter_groups also takes "trajectory" (trajectories within groups)
GROUP_STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p", "quartile", "none")
QUARTILES = (1, 2, 3, 4)
PROB_MODES = ("linear", "softmax")
SELECT_TYPES = ("largest", "smallest")
METRICS = ("std", "var")
LOSS_SCALINGS = ("none", "linear", "sqrt")


def _as_numpy(values: Any, name: str) -> np.ndarray:
    """Convert a list, numpy array or torch tensor to a 1-D numpy array."""
    if hasattr(values, "detach"):  # torch.Tensor, without importing torch
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array


def _check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(valid)}")


# --------------------------------------------------------------------------------------------------------------
# Per-group statistics
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupStats:
    """Reward statistics of each prompt group. All arrays have shape (G,), groups in order of first appearance.

    ``inverse`` (shape (T,)) maps every trajectory to the position of its group in these arrays.
    """

    keys: np.ndarray
    size: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    var: np.ndarray
    zero_variance: np.ndarray
    inverse: np.ndarray

    def score(self, metric: str) -> np.ndarray:
        """The per-group RV score: unbiased ``std`` or ``var``."""
        _check_choice("metric", metric, METRICS)
        return self.std if metric == "std" else self.var

    @property
    def num_groups(self) -> int:
        return int(self.keys.shape[0])


def group_stats(rewards: Any, group_ids: Any) -> GroupStats:
    """Per-group mean, unbiased std and variance of episode rewards.

    Args:
        rewards: (T,) episode returns, one per trajectory; finite numbers.
        group_ids: (T,) group key (prompt id) of each trajectory; any hashable numpy-compatible values.

    Raises:
        ValueError: empty input, length mismatch, non-finite rewards, or a group with fewer than 2 trajectories
            (its variance is undefined).
    """
    rewards = _as_numpy(rewards, "rewards")
    group_ids = _as_numpy(group_ids, "group_ids")
    if rewards.size == 0:
        raise ValueError("no trajectories: rewards is empty; pass at least one group of >= 2 trajectories")
    if rewards.shape != group_ids.shape:
        raise ValueError(f"rewards has {rewards.size} entries but group_ids has {group_ids.size}; they must match")
    try:
        rewards = rewards.astype(np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"rewards must be numeric: {err}") from None
    if not np.all(np.isfinite(rewards)):
        bad = int(np.count_nonzero(~np.isfinite(rewards)))
        raise ValueError(f"rewards contain {bad} NaN or infinite value(s); every reward must be a finite number")

    keys, first_index, inverse = np.unique(group_ids, return_index=True, return_inverse=True)
    order = np.argsort(first_index, kind="stable")  # groups in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    keys, inverse = keys[order], rank[inverse.reshape(-1)]

    size = np.bincount(inverse, minlength=keys.size)
    if np.any(size < 2):
        singles = keys[size < 2][:5].tolist()
        raise ValueError(
            f"{int(np.count_nonzero(size < 2))} group(s) have a single trajectory (e.g. {singles}); "
            "reward variance needs >= 2 trajectories per prompt"
        )
    mean = np.bincount(inverse, weights=rewards, minlength=keys.size) / size
    squared = np.bincount(inverse, weights=(rewards - mean[inverse]) ** 2, minlength=keys.size)
    var = squared / (size - 1)
    std = np.sqrt(var)
    return GroupStats(
        keys=keys, size=size, mean=mean, std=std, var=var, zero_variance=std <= ZERO_TOL, inverse=inverse
    )


# --------------------------------------------------------------------------------------------------------------
# Group selection
# --------------------------------------------------------------------------------------------------------------


def _check_value(strategy: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"filter value must be a finite number, got {value}")
    if strategy in ("top_p", "top_k") and not 0.0 < value <= 1.0:
        what = "rho" if strategy == "top_p" else "the kept fraction"
        raise ValueError(f"{strategy}: {what} must be in (0, 1], got {value}")
    if strategy == "top_k_abs" and int(value) < 1:
        raise ValueError(f"top_k_abs: k = int(value) must be >= 1, got {value}")
    if strategy == "min_p" and not 0.0 <= value <= 1.0:
        raise ValueError(f"min_p: the ratio to the max score must be in [0, 1], got {value}")
    if strategy == "quartile" and value not in QUARTILES:
        raise ValueError(f"quartile: value must be 1, 2, 3 or 4 (1 = highest reward variance), got {value}")
    if strategy == "trajectory" and (value < 1 or not float(value).is_integer()):
        raise ValueError(
            f"trajectory: value = n, the trajectories kept at each end of every group, must be a whole number >= 1, "
            f"got {value}"
        )


def _check_select_type(strategy: str, select_type: str) -> None:
    """The ablation strategies rank one way only: reject ``smallest`` for them."""
    if select_type == "smallest" and strategy in ("quartile", "trajectory"):
        hint = "value 4 keeps the lowest-RV quartile" if strategy == "quartile" else "it keeps both ends already"
        raise ValueError(f"select_type 'smallest' does not apply to strategy {strategy} ({hint}); use 'largest'")


def _eligible_groups(scores: np.ndarray, include_zero: bool) -> np.ndarray:
    """(G,) bool: the groups selection may keep (all, or those with a non-zero score)."""
    return np.ones(scores.size, dtype=bool) if include_zero else np.abs(scores) > ZERO_TOL


def _descending_order(scores: np.ndarray) -> np.ndarray:
    """Indices by descending score; ties keep the earlier group first."""
    return np.argsort(-scores, kind="stable")


def _top_p_linear(scores: np.ndarray, rho: float, eps: float) -> np.ndarray:
    """Smallest descending prefix whose score mass reaches ``rho * sum - eps``; empty if it never does."""
    keep = np.zeros(scores.size, dtype=bool)
    threshold = rho * scores.sum() - eps
    running = 0.0
    for index in _descending_order(scores):
        if running >= threshold or scores[index] <= 0.0:
            break
        keep[index] = True
        running += scores[index]
    if running < threshold:
        keep[:] = False
    return keep


def _top_p_softmax(scores: np.ndarray, rho: float) -> np.ndarray:
    """Keep ``searchsorted(cumsum(sorted softmax), rho) + 1`` groups (at least one)."""
    order = _descending_order(scores)
    shifted = scores[order] - scores.max()
    probs = np.exp(shifted) / np.exp(shifted).sum()
    count = min(int(np.searchsorted(np.cumsum(probs), rho)) + 1, scores.size)
    keep = np.zeros(scores.size, dtype=bool)
    keep[order[:count]] = True
    return keep


def _top_count(scores: np.ndarray, count: int) -> np.ndarray:
    keep = np.zeros(scores.size, dtype=bool)
    keep[_descending_order(scores)[:count]] = True
    return keep


def select_groups(
    scores: Any,
    strategy: str = "top_p",
    value: float = 0.9,
    *,
    prob_mode: str = "linear",
    select_type: str = "largest",
    include_zero: bool = False,
    eps: float = 0.01,
) -> np.ndarray:
    """Boolean keep-mask over groups (shape (G,)) for the given per-group scores (shape (G,)).

    See the module docstring for the meaning of every argument. With ``top_p`` and ``value >= 1`` (or strategy
    ``none``) every group is kept, zero-variance ones included. Strategy ``trajectory`` selects trajectories, not
    groups: use :func:`filter_groups` or :func:`select_trajectories`.
    """
    if strategy == "trajectory":
        raise ValueError("strategy trajectory keeps trajectories, not whole groups: use filter_groups or "
                         "select_trajectories")
    _check_choice("filter strategy", strategy, GROUP_STRATEGIES)
    _check_choice("prob_mode", prob_mode, PROB_MODES)
    _check_choice("select_type", select_type, SELECT_TYPES)
    _check_select_type(strategy, select_type)
    scores = _as_numpy(scores, "scores").astype(np.float64)
    if scores.size == 0:
        raise ValueError("no groups to select from: scores is empty")
    if not np.all(np.isfinite(scores)):
        raise ValueError("group scores contain NaN or infinite values")
    if strategy == "none":
        return np.ones(scores.size, dtype=bool)
    _check_value(strategy, value)
    if strategy == "top_p" and value >= 1.0:
        return np.ones(scores.size, dtype=bool)

    eligible = _eligible_groups(scores, include_zero)
    keep = np.zeros(scores.size, dtype=bool)
    if not eligible.any():
        return keep
    candidates = scores[eligible]
    if select_type == "smallest":
        candidates = candidates.max() + candidates.min() - candidates

    if strategy == "top_p":
        chosen = _top_p_linear(candidates, value, eps) if prob_mode == "linear" else _top_p_softmax(candidates, value)
    elif strategy == "top_k":
        chosen = _top_count(candidates, max(1, int(value * candidates.size)))
    elif strategy == "top_k_abs":
        chosen = _top_count(candidates, int(value))
    elif strategy == "quartile":
        chosen = select_quartile(candidates, int(value))
    else:  # min_p
        chosen = candidates >= value * candidates.max()
    keep[np.flatnonzero(eligible)[chosen]] = True
    return keep


# --------------------------------------------------------------------------------------------------------------
# The filter as the trainers call it
# --------------------------------------------------------------------------------------------------------------


class FilterConfig(BaseModel):
    """Settings of SNR-Aware Filtering (see the module docstring). Defaults: the reference README's recommendation
    (linear top-p with rho = 0.9 over the unbiased reward std, zero-variance groups dropped)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: Literal["top_p", "top_k", "top_k_abs", "min_p", "quartile", "trajectory", "none"] = "top_p"
    value: float = Field(
        0.9,
        description="rho (top_p), fraction (top_k), count (top_k_abs), ratio (min_p), quartile 1-4 (quartile), "
        "trajectories kept per end of each group (trajectory)",
    )
    prob_mode: Literal["linear", "softmax"] = "linear"
    select_type: Literal["largest", "smallest"] = "largest"
    metric: Literal["std", "var"] = "std"
    include_zero: bool = False
    eps: float = Field(0.01, ge=0.0)
    loss_scaling: Literal["none", "linear", "sqrt"] = "none"

    @model_validator(mode="after")
    def _value_fits_strategy(self) -> FilterConfig:
        if self.strategy != "none":
            _check_value(self.strategy, self.value)
        return self

    @field_validator("select_type")
    @classmethod
    def _select_type_fits_strategy(cls, select_type: str, info: ValidationInfo) -> str:
        if "strategy" in info.data:  # else strategy failed validation itself
            _check_select_type(info.data["strategy"], select_type)
        return select_type


@dataclass(frozen=True)
class FilterResult:
    """Outcome of filtering one rollout batch of T trajectories in G groups.

    stats: the per-group reward statistics the decision was based on.
    keep_groups: (G,) bool, groups in order of first appearance (``group_keys``) with at least one kept trajectory.
    keep_samples: (T,) bool, the trajectories the update uses: every trajectory of a kept group, except with
        strategy ``trajectory``, which keeps the top-n and bottom-n trajectories of each group.
    loss_scale: factor for the advantages / loss of the kept batch (1.0 unless ``loss_scaling`` says otherwise).
    metrics: reference-code-named statistics, ready to log (see :func:`filter_metrics`).
    """

    stats: GroupStats
    keep_groups: np.ndarray
    keep_samples: np.ndarray
    loss_scale: float
    metrics: dict[str, float]

    @property
    def group_keys(self) -> np.ndarray:
        return self.stats.keys

    @property
    def is_empty(self) -> bool:
        return not bool(self.keep_groups.any())


def loss_scale(kept_ratio: float, mode: str) -> float:
    """Advantage multiplier after filtering: 1, ``kept_ratio`` or ``sqrt(kept_ratio)``."""
    _check_choice("loss_scaling", mode, LOSS_SCALINGS)
    if mode == "linear":
        return float(kept_ratio)
    if mode == "sqrt":
        return float(math.sqrt(kept_ratio))
    return 1.0


def filter_metrics(
    stats: GroupStats, keep_groups: np.ndarray, keep_samples: np.ndarray | None = None
) -> dict[str, float]:
    """Filter statistics named as in the reference code (``rollout/`` prefix).

    Args:
        stats: the batch's per-group statistics (G groups, T trajectories).
        keep_groups: (G,) bool, groups with at least one kept trajectory.
        keep_samples: (T,) bool, kept trajectories; default: every trajectory of the kept groups.

    ``kept_samples`` and ``kept_ratio`` count trajectories (``kept_ratio`` = kept / T, in [0, 1]); the
    ``chosen_in_group_reward_std_mean`` is the mean reward std of the kept groups, each over all its trajectories.
    """
    kept = stats.std[keep_groups]
    kept_samples = int((keep_groups[stats.inverse] if keep_samples is None else keep_samples).sum())
    return {
        "rollout/in_group_reward_std_mean": float(stats.std.mean()),
        "rollout/in_group_reward_std_max": float(stats.std.max()),
        "rollout/in_group_reward_var_mean": float(stats.var.mean()),
        "rollout/chosen_in_group_reward_std_mean": float(kept.mean()) if kept.size else 0.0,
        "rollout/total_groups": float(stats.num_groups),
        "rollout/kept_groups": float(keep_groups.sum()),
        "rollout/kept_samples": float(kept_samples),
        "rollout/kept_ratio": kept_samples / float(stats.size.sum()),
        "rollout/zero_variance_groups": float(stats.zero_variance.sum()),
    }


def _select_samples(rewards: Any, stats: GroupStats, config: FilterConfig) -> np.ndarray:
    """(T,) keep-mask of ``config``'s selection: whole groups, or (strategy ``trajectory``) each group's extremes."""
    scores = stats.score(config.metric)
    if config.strategy != "trajectory":
        keep_groups = select_groups(
            scores,
            config.strategy,
            config.value,
            prob_mode=config.prob_mode,
            select_type=config.select_type,
            include_zero=config.include_zero,
            eps=config.eps,
        )
        return keep_groups[stats.inverse]
    extremes = _group_extremes(_as_numpy(rewards, "rewards").astype(np.float64), stats, int(config.value))
    return extremes & _eligible_groups(scores, config.include_zero)[stats.inverse]


def filter_groups(rewards: Any, group_ids: Any, config: FilterConfig | None = None) -> FilterResult:
    """Apply SNR-Aware Filtering (or one of its ablations) to one rollout batch.

    Args:
        rewards: (T,) episode returns.
        group_ids: (T,) prompt id of each trajectory.
        config: filter settings; ``FilterConfig()`` when omitted.
    """
    config = config or FilterConfig()
    stats = group_stats(rewards, group_ids)
    keep_samples = _select_samples(rewards, stats, config)
    keep_groups = np.bincount(stats.inverse, weights=keep_samples, minlength=stats.num_groups) > 0
    metrics = filter_metrics(stats, keep_groups, keep_samples)
    return FilterResult(
        stats=stats,
        keep_groups=keep_groups,
        keep_samples=keep_samples,
        loss_scale=loss_scale(metrics["rollout/kept_ratio"], config.loss_scaling),
        metrics=metrics,
    )


# --------------------------------------------------------------------------------------------------------------
# Ablation selectors (Tables 6 and 7)
# --------------------------------------------------------------------------------------------------------------


def select_quartile(scores: Any, quartile: int) -> np.ndarray:
    """Keep only groups in RV quartile ``quartile`` (1 = highest RV, 4 = lowest), the Table 6 ablation.

    Groups are ranked by descending score (stable) and split into four near-equal parts (sizes differ by at most
    one, larger parts first). Returns a (G,) keep-mask.
    """
    if quartile not in QUARTILES:
        raise ValueError(f"quartile must be 1, 2, 3 or 4 (1 = highest reward variance), got {quartile!r}")
    scores = _as_numpy(scores, "scores").astype(np.float64)
    if scores.size == 0:
        raise ValueError("no groups to select from: scores is empty")
    parts = np.array_split(_descending_order(scores), 4)
    keep = np.zeros(scores.size, dtype=bool)
    keep[parts[quartile - 1]] = True
    return keep


def _group_extremes(rewards: np.ndarray, stats: GroupStats, n: int) -> np.ndarray:
    """(T,) keep-mask of the top-``n`` and bottom-``n`` trajectories by reward (shape (T,)) of every group."""
    keep = np.zeros(rewards.size, dtype=bool)
    for group in range(stats.num_groups):
        members = np.flatnonzero(stats.inverse == group)
        ranked = members[np.argsort(-rewards[members], kind="stable")]
        keep[ranked[:n]] = True
        keep[ranked[-n:]] = True
    return keep


def select_trajectories(rewards: Any, group_ids: Any, n: int) -> np.ndarray:
    """Trajectory-level selection (Table 7): keep the top-``n`` and bottom-``n`` trajectories of every group.

    Within a group, trajectories are ranked by reward (stable: earlier trajectories first among ties). A group with
    at most ``2 * n`` trajectories is kept whole. Returns a (T,) keep-mask. (The paper's "top-8 and bottom-8" row
    updates on 64 of 8 x 16 trajectories, i.e. 8 per prompt: n = 4 here; n = 8 would keep all 16.)
    """
    if n < 1:
        raise ValueError(f"trajectory-level selection needs n >= 1 per side, got {n}")
    stats = group_stats(rewards, group_ids)
    return _group_extremes(_as_numpy(rewards, "rewards").astype(np.float64), stats, n)
