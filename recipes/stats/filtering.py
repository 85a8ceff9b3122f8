"""SNR-Aware Filtering: the single implementation (RAGEN-2 (arXiv 2604.06268); reference code: RAGEN's `RolloutFilter`).

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from orchlib.errors import validation_issues
from orchlib.lazy import lazy_module
from orchlib.registry import Registry

if TYPE_CHECKING:
    import numpy as np
else:
    np = lazy_module("numpy")  # `orch filter --help` builds its options from FilterConfig without numpy

ZERO_TOL = 1e-10
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


def _check_choice(name: str, value: str, valid: tuple[str, ...] | list[str]) -> None:
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
# The strategies: what `value` means, which values are valid, and what each keeps -- one class per strategy
# --------------------------------------------------------------------------------------------------------------


class Strategy:
    """One filter strategy, registered by name with ``@register_strategy``.

    A strategy checks its ``value`` and chooses groups among the *candidates*: the scores (shape (C,)) of the
    groups eligible for selection (all groups, or the non-zero ones without ``include_zero``), already mirrored
    for ``select_type='smallest'``. ``total_groups`` is the batch's group count G (some strategies size their
    choice on it). A strategy that keeps trajectories within groups instead overrides :meth:`keep_samples`.
    """

    name: str = ""  # set by the registry
    value_meaning: str = ""  # what `value` is, for docs and `--help`
    takes_value = True  # False: `value` is ignored (none)
    takes_smallest = True  # whether select_type 'smallest' applies
    whole_groups = True  # False: selects trajectories within groups (use filter_groups)

    def check_value(self, value: float) -> None:
        """Raise ValueError when `value` is not valid for this strategy."""

    def is_off(self, value: float) -> bool:
        """Whether this strategy with this value keeps every trajectory, zero-variance groups included."""
        return False

    def keep_candidates(self, scores: np.ndarray, value: float, total_groups: int,
                        config: FilterConfig) -> np.ndarray:
        """(C,) keep-mask over the candidates' scores (shape (C,), finite, non-empty)."""
        raise NotImplementedError

    def keep_samples(self, rewards: np.ndarray, stats: GroupStats, config: FilterConfig) -> np.ndarray:
        """(T,) keep-mask of the trajectories: every trajectory of each kept group."""
        return keep_groups(stats.score(config.metric), config)[stats.inverse]


STRATEGIES: Registry[Strategy] = Registry("filter strategy", where="config key filter.strategy")


