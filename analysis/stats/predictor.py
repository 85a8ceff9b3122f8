"""The Std(RV)/Mean(RV) predictor of RAGEN-2 (arXiv 2604.06268): will SNR-Aware Filtering help? The single
implementation (the reference code does not implement it).

From ONE rollout batch: compute every prompt's reward variance (RV), then ``ratio = std(RV) / mean(RV)`` across
prompts (population std). A high ratio means RV is spread out or bimodal -- some prompts carry clear signal and
others are noise -- so keeping the high-RV prompts removes noise. A ratio near 0 means every prompt looks alike and
filtering only drops data at random.

Default thresholds, from the paper's reference points (ratios 1.29 and 1.16 helped, 0.33 hurt by about 5%):

* ``ratio >= helps_above`` (1.0): *likely helps* -- just below the smallest ratio seen to help (1.16);
* ``ratio <  hurts_below`` (0.5): *unlikely to help* -- comfortably above the ratio seen to hurt (0.33);
* in between: *uncertain* -- no published run falls there, so the data do not decide.

A batch in which every prompt has zero variance has no task signal at all: the ratio is undefined and the verdict is
*unlikely to help* (there is nothing for the filter to rank). Three points are all the paper offers, so treat the
thresholds as options to recalibrate with your own runs (the analysis reports put predicted ratios beside the
realised filter gains).

Revisited on orch's own runs (:mod:`analysis.stats.predictor_record`, recorded 2026-11-28): 2 comparisons, 0 decided --
the long run's FrozenLake (ratio 1.07, *likely helps*; gain -7.5 [-22.5, +2.5] points) and Sokoban (1.96, *likely
helps*; -0.6 [-3.8, +2.5]), both intervals spanning 0, both point estimates against the verdict. The thresholds and
the uncertain band stay: nothing decided means no miss to fit; raising ``helps_above`` to 1.16 would excuse
FrozenLake's point estimate after seeing it and not Sokoban's; and FrozenLake's per-run ratios (0.47-1.71 over five
8-prompt batches, about 0.22 standard error on their mean) put 1.07 within one standard error of 1.0 and 1.16
alike -- the ratio's noise, not the cut, limits the verdict at this scale (docs/statistics.md).

Two scores, never mixed up: the *ratio* the verdict reads uses ``metric`` (``var``, the paper's text, by default;
``std`` optionally), while *what top-p keeps* (:func:`kept_fractions`) is always computed with the trainer's filter
settings (:data:`FILTER`: ``FilterConfig``'s defaults, i.e. ``conf/filter/_base.yaml``: linear top-p over the
unbiased reward **std**, zero-variance groups dropped, eps 0.01) through :func:`recipes.stats.filtering.select_groups`
-- the function the trainers call -- so ``orch predict-filter-gain`` and ``orch filter --strategy top_p`` keep the
same groups on one batch. Both tables name their score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.paper import predictor_references
from orchlib.errors import OrchError
from recipes.stats.filtering import FilterConfig, GroupStats, group_stats, select_groups

if TYPE_CHECKING:
    import pandas as pd

RHO_GRID = (0.6, 0.8, 0.9, 0.95, 0.98)
FILTER = FilterConfig()  # the trainer's filter settings (conf/filter/_base.yaml): what "top-p keeps" is computed with
# Each prob mode with the zero-variance convention it was used with (RAGEN-2 and its reference code); linear is the
# trainer's default and keeps what `orch filter --strategy top_p --value RHO` keeps.
PROB_MODE_INCLUDE_ZERO = {"linear": FILTER.include_zero, "softmax": True}
SCORE_NAMES = {"var": "variance", "std": "standard deviation"}
VERDICT_HELPS = "likely helps"
VERDICT_HURTS = "unlikely to help"
VERDICT_UNCERTAIN = "uncertain"
# A verdict against a measured filter gain (:func:`outcome`): finding 4's rule and the predictor's hit rate.
HIT, MISS, UNDECIDED, NO_CALL = "hit", "miss", "undecided", "no call"
# What a measured gain shows (:func:`gain_class`), before any verdict is set against it.
HELPED, FELL_SHORT, UNSETTLED = "helped", "fell short", "unsettled"
PAPER_REFERENCES = predictor_references()  # the published points live in analysis.paper


@dataclass(frozen=True)
class PredictorThresholds:
    """Verdict cut-offs on std(RV)/mean(RV); see the module docstring for the defaults' justification."""

    helps_above: float = 1.0
    hurts_below: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.hurts_below <= self.helps_above:
            raise OrchError(
                f"thresholds must satisfy 0 <= hurts_below <= helps_above, got hurts_below={self.hurts_below}, "
                f"helps_above={self.helps_above}"
            )


@dataclass(frozen=True)
class KeptFraction:
    """Share of prompts and of trajectories the filter keeps at one (prob mode, rho)."""

    prob_mode: str
    rho: float
    include_zero: bool
    prompts: float
    trajectories: float


