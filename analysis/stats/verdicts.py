"""The verdict rules: how a measurement over seeds is judged against a claim or a published number. One module
serves `orch report` (the paper, side by side: `analysis.reports.paper_report`), the findings of `analysis.stats.science`
(docs/science.md) and any later re-evaluation.

Every bootstrap interval is a 95% percentile bootstrap over seeds (:data:`N_BOOT` resamples, fixed seed
:data:`BOOT_SEED`): of a mean over runs, or of a difference of means with each arm resampled on its own. An interval
*clears* a threshold when it lies entirely above it and *misses* it when it lies entirely below. Fewer than
:data:`MIN_SEEDS` runs make a judgement *inconclusive*.

A published number has no interval (the paper prints one value per cell, from one run). :func:`judge` has one path
per kind of claim (:data:`KINDS`); the paper map (`analysis.paper`) declares each value's kind and its *margin*:
at least half the last digit the paper prints for it (:func:`rounding`, from the printed digits), wider where the
paper itself gives a spread or, for a claim of no effect, the smallest effect of interest orch declares. Where the
runs give per-run values (``Measurement.samples``) the judge's interval is Student's t (scipy: ``ttest_1samp``,
Welch's ``ttest_ind``), which keeps its coverage at 3-5 seeds where a percentile bootstrap is too narrow; otherwise
the measurement's own bootstrap interval.

* **level** (a success rate, an MI value): an equivalence judgement. *Reproduced* when the interval lies within
  published ± margin; *not reproduced* when it lies wholly outside that band; *inconclusive* otherwise -- a wide
  interval is inconclusive whatever it contains.
* **effect** with a size (a filter gain, a step-time cut): *reproduced* when the interval overlaps published ±
  margin *and* excludes 0; *not reproduced* when it excludes the band; *inconclusive* otherwise.
* **no effect**: two one-sided tests (TOST, scipy's t-tests with ``alternative=``, alpha :data:`ALPHA`) against
  ±margin, the smallest effect of interest: *reproduced* only when both reject (the effect lies inside ±margin);
  *not reproduced* when the 95% interval lies wholly outside ±margin; *inconclusive* when it reaches past it.
  Without per-run values: the 95% interval inside ±margin.
* **direction** (a claim the paper shows in a figure without a number: its sign): *reproduced* when the interval
  clears 0 on the published side, *not reproduced* when it clears 0 on the other, *inconclusive* otherwise.
* **ordering** (which series fell first): scored only on runs where both series declined; the share where MI fell
  first, with its Wilson interval: *reproduced* above 1/2, *not reproduced* below, *inconclusive* when it spans 1/2.
  Runs where only one series or neither declined are counted apart and shown, never scored.
* **correlation**: as a level, on the coefficient's interval, per task unless the paper pooled tasks (the map says
  which). Where the measurement carries its pairs (``samples``: x, y and, for pairs over (run, step), the run of
  each) the interval is :func:`correlation_interval`'s: Fisher's z over runs (Bonett and Wright's variance for
  Spearman's rho), or, for many pairs per run, a delete-one-run jackknife of z with Student's t over the runs --
  a percentile bootstrap over 3-10 runs is too narrow (it missed a true correlation 10-28% of the time).

A NaN or missing measurement is *not measured*, never a verdict. How often each path errs on known truth is
measured by ``benchmarks/bench_judge.py`` and recorded in ``analysis/stats/judge_rates.yaml`` (:func:`rate_line`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

# The kinds of claim and the rounding of a printed value are the paper map's declarations (re-exported here:
# the judge has one path per kind).
from analysis.paper import (  # noqa: F401
    CORRELATION,
    DIRECTION,
    EFFECT,
    KINDS,
    LEVEL,
    NO_EFFECT,
    ORDER,
    printed_digits,
    rounding,
)

MIN_SEEDS = 3
CI = 0.95
ALPHA = 0.05  # the two one-sided tests' level (their 90% interval inside the margin)
N_BOOT = 2000
BOOT_SEED = 0
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NOT_MEASURED = "not measured"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_MEASURED)
RATE_TARGET = 0.05  # the calibration's target: each error rate of each path at >= 5 seeds
EDGE = "on the band's edge"  # a calibration truth the path's own rule may reproduce: no error (rate_line)
RATES_FILE = Path(__file__).resolve().parent / "judge_rates.yaml"  # written by benchmarks/bench_judge.py --record


@dataclass(frozen=True)
class Measurement:
    """A measured value over runs: (value, lo, hi) -- lo, hi a 95% interval --, the runs it rests on and, where the
    measurement has them, the per-run values it was taken from (``samples``: one array, or the base and treated
    arms) and, for an ordering, the runs per outcome (``counts``)."""

    value: float
    lo: float
    hi: float
    n: int
    samples: tuple = ()
    counts: dict = field(default_factory=dict)
    coefficient: str = "pearson"  # a correlation's: "pearson" | "spearman"


class Judgement(NamedTuple):
    verdict: str
    reason: str
    lo: float  # the interval the verdict was taken on
    hi: float


def percentiles(values: np.ndarray) -> tuple[float, float]:
    values = values[np.isfinite(values)]
    if not values.size:
        return math.nan, math.nan
    lo, hi = np.percentile(values, [100 * (1 - CI) / 2, 100 * (1 + CI) / 2])
    return float(lo), float(hi)


def mean_interval(values, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean over runs and its percentile bootstrap interval (NaN without values)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(BOOT_SEED)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    return (float(values.mean()), *percentiles(means))


def _resampled_arms(base, treated, n_boot: int):
    """(base, treated, their bootstrap means) with each arm's finite values resampled on its own (the treated arm's
    draws first), or None when an arm is empty."""
    base = np.asarray(base, dtype=np.float64)
    treated = np.asarray(treated, dtype=np.float64)
    base, treated = base[np.isfinite(base)], treated[np.isfinite(treated)]
    if not base.size or not treated.size:
        return None
    rng = np.random.default_rng(BOOT_SEED)
    treated_means = treated[rng.integers(0, treated.size, size=(n_boot, treated.size))].mean(axis=1)
    base_means = base[rng.integers(0, base.size, size=(n_boot, base.size))].mean(axis=1)
    return base, treated, base_means, treated_means


def delta_interval(base, treated, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """(delta, lo, hi): mean(treated) - mean(base), each arm resampled on its own (NaN when an arm is empty)."""
    arms = _resampled_arms(base, treated, n_boot)
    if arms is None:
        return math.nan, math.nan, math.nan
    base, treated, base_means, treated_means = arms
    return (float(treated.mean() - base.mean()), *percentiles(treated_means - base_means))


def change_interval(base, treated, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """(change, lo, hi): the relative change ``100 * (mean(treated) / mean(base) - 1)``, in percent of the base,
    each arm resampled on its own as in :func:`delta_interval` (NaN when an arm is empty or the base's mean is not
    positive)."""
    arms = _resampled_arms(base, treated, n_boot)
    if arms is None or arms[0].mean() <= 0:
        return math.nan, math.nan, math.nan
    base, treated, base_means, treated_means = arms
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.where(base_means > 0, 100.0 * (treated_means / base_means - 1.0), np.nan)
    return (float(100.0 * (treated.mean() / base.mean() - 1.0)), *percentiles(draws))


def side(lo: float, hi: float, threshold: float) -> str:
    """'clears' (interval above ``threshold``), 'misses' (below) or 'spans'."""
    if math.isnan(lo) or math.isnan(hi):
        return "spans"
    return "clears" if lo > threshold else "misses" if hi < threshold else "spans"


def interval_text(value: float, lo: float, hi: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"



def t_interval(samples: tuple, centre: float = 0.0) -> tuple[float, float]:
    """Student's t 95% interval of the mean of one array, or Welch's of mean(treated) - mean(base) for two (scipy);
    NaN with fewer than 2 finite values in an arm, the point itself when every arm is constant."""
    from scipy.stats import ttest_1samp, ttest_ind

    arms = [np.asarray(arm, dtype=np.float64) for arm in samples]
    arms = [arm[np.isfinite(arm)] for arm in arms]
    if not arms or min(arm.size for arm in arms) < 2:
        return math.nan, math.nan
    if all(np.ptp(arm) == 0 for arm in arms):
        point = float(arms[0][0]) if len(arms) == 1 else float(arms[1][0] - arms[0][0])
        return point, point
    if len(arms) == 1:
        ci = ttest_1samp(arms[0], centre).confidence_interval(CI)
    else:
        ci = ttest_ind(arms[1], arms[0], equal_var=False).confidence_interval(CI)
    return float(ci.low), float(ci.high)


def _coefficient(x: np.ndarray, y: np.ndarray, coefficient: str) -> float:
    from scipy.stats import pearsonr, spearmanr

    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float((pearsonr if coefficient == "pearson" else spearmanr)(x, y).statistic)


def correlation_interval(x, y, coefficient: str = "pearson", groups=None) -> tuple[float, float]:
    """The 95% interval of a correlation coefficient (``coefficient``: "pearson" or "spearman") of paired values,
    pairs with a NaN dropped; NaN when too few for one.

    * One pair per run (``groups`` None): Fisher's z, ``atanh(r) +- 1.96 sd``, with ``sd^2 = 1 / (n - 3)`` for
      Pearson's r and Bonett and Wright's ``(1 + r^2 / 2) / (n - 3)`` for Spearman's rho (Psychometrika 65, 2000);
      at least 4 pairs.
    * Many pairs per run (``groups``: each pair's run): the steps of one run are not independent, so the runs are
      the sample: a delete-one-run jackknife of the pooled coefficient's z, its interval Student's t with (runs -
      1) degrees of freedom; at least 3 runs. On independent pairs at 3-10 runs it covers the true coefficient 95%
      of the time (benchmarks/bench_judge.py)."""
    from scipy.stats import t as student

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    r = _coefficient(x, y, coefficient)
    if not math.isfinite(r):
        return math.nan, math.nan
    z = math.atanh(min(max(r, -0.999999), 0.999999))
    if groups is None:
        if x.size < 4:
            return math.nan, math.nan
        variance = (1.0 if coefficient == "pearson" else 1.0 + r * r / 2.0) / (x.size - 3)
        half = 1.959964 * math.sqrt(variance)
    else:
        groups = np.asarray(groups)[keep]
        runs = np.unique(groups)
        if runs.size < 3:
            return math.nan, math.nan
        from analysis.stats.correlations import leave_one_group_out

        left_out = leave_one_group_out(x, y, groups, coefficient)  # one coefficient per run left out, to rounding
        if not np.isfinite(left_out).all():
            return math.nan, math.nan
        zs = np.arctanh(np.clip(left_out, -0.999999, 0.999999))
        variance = (runs.size - 1) / runs.size * float(((zs - zs.mean()) ** 2).sum())
        half = float(student.ppf(0.5 + CI / 2, runs.size - 1)) * math.sqrt(variance)
    return math.tanh(z - half), math.tanh(z + half)


def tost_p(samples: tuple, margin: float) -> float:
    """The p-value of two one-sided tests that the mean (one array) or the difference of means (base, treated) lies
    inside (-margin, +margin): the larger of scipy's two one-sided t-tests (Welch's for two arms)."""
    from scipy.stats import ttest_1samp, ttest_ind

    arms = [np.asarray(arm, dtype=np.float64) for arm in samples]
    arms = [arm[np.isfinite(arm)] for arm in arms]
    if not arms or min(arm.size for arm in arms) < 2:
        return math.nan
    if all(np.ptp(arm) == 0 for arm in arms):
        point = arms[0][0] if len(arms) == 1 else arms[1][0] - arms[0][0]
        return 0.0 if abs(point) < margin else 1.0
    if len(arms) == 1:
        above = ttest_1samp(arms[0], -margin, alternative="greater").pvalue
        below = ttest_1samp(arms[0], margin, alternative="less").pvalue
    else:
        base, treated = arms
        above = ttest_ind(treated + margin, base, equal_var=False, alternative="greater").pvalue
        below = ttest_ind(treated - margin, base, equal_var=False, alternative="less").pvalue
    return float(max(above, below))


def detectable(lo: float, hi: float) -> float:
    """The smallest true difference an interval this wide detects 4 times in 5 (a two-sided test at 5%): (1.96 +
    0.84) standard errors, the standard error read off the 95% interval's width. NaN without an interval."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return math.nan
    return (1.959964 + 0.841621) * (hi - lo) / (2 * 1.959964)