def register_strategy(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator: register one instance of a `Strategy` subclass as `name`."""

    def decorate(cls: type[Strategy]) -> type[Strategy]:
        STRATEGIES.register(name)(cls())
        STRATEGIES.entries[name].name = name
        return cls

    return decorate


def strategy_names(whole_groups_only: bool = False) -> list[str]:
    """Registered strategy names, in registration order."""
    return [name for name, strategy in STRATEGIES.entries.items() if strategy.whole_groups or not whole_groups_only]


def get_strategy(name: str) -> Strategy:
    """The strategy registered as `name`; ValueError listing the valid names otherwise."""
    _check_choice("filter strategy", name, strategy_names())
    return STRATEGIES.entries[name]


def _descending_order(scores: np.ndarray) -> np.ndarray:
    """Indices by descending score; ties keep the earlier group first."""
    return np.argsort(-scores, kind="stable")


def _top_count(scores: np.ndarray, count: int) -> np.ndarray:
    keep = np.zeros(scores.size, dtype=bool)
    keep[_descending_order(scores)[:count]] = True
    return keep


def _in_unit_interval(strategy: str, what: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{strategy}: {what} must be in (0, 1], got {value}")


@register_strategy("top_p")
class TopP(Strategy):
    """Nucleus over groups: the smallest descending prefix holding ``rho`` of the score mass (``prob_mode``
    linear: of the scores, threshold ``rho * sum - eps``, stopping at any score <= 0 and keeping nothing if the
    threshold is never reached; softmax: of softmax(scores), ``searchsorted(cumsum, rho) + 1`` groups, >= 1).
    ``rho >= 1`` keeps every group, zero-variance ones included."""

    value_meaning = "rho, in (0, 1]"

    def check_value(self, value: float) -> None:
        _in_unit_interval("top_p", "rho", value)

    def is_off(self, value: float) -> bool:
        return value >= 1.0

    def keep_candidates(self, scores: np.ndarray, value: float, total_groups: int,
                        config: FilterConfig) -> np.ndarray:
        order = _descending_order(scores)
        keep = np.zeros(scores.size, dtype=bool)
        if config.prob_mode == "softmax":
            shifted = scores[order] - scores.max()
            probs = np.exp(shifted) / np.exp(shifted).sum()
            keep[order[: min(int(np.searchsorted(np.cumsum(probs), value)) + 1, scores.size)]] = True
            return keep
        threshold = value * scores.sum() - config.eps
        running = 0.0
        for index in order:
            if running >= threshold or scores[index] <= 0.0:
                break
            keep[index] = True
            running += scores[index]
        if running < threshold:
            keep[:] = False
        return keep


@register_strategy("top_k")
class TopK(Strategy):
    """A fraction of the groups: ``k = int(value * G)`` over all G groups (the reference code's rule), capped at
    the eligible groups, at least one."""

    value_meaning = "the kept fraction of groups, in (0, 1]"

    def check_value(self, value: float) -> None:
        _in_unit_interval("top_k", "the kept fraction", value)

    def keep_candidates(self, scores: np.ndarray, value: float, total_groups: int,
                        config: FilterConfig) -> np.ndarray:
        return _top_count(scores, max(1, min(int(value * total_groups), scores.size)))


@register_strategy("top_k_abs")
class TopKAbs(Strategy):
    """A count of groups: ``k = int(value)``, capped at the eligible groups."""

    value_meaning = "the kept count of groups, >= 1"

    def check_value(self, value: float) -> None:
        if int(value) < 1:
            raise ValueError(f"top_k_abs: k = int(value) must be >= 1, got {value}")

    def keep_candidates(self, scores: np.ndarray, value: float, total_groups: int,
                        config: FilterConfig) -> np.ndarray:
        return _top_count(scores, int(value))


@register_strategy("min_p")
class MinP(Strategy):
    """Groups whose score is at least ``value`` times the largest score."""

    value_meaning = "the ratio to the largest score, in [0, 1]"

    def check_value(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"min_p: the ratio to the max score must be in [0, 1], got {value}")

    def keep_candidates(self, scores: np.ndarray, value: float, total_groups: int,
                        config: FilterConfig) -> np.ndarray:
        return scores >= value * scores.max()


@register_strategy("quartile")
class Quartile(Strategy):
    """Table 6 ablation: only the groups of one reward-variance quartile (1 = highest, 4 = lowest)."""

    value_meaning = "the quartile, 1 (highest reward variance) to 4"
    takes_smallest = False

    def check_value(self, value: float) -> None:
        if value not in QUARTILES:
            raise ValueError(f"quartile: value must be 1, 2, 3 or 4 (1 = highest reward variance), got {value}")

    def keep_candidates(self, scores: np.ndarray, value: float, total_groups: int,
                        config: FilterConfig) -> np.ndarray:
        return select_quartile(scores, int(value))


@register_strategy("none")
class NoFilter(Strategy):
    """No filtering: every group is kept (equivalent to top_p with rho = 1)."""

    value_meaning = "ignored"
    takes_value = False

    def is_off(self, value: float) -> bool:
        return True

    def keep_candidates(self, scores: np.ndarray, value: float, total_groups: int,
                        config: FilterConfig) -> np.ndarray:
        return np.ones(scores.size, dtype=bool)


@register_strategy("trajectory")
class TrajectoryLevel(Strategy):
    """Table 7 ablation: the top-``n`` and bottom-``n`` trajectories by reward *within* every group (groups with
    at most 2n trajectories are kept whole), instead of whole groups."""

    value_meaning = "n, the trajectories kept at each end of every group, a whole number >= 1"
    takes_smallest = False
    whole_groups = False

    def check_value(self, value: float) -> None:
        if value < 1 or not float(value).is_integer():
            raise ValueError(
                f"trajectory: value = n, the trajectories kept at each end of every group, must be a whole number "
                f">= 1, got {value}"
            )

    def keep_samples(self, rewards: np.ndarray, stats: GroupStats, config: FilterConfig) -> np.ndarray:
        extremes = _group_extremes(rewards, stats, int(config.value))
        return extremes & _eligible_groups(stats.score(config.metric), config.include_zero)[stats.inverse]


def _check_value(strategy: Strategy, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"filter value must be a finite number, got {value}")
    strategy.check_value(value)


def _check_select_type(strategy: Strategy, select_type: str) -> None:
    """The ablation strategies rank one way only: reject ``smallest`` for them."""
    if select_type == "smallest" and not strategy.takes_smallest:
        hint = "value 4 keeps the lowest-RV quartile" if strategy.name == "quartile" else "it keeps both ends already"
        raise ValueError(f"select_type 'smallest' does not apply to strategy {strategy.name} ({hint}); use 'largest'")


# --------------------------------------------------------------------------------------------------------------
# The filter's settings
# --------------------------------------------------------------------------------------------------------------


class FilterConfig(BaseModel):
    """Settings of SNR-Aware Filtering (see the module docstring). Defaults: the reference README's recommendation
    (linear top-p with rho = 0.9 over the unbiased reward std, zero-variance groups dropped)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str = Field("top_p", description="top_p | top_k | top_k_abs | min_p | none; ablations: quartile | "
                                               "trajectory.")
    value: float | int = Field(
        0.9,
        description="rho (top_p), fraction (top_k), count (top_k_abs), ratio to the max score (min_p), quartile "
        "1-4 (quartile), trajectories kept per end of each group (trajectory).",
    )
    prob_mode: Literal["linear", "softmax"] = Field("linear", description="top_p mass: linear (score mass) | "
                                                                          "softmax.")
    select_type: Literal["largest", "smallest"] = Field("largest", description="largest (the paper) | smallest "
                                                                               "(ablation).")
    metric: Literal["std", "var"] = Field("std", description="Per-group score: std (reference code) | var (paper "
                                                             "text).")
    include_zero: bool = Field(False, description="Keep zero-variance groups eligible.")
    eps: float = Field(0.01, ge=0.0, description="Slack subtracted from the linear top_p threshold.")
    loss_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="Multiply advantages by 1, the kept ratio or its square root after filtering.")

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, strategy: str) -> str:
        get_strategy(strategy)
        return strategy

    @field_validator("prob_mode", "select_type", "metric", "loss_scaling", mode="before")
    @classmethod
    def _known_choice(cls, value: Any, info: ValidationInfo) -> Any:
        valid = {"prob_mode": PROB_MODES, "select_type": SELECT_TYPES, "metric": METRICS,
                 "loss_scaling": LOSS_SCALINGS}[info.field_name]
        _check_choice(info.field_name, value, valid)
        return value

    @field_validator("value")
    @classmethod
    def _value_fits_the_strategy(cls, value: float, info: ValidationInfo) -> float:
        strategy = STRATEGIES.entries.get(info.data.get("strategy", ""))
        if strategy is not None and strategy.takes_value:  # else the strategy failed validation itself
            _check_value(strategy, value)
        return value

    @field_validator("select_type")
    @classmethod
    def _select_type_fits_the_strategy(cls, select_type: str, info: ValidationInfo) -> str:
        strategy = STRATEGIES.entries.get(info.data.get("strategy", ""))
        if strategy is not None:
            _check_select_type(strategy, select_type)
        return select_type

    @property
    def is_off(self) -> bool:
        """Whether this filter keeps every trajectory, zero-variance groups included (strategy none, or top_p with
        rho >= 1): the single definition of "no filtering"."""
        strategy = STRATEGIES.entries.get(self.strategy)  # (always registered, unless built by model_construct)
        return strategy is not None and strategy.is_off(self.value)


