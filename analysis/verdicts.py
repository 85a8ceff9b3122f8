"""The verdict rules: how a measurement over seeds is judged against a claim or a published number. One module
serves `orch report` (the paper, side by side: `analysis.paper_report`), the findings of `analysis.science`
(docs/science.md) and any later re-evaluation. The rules were written before any run was looked at.

Every interval is a 95% percentile bootstrap over seeds (:data:`N_BOOT` resamples, fixed seed :data:`BOOT_SEED`):
of a mean over runs, or of a difference of means with each arm resampled on its own. An interval *clears* a
threshold when it lies entirely above it and *misses* it when it lies entirely below. Fewer than :data:`MIN_SEEDS`
runs in an arm make a judgement *inconclusive*.

A published number has no interval (the paper prints one value per cell, from one run). It is judged by kind:

* a **level** (a success rate, an MI value, a correlation): *reproduced* when the published value, widened by
  half its last printed digit (:data:`PRINT_TOLERANCE`; a claim printed in words, e.g. "about unchanged", states
  its own width), overlaps the measured interval; *not reproduced* when it lies entirely outside it;
  *inconclusive* with fewer than :data:`MIN_SEEDS` runs. A wide interval reproduces easily: its width is printed
  beside the verdict, and a level is only comparable at the paper's scale (a rehearsal on the tiny model says so in
  its banner).
* a **direction** (a filter gain, a change over training, a step-time cut): the sign is the claim. *Reproduced*
  when the measured interval clears 0 on the published side (or, for a published 0.0 -- "no effect" --, when it
  spans 0); *not reproduced* when it clears 0 on the other side (or, for a published 0.0, when it excludes 0);
  *inconclusive* when it spans 0 or has too few runs. The magnitude is shown, not judged.
"""

from __future__ import annotations

import math

import numpy as np

MIN_SEEDS = 3
CI = 0.95
N_BOOT = 2000
BOOT_SEED = 0
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
LEVEL, DIRECTION = "level", "direction"
PRINT_TOLERANCE = 0.05  # half of the last digit the paper prints (one decimal)


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



def judge(published: float, kind: str, measured: tuple[float, float, float], n: int,
          tolerance: float = PRINT_TOLERANCE) -> tuple[str, str]:
    """(verdict, reason) of a published number against a measured (value, lo, hi) over `n` runs (see the module
    docstring). `kind`: :data:`LEVEL` or :data:`DIRECTION`."""
    value, lo, hi = measured
    if kind not in (LEVEL, DIRECTION):
        raise ValueError(f"kind must be {LEVEL!r} or {DIRECTION!r}, got {kind!r}")
    if n < MIN_SEEDS or math.isnan(value) or math.isnan(lo) or math.isnan(hi):
        return INCONCLUSIVE, f"{n} run(s): at least {MIN_SEEDS} are needed for an interval"
    if kind == LEVEL:
        if published + tolerance < lo or published - tolerance > hi:
            return NOT_REPRODUCED, f"published {published:g} lies outside the measured interval [{lo:.3g}, {hi:.3g}]"
        return REPRODUCED, f"published {published:g} lies inside the measured interval [{lo:.3g}, {hi:.3g}]"
    where = side(lo, hi, 0.0)
    if abs(published) < tolerance:  # the paper says: no effect
        if where == "spans":
            return REPRODUCED, f"published no effect; the measured interval [{lo:.3g}, {hi:.3g}] spans 0"
        return NOT_REPRODUCED, f"published no effect; the measured interval [{lo:.3g}, {hi:.3g}] excludes 0"
    wanted = "clears" if published > 0 else "misses"
    if where == "spans":
        return INCONCLUSIVE, f"the measured interval [{lo:.3g}, {hi:.3g}] spans 0"
    if where == wanted:
        return REPRODUCED, f"the measured interval [{lo:.3g}, {hi:.3g}] has the published sign ({published:+g})"
    return NOT_REPRODUCED, f"the measured interval [{lo:.3g}, {hi:.3g}] has the opposite sign to {published:+g}"


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
    move* when the early warning's detection rate under a planted collapse lies above its false-alarm rate with
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