@dataclass(frozen=True)
class PredictorReport:
    """Everything the predictor says about one batch (one training step)."""

    source: str
    step: int | None
    num_prompts: int
    num_trajectories: int
    metric: str  # the RV score the ratio (and the verdict) reads
    rv_mean: dict[str, float]  # per metric ('var', 'std'): mean of per-prompt RV
    rv_std: dict[str, float]  # population std of per-prompt RV
    ratio: dict[str, float | None]  # std/mean; None where every prompt has zero variance
    zero_variance_share: float
    kept: list[KeptFraction]
    verdict: str
    reason: str
    thresholds: PredictorThresholds
    kept_metric: str = FILTER.metric  # the score top-p ranked by in ``kept`` (the trainer's filter's)

    def to_json(self) -> dict[str, Any]:
        """Stable machine-readable form (documented in docs/predictor.md)."""
        return {
            "source": self.source,
            "step": self.step,
            "num_prompts": self.num_prompts,
            "num_trajectories": self.num_trajectories,
            "metric": self.metric,
            "ratio": self.ratio[self.metric],
            "rv": {
                name: {"mean": self.rv_mean[name], "std": self.rv_std[name], "ratio": self.ratio[name]}
                for name in ("var", "std")
            },
            "zero_variance_share": self.zero_variance_share,
            "kept_metric": self.kept_metric,
            "kept": [
                {
                    "prob_mode": k.prob_mode,
                    "rho": k.rho,
                    "include_zero": k.include_zero,
                    "prompts": k.prompts,
                    "trajectories": k.trajectories,
                }
                for k in self.kept
            ],
            "verdict": self.verdict,
            "reason": self.reason,
            "thresholds": {"helps_above": self.thresholds.helps_above, "hurts_below": self.thresholds.hurts_below},
        }


def rv_ratio(rv: np.ndarray) -> float | None:
    """``std(RV) / mean(RV)`` over prompts (population std); None when every RV is zero."""
    mean = float(rv.mean())
    return None if mean <= 0.0 else float(rv.std() / mean)


def verdict_for(ratio: float | None, thresholds: PredictorThresholds, metric: str | None = None) -> tuple[str, str]:
    """Map a ratio to (verdict, one-paragraph reason citing the paper's reference points); ``metric`` (var | std),
    when given, names the RV score the ratio was computed with."""
    if ratio is None:
        return VERDICT_HURTS, (
            "Every prompt in this batch has zero reward variance, so no prompt carries a task gradient and the filter "
            "has nothing to rank; change the task difficulty or sampling before expecting filtering to help."
        )
    cited = f"In the paper, {PAPER_REFERENCES}."
    name = "std(RV)/mean(RV)" if metric is None else f"std(RV)/mean(RV) with RV the reward {SCORE_NAMES[metric]}"
    if ratio >= thresholds.helps_above:
        return VERDICT_HELPS, (
            f"{name} = {ratio:.2f} >= {thresholds.helps_above:g}: reward variance is spread across prompts "
            f"(likely bimodal: clear-signal prompts beside noise prompts), so keeping the high-variance prompts "
            f"should raise the signal-to-noise ratio of the update. {cited}"
        )
    if ratio < thresholds.hurts_below:
        return VERDICT_HURTS, (
            f"{name} = {ratio:.2f} < {thresholds.hurts_below:g}: prompts have similar reward variance, so "
            f"the filter would drop prompts almost at random and mostly lose data. {cited}"
        )
    return VERDICT_UNCERTAIN, (
        f"{name} = {ratio:.2f} lies between {thresholds.hurts_below:g} and {thresholds.helps_above:g}, "
        f"where no published run falls; try a short run with and without the filter. {cited}"
    )


def gain_class(lo: float, hi: float, seeds: int, delta: float = 0.0) -> str:
    """What a measured filter gain (95% interval [lo, hi] in points, over ``seeds`` runs in the smaller arm) shows,
    against a smallest gain of interest ``delta`` >= 0: :data:`HELPED` when the interval lies above 0 (a
    demonstrable gain, however small), :data:`FELL_SHORT` when it does not and lies below ``delta`` (any gain is
    demonstrably smaller than ``delta``: harm, none, or too little to matter), :data:`UNSETTLED` otherwise (the
    interval spans both 0 and ``delta``) or with fewer than :data:`analysis.stats.verdicts.MIN_SEEDS` runs in an arm. The
    sides are :func:`analysis.stats.verdicts.side`'s: an interval touching a bound spans it. ``delta`` 0 is finding 4's
    rule (helped: above 0; fell short: below 0)."""
    from analysis.stats.verdicts import MIN_SEEDS, side

    if seeds < MIN_SEEDS:
        return UNSETTLED
    if side(lo, hi, 0.0) == "clears":
        return HELPED
    return FELL_SHORT if side(lo, hi, delta) == "misses" else UNSETTLED