def filter_config(**fields: Any) -> FilterConfig:
    """`FilterConfig(**fields)`, with a validation error as one ValueError line naming the field."""
    try:
        return FilterConfig(**fields)
    except ValidationError as err:
        raise ValueError(validation_issues(err, FilterConfig)[0].line()) from None


# --------------------------------------------------------------------------------------------------------------
# Group selection
# --------------------------------------------------------------------------------------------------------------


def _eligible_groups(scores: np.ndarray, include_zero: bool) -> np.ndarray:
    """(G,) bool: the groups selection may keep (all, or those with a non-zero score)."""
    return np.ones(scores.size, dtype=bool) if include_zero else np.abs(scores) > ZERO_TOL


def keep_groups(scores: Any, config: FilterConfig) -> np.ndarray:
    """(G,) keep-mask of a whole-group strategy for per-group scores (shape (G,)), under a validated config."""
    scores = _as_numpy(scores, "scores").astype(np.float64)
    if scores.size == 0:
        raise ValueError("no groups to select from: scores is empty")
    if not np.all(np.isfinite(scores)):
        raise ValueError("group scores contain NaN or infinite values")
    if config.is_off:
        return np.ones(scores.size, dtype=bool)
    eligible = _eligible_groups(scores, config.include_zero)
    keep = np.zeros(scores.size, dtype=bool)
    if not eligible.any():
        return keep
    candidates = scores[eligible]
    if config.select_type == "smallest":
        candidates = candidates.max() + candidates.min() - candidates
    strategy = STRATEGIES.entries[config.strategy]
    keep[np.flatnonzero(eligible)[strategy.keep_candidates(candidates, config.value, scores.size, config)]] = True
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
    if strategy in STRATEGIES.entries and not STRATEGIES.entries[strategy].whole_groups:
        raise ValueError(f"strategy {strategy} keeps trajectories, not whole groups: use filter_groups or "
                         "select_trajectories")
    _check_choice("filter strategy", strategy, strategy_names(whole_groups_only=True))
    config = filter_config(strategy=strategy, value=value, prob_mode=prob_mode, select_type=select_type,
                           include_zero=include_zero, eps=eps)
    return keep_groups(scores, config)


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