def _bracket(lo: float, hi: float) -> str:
    return f"[{lo:.3g}, {hi:.3g}]"


def judge(published: float, kind: str, measured, n: int | None = None, margin: float = 0.0) -> Judgement:
    """The verdict of a published number against a measurement (a :class:`Measurement`, or (value, lo, hi) with
    ``n`` runs), by the path of its ``kind`` (the module docstring), with its declared ``margin``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    m = measured if isinstance(measured, Measurement) else Measurement(*measured, n if n is not None else 0)
    if kind == EFFECT and abs(published) <= margin:
        raise ValueError(f"an effect of {published:g} within its margin {margin:g} is a claim of no effect")
    if kind == ORDER and m.counts and any(m.counts.values()):
        return _judge_order(m)  # runs with outcomes, maybe none where both declined: counted apart, inconclusive
    if not math.isfinite(m.value) or m.n == 0:
        return Judgement(NOT_MEASURED, "the runs give no finite value", math.nan, math.nan)
    if kind == ORDER:
        return _judge_order(m)
    lo, hi = m.lo, m.hi
    if m.samples and kind == CORRELATION:
        lo, hi = correlation_interval(m.samples[0], m.samples[1], m.coefficient,
                                      m.samples[2] if len(m.samples) > 2 else None)
    elif m.samples:
        lo, hi = t_interval(m.samples, published if kind == LEVEL else 0.0)
    if m.n < MIN_SEEDS or not (math.isfinite(lo) and math.isfinite(hi)):
        need = 4 if kind == CORRELATION and m.samples and len(m.samples) == 2 else MIN_SEEDS
        return Judgement(INCONCLUSIVE, f"{m.n} run(s): at least {need} are needed for an interval", lo, hi)
    band_lo, band_hi = published - margin, published + margin
    band = f"published {published:g} \u00b1 {margin:g}"
    if kind in (LEVEL, CORRELATION):
        if band_lo <= lo and hi <= band_hi:
            return Judgement(REPRODUCED, f"the measured interval {_bracket(lo, hi)} lies within {band}", lo, hi)
        if hi < band_lo or lo > band_hi:
            return Judgement(NOT_REPRODUCED, f"the measured interval {_bracket(lo, hi)} lies wholly outside {band}",
                             lo, hi)
        return Judgement(INCONCLUSIVE, f"the measured interval {_bracket(lo, hi)} reaches past {band}", lo, hi)
    if kind == EFFECT:
        if hi < band_lo or lo > band_hi:
            return Judgement(NOT_REPRODUCED, f"the measured interval {_bracket(lo, hi)} excludes {band}", lo, hi)
        if side(lo, hi, 0.0) == ("clears" if published > 0 else "misses"):
            return Judgement(REPRODUCED, f"the measured interval {_bracket(lo, hi)} overlaps {band} and excludes 0",
                             lo, hi)
        return Judgement(INCONCLUSIVE, f"the measured interval {_bracket(lo, hi)} overlaps {band} but spans 0",
                         lo, hi)
    if kind == NO_EFFECT:
        inside = f"\u00b1{margin:g} (the smallest effect of interest)"
        if hi < -margin or lo > margin:
            return Judgement(NOT_REPRODUCED, f"the measured interval {_bracket(lo, hi)} lies outside {inside}", lo, hi)
        if m.samples:
            p = tost_p(m.samples, margin)
            if p < ALPHA:
                return Judgement(REPRODUCED, f"two one-sided t-tests place the effect inside {inside}: p = {p:.3g}",
                                 lo, hi)
            return Judgement(INCONCLUSIVE, f"two one-sided t-tests cannot place the effect inside {inside}: p = "
                             f"{p:.3g}; interval {_bracket(lo, hi)}", lo, hi)
        if -margin <= lo and hi <= margin:
            return Judgement(REPRODUCED, f"the measured interval {_bracket(lo, hi)} lies inside {inside}", lo, hi)
        return Judgement(INCONCLUSIVE, f"the measured interval {_bracket(lo, hi)} reaches past {inside}", lo, hi)
    where = side(lo, hi, 0.0)  # DIRECTION: the sign is the claim
    if where == "spans":
        return Judgement(INCONCLUSIVE, f"the measured interval {_bracket(lo, hi)} spans 0", lo, hi)
    if where == ("clears" if published > 0 else "misses"):
        return Judgement(REPRODUCED, f"the measured interval {_bracket(lo, hi)} has the published sign "
                         f"({published:+g})", lo, hi)
    return Judgement(NOT_REPRODUCED, f"the measured interval {_bracket(lo, hi)} has the opposite sign to "
                     f"{published:+g}", lo, hi)


def _judge_order(m: Measurement) -> Judgement:
    """Ordering: ``m.value`` the share of runs where MI declined first among the ``m.n`` where both declined first
    one or the other; the Wilson interval of that share against 1/2."""
    first = int(m.counts.get("MI first", 0)) if m.counts else int(round(m.value * m.n))
    lo, hi = wilson(first, m.n)
    apart = ", ".join(f"{outcome} {count}" for outcome, count in m.counts.items()
                      if outcome not in ("MI first", "success first") and count)
    text = (f"MI first in {first} of {m.n} runs where both declined (95% {lo:.0%}-{hi:.0%})"
            + (f"; not scored: {apart}" if apart else ""))
    if m.n < MIN_SEEDS:
        return Judgement(INCONCLUSIVE, f"{text}: at least {MIN_SEEDS} runs where both declined are needed", lo, hi)
    if lo > 0.5:
        return Judgement(REPRODUCED, f"{text}: above one half", lo, hi)
    if hi < 0.5:
        return Judgement(NOT_REPRODUCED, f"{text}: below one half", lo, hi)
    return Judgement(INCONCLUSIVE, f"{text}: spans one half", lo, hi)


def load_rates(path: Path = RATES_FILE) -> dict:
    """The judge's recorded error rates (``benchmarks/bench_judge.py --record``); {} when none is recorded. Read once
    per version of the file (`orchlib.records.recorded_yaml`); the dict is shared: read it, do not change it."""
    from orchlib.records import recorded_yaml

    return recorded_yaml(path)


def rate_line(kind: str, n: int, record: dict | None = None) -> str | None:
    """The measured error rates of the judge's ``kind`` path at the recorded seed count nearest below ``n`` (the
    smallest recorded when ``n`` is below them all), and whether they meet :data:`RATE_TARGET`; None when the
    path has no record."""
    record = load_rates() if record is None else record
    path = (record.get("paths") or {}).get(kind)
    if not path:
        return None
    seeds = sorted(int(s) for s in path["rates"])
    at = max([s for s in seeds if s <= n] or seeds[:1])
    rates = path["rates"][at]
    errors = {label: rate for label, rate in rates.items() if EDGE not in label}
    text = (f"The judge's {kind} path on known truth ({path['case']}; benchmarks/bench_judge.py) at {at} runs: "
            + "; ".join(f"P({label}) {rate:.0%}" for label, rate in rates.items()))
    above = [label for label, rate in errors.items() if rate > RATE_TARGET]
    if above:
        text += (f" -- P({above[0]}) is above the {RATE_TARGET:.0%} target"
                 + (f" (and {len(above) - 1} more)" if len(above) > 1 else "")
                 + ": read its verdicts with that rate")
    if len(errors) < len(rates):
        text += f" (a truth {EDGE} is no error: the path's rule may call it reproduced)"
    return text + "."


def rate_brief(kind: str, n: int, record: dict | None = None) -> str:
    """:func:`rate_line` in a few words, for a verdict printed on one line: the path's largest error rate on known
    truth at the recorded run count nearest below ``n`` (a truth on the band's edge left out) against the target;
    '' when the path has no record."""
    record = load_rates() if record is None else record
    path = (record.get("paths") or {}).get(kind)
    if not path:
        return ""
    seeds = sorted(int(s) for s in path["rates"])
    at = max([s for s in seeds if s <= n] or seeds[:1])
    worst = max(rate for label, rate in path["rates"][at].items() if EDGE not in label)
    flag = f", above the {RATE_TARGET:.0%} target" if worst > RATE_TARGET else ""
    return f"the judge's {kind} path errs in up to {worst:.0%} of known-truth draws at {at} runs{flag}"


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a rate of `hits` in `n` trials ((0, 1) when `n` is 0)."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


SHOWN, NOT_SHOWN = "shown to move", "not shown to move"


def control_verdict(detected: int, planted: int, false_alarms: int, negative: int) -> tuple[str, str]:
    """(verdict, reason) of the MI instrument's controls on one task (docs/diagnostics.md#controls): *shown to
    move* when the collapse alert's detection rate under a planted collapse lies above its false-alarm rate with
    nothing planted (Wilson intervals apart), with at least :data:`MIN_SEEDS` runs in each arm; else *not shown*."""
    if planted < MIN_SEEDS or negative < MIN_SEEDS:
        return NOT_SHOWN, f"{planted} planted and {negative} negative control run(s): at least {MIN_SEEDS} each"
    hit_lo, hit_hi = wilson(detected, planted)
    fa_lo, fa_hi = wilson(false_alarms, negative)
    rates = (f"planted collapse detected in {detected}/{planted} runs (95% {hit_lo:.0%}-{hit_hi:.0%}), false alarms "
             f"in {false_alarms}/{negative} (95% {fa_lo:.0%}-{fa_hi:.0%})")
    if hit_lo > fa_hi:
        return SHOWN, rates
    return NOT_SHOWN, rates + ": the intervals overlap"