def outcome(verdict: str, lo: float, hi: float, seeds: int, delta: float = 0.0) -> str:
    """A verdict against the filter gain measured over ``seeds`` (the smaller arm's run count), 95% interval
    [lo, hi], with smallest gain of interest ``delta`` (:func:`gain_class`): :data:`HIT` when *likely helps* meets
    a gain that :data:`HELPED` or *unlikely to help* one that :data:`FELL_SHORT`, :data:`MISS` the reverse,
    :data:`UNDECIDED` when the gain is :data:`UNSETTLED`, :data:`NO_CALL` for *uncertain*. With ``delta`` 0 (the
    default) this is finding 4 of docs/science.md (:mod:`analysis.stats.science`); the predictor's hit rate
    (:mod:`analysis.stats.predictor_record`) passes its declared ``delta``."""
    if verdict not in (VERDICT_HELPS, VERDICT_HURTS):
        return NO_CALL
    shown = gain_class(lo, hi, seeds, delta)
    if shown == UNSETTLED:
        return UNDECIDED
    return HIT if (shown == HELPED) == (verdict == VERDICT_HELPS) else MISS


def kept_fractions(stats: GroupStats, metric: str = FILTER.metric) -> list[KeptFraction]:
    """What the filter would keep on this batch at every rho of :data:`RHO_GRID`, for both prob modes, ranking
    groups by ``metric`` (default: the trainer's filter's score, :data:`FILTER`) with the filter's eps: the linear
    row is what the trainer's top-p keeps at that rho."""
    scores = stats.score(metric)
    total = float(stats.size.sum())
    fractions = []
    for prob_mode, include_zero in PROB_MODE_INCLUDE_ZERO.items():
        for rho in RHO_GRID:
            keep = select_groups(scores, "top_p", rho, prob_mode=prob_mode, include_zero=include_zero,
                                 select_type=FILTER.select_type, eps=FILTER.eps)
            fractions.append(
                KeptFraction(
                    prob_mode=prob_mode,
                    rho=rho,
                    include_zero=include_zero,
                    prompts=float(keep.mean()),
                    trajectories=float(stats.size[keep].sum() / total),
                )
            )
    return fractions


def predict(
    rewards: Any,
    prompt_ids: Any,
    *,
    metric: str = "var",
    thresholds: PredictorThresholds | None = None,
    source: str = "<batch>",
    step: int | None = None,
) -> PredictorReport:
    """Run the predictor on one batch's (T,) rewards and (T,) prompt ids. ``metric`` picks the RV definition."""
    thresholds = thresholds or PredictorThresholds()
    if metric not in ("var", "std"):
        raise OrchError(f"unknown --metric {metric!r}; valid choices: std, var")
    try:
        stats = group_stats(rewards, prompt_ids)
    except ValueError as err:
        where = source if step is None else f"{source} (step {step})"
        raise OrchError(f"{where}: {err}") from None
    rv = {name: stats.score(name) for name in ("var", "std")}
    ratio = {name: rv_ratio(values) for name, values in rv.items()}
    verdict, reason = verdict_for(ratio[metric], thresholds, metric)
    return PredictorReport(
        source=source,
        step=step,
        num_prompts=stats.num_groups,
        num_trajectories=int(stats.size.sum()),
        metric=metric,
        rv_mean={name: float(values.mean()) for name, values in rv.items()},
        rv_std={name: float(values.std()) for name, values in rv.items()},
        ratio={name: (None if r is None or math.isnan(r) else r) for name, r in ratio.items()},
        zero_variance_share=float(stats.zero_variance.mean()),
        kept=kept_fractions(stats),
        verdict=verdict,
        reason=reason,
        thresholds=thresholds,
    )


def predict_frame(
    frame: pd.DataFrame,
    source: str,
    *,
    step: int | None = None,
    metric: str = "var",
    thresholds: PredictorThresholds | None = None,
) -> list[PredictorReport]:
    """One report per training step of a validated rollout-batch frame (or only ``step``)."""
    from recipes.stats.rollouts import iter_steps

    return [
        predict(
            rows["reward"].to_numpy(),
            rows["prompt_id"].to_numpy(),
            metric=metric,
            thresholds=thresholds,
            source=source,
            step=value,
        )
        for value, rows in iter_steps(frame, source, step)
    ]


def predict_batch_file(
    path: str | Path,
    *,
    step: int | None = None,
    metric: str = "var",
    thresholds: PredictorThresholds | None = None,
) -> list[PredictorReport]:
    """Load a rollout-batch file and run the predictor on each of its steps."""
    from recipes.stats.rollouts import load_rollout_batch

    return predict_frame(load_rollout_batch(path), str(path), step=step, metric=metric, thresholds=thresholds)


def predictions(batches: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, list[str]]:
    """The Std(RV)/Mean(RV) predictor on every step of every batch: columns :data:`analysis.stores.rollout_artifacts.PREDICTION_COLUMNS`, and a note
    per run whose batch the predictor refuses (e.g. one trajectory per prompt)."""
    import pandas as pd

    from analysis.stores.rollout_artifacts import PREDICTION_COLUMNS

    rows, notes = [], []
    for run_id, frame in batches.items():
        try:
            reports = predict_frame(frame, f"run {run_id}")
        except OrchError as err:
            notes.append(str(err))
            continue
        rows.extend(
            (run_id, r.step, r.ratio[r.metric], r.verdict, r.num_prompts, r.zero_variance_share, r.ratio["std"])
            for r in reports
        )
    return pd.DataFrame(rows, columns=list(PREDICTION_COLUMNS)), notes