def filter_groups(rewards: Any, group_ids: Any, config: FilterConfig | None = None) -> FilterResult:
    """Apply SNR-Aware Filtering (or one of its ablations) to one rollout batch.

    Args:
        rewards: (T,) episode returns.
        group_ids: (T,) prompt id of each trajectory.
        config: filter settings; ``FilterConfig()`` when omitted.
    """
    config = config or FilterConfig()
    stats = group_stats(rewards, group_ids)
    rewards = _as_numpy(rewards, "rewards").astype(np.float64)
    keep_samples = STRATEGIES.entries[config.strategy].keep_samples(rewards, stats, config)
    keep_groups = np.bincount(stats.inverse, weights=keep_samples, minlength=stats.num_groups) > 0
    metrics = filter_metrics(stats, keep_groups, keep_samples)
    return FilterResult(
        stats=stats,
        keep_groups=keep_groups,
        keep_samples=keep_samples,
        loss_scale=loss_scale(metrics["rollout/kept_ratio"], config.loss_scaling),
        metrics=metrics,
    )


def filter_step(rewards: Any, group_ids: Any, config: FilterConfig, samples_per_prompt: int) -> tuple[
        np.ndarray, float, dict[str, float]]:
    """A trainer's filter decision for one step, the same on every backend: (keep-mask (T,), loss scale, metrics).

    With the filter off and one sample per prompt there is no reward variance to rank or report: everything is
    kept and nothing is logged; otherwise :func:`filter_groups` decides.
    """
    if config.is_off and samples_per_prompt < 2:
        return np.ones(len(rewards), dtype=bool), 1.0, {}
    result = filter_groups(rewards, group_ids, config)
    return result.keep_samples, result.loss_scale, result.metrics


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
