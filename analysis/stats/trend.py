"""Did a series fall, rise or hold over training? A trend statistic with a null, read after the runs.

The pre-registered *fall* of :mod:`analysis.stats.science` (peak minus the mean of the last 3 points) is positive for any
noisy series, trend or none. This module's reading is zero in expectation on a flat noisy series:

* **estimator** -- the Theil-Sen slope (``scipy.stats.theilslopes``: the median of the pairwise slopes) of a run's
  (step, value) points times the span of its steps: the *change* over the run, in the metric's units. The *early
  level* is the Theil-Sen line's value at the first step; when it is positive the change is read relative to it
  (printed as a percentage).
* **interval of one run** -- a seeded moving-block bootstrap of the (step, value) pairs, which keeps the serial
  correlation of the series (an EMA-smoothed metric's, say) inside each block. Block length (:func:`block_length`):
  the larger of ``ceil(n^(1/3))`` and Carlstein's AR(1) optimum for the lag-1 autocorrelation :func:`lag1` reads,
  at most ``n // 2``. A bootstrap of ``k = n / b`` blocks behaves like a sample of ``k`` units, whose percentile
  interval is too narrow: it is widened about the estimate by Hesterberg's *expanded percentile* factor
  (:func:`widening`). A short series (6-8 points) is therefore read as having moved only when the change is large
  against its noise.
* **interval of an arm of runs** -- the runs are independent whatever each series' autocorrelation: the mean of
  their changes with Student's t interval over the runs (``scipy.stats.t``); each run's own verdict is counted
  beside it (read from the same draws without computing its interval, the same verdict: :func:`_verdict`).
* **verdicts** -- a change *fell* (interval below 0), *rose* (above 0) or shows *no trend detected* (interval spans
  0): a rising series is never read as a fall. A level *held* only when the whole relative interval lies inside
  ``+-HOLD_MARGIN`` of the early level, *changed* when it lies wholly outside, *undetermined* otherwise.

* **what "no trend detected" is worth** -- every reading carries the smallest change the same test would detect
  with :data:`POWER` (80%) probability at that series length (``Trend.detectable``, printed beside *no trend
  detected* and *held*). One run: by simulation of the test itself (:func:`detectable_change`) on AR(1) noise with
  the series' own residual spread and lag-1 autocorrelation, at its own steps, a linear fall planted over the span;
  an arm of runs: the noncentral-t power of its t interval with the spread of the runs' own changes
  (:func:`detectable_mean_change`). tests/analysis/stats/test_trend.py checks both on series whose answer is known.

Every interval is a 95% interval (``analysis.stats.verdicts.CI``); bootstraps draw :data:`N_BOOT` replicates with a fixed
seed (``analysis.stats.verdicts.BOOT_SEED``): reports are reproducible. A replicate's Theil-Sen median is computed
exactly, by whichever of three equal ways is fastest at its length (:data:`SORT_PAIRS`, :func:`resampled_theil_sen`). The largest rate at which a flat series was read
as having fallen or risen, measured by ``tests/analysis/stats/test_trend.py``, is :data:`FALSE_POSITIVE_RATE`.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from analysis.stats.early_warning import DEFAULT_RULE
from analysis.stats.verdicts import BOOT_SEED, CI

if TYPE_CHECKING:
    from analysis.stores.mlflow_store import RunData

N_BOOT = 1000  # bootstrap replicates of a trend (each a Theil-Sen fit: O(n^2) pairs)
MIN_POINTS = 4  # fewer logged points than this: no trend is read
RHO_MAX = 0.95  # the largest lag-1 autocorrelation the block length is chosen for
# An early level "held" when its change lies inside +-HOLD_MARGIN of it: half the fall the trainer's rule and the
# pre-registered finding 1a count as a collapse (0.3), so a level that held moved less than half a collapse.
HOLD_MARGIN = DEFAULT_RULE.drop_fraction / 2
# The largest rate at which a flat series was read as "fell" or "rose" in tests/analysis/stats/test_trend.py (400 seeded
# series per case: white or AR(1) phi 0.8 noise, 6, 8 or 21 points, one run or an arm of 5; nominal 5%). The test
# measures it again and fails when it changes: the report prints this number.
FALSE_POSITIVE_RATE = 0.0525
FELL, ROSE, NO_TREND = "fell", "rose", "no trend detected"
POWER = 0.80  # the detection probability the smallest detectable change is stated at
DETECT_SERIES = 100  # simulated series per planted size when finding one run's smallest detectable change
DETECT_BOOT = 60  # bootstrap replicates of each simulated series' test
DETECT_POINTS = 30  # a longer series is simulated on this many of its points, evenly spread: an upper bound
HELD, CHANGED, UNDETERMINED = "held", "changed", "undetermined"
# Pairs per resample from which a median by sorting (theil_sen) is slower than by np.nanmedian, and both than by
# running sums along the series' own sorted slopes (resampled_theil_sen: 4-6 times faster at 40-200 points)
SORT_PAIRS = 600


def null_note() -> str:
    """What the trend test's verdicts are worth, for a report: its measured false-positive rate."""
    return (f"a flat noisy series reads as fell or rose in at most {FALSE_POSITIVE_RATE:.2%} of seeded trials "
            f"(nominal {1 - CI:.0%}; tests/analysis/stats/test_trend.py)")


def theil_sen(steps: np.ndarray, values: np.ndarray, chunk: int = 128) -> np.ndarray:
    """Theil-Sen slopes of many resampled series at once: ``steps`` and ``values`` (B, n) -> (B,) medians of the
    slopes over the pairs with distinct steps (NaN when no pair has). It equals ``scipy.stats.theilslopes`` on each
    row; scipy fits one series a call, too slow for thousands of bootstrap replicates (rows go ``chunk`` at a time
    to bound the (chunk, n (n - 1) / 2) pair arrays)."""
    left, right = np.triu_indices(steps.shape[1], 1)
    slopes = np.empty(len(steps))
    for row in range(0, len(steps), chunk):
        dx = steps[row:row + chunk, right] - steps[row:row + chunk, left]
        dy = values[row:row + chunk, right] - values[row:row + chunk, left]
        with np.errstate(divide="ignore", invalid="ignore"):
            pairs = np.where(dx != 0, dy / dx, np.nan)  # a pair of repeated steps has no slope
        slopes[row:row + chunk] = _nanmedian(pairs)
    return slopes


class Line(NamedTuple):
    slope: float
    intercept: float


def theil_sen_line(steps: np.ndarray, values: np.ndarray) -> Line:
    """``scipy.stats.theilslopes(values, steps)``'s slope and intercept (its default method, 'separate'), the same
    numbers, without the confidence interval it also computes (a sort of every pairwise slope, which the trend test
    never reads: 792 series in a Table-4 report, issue 60)."""
    dx, dy = steps[:, None] - steps, values[:, None] - values
    later = dx > 0
    slope = np.median(dy[later] / dx[later])
    return Line(slope, np.median(values) - slope * np.median(steps))


def resampled_theil_sen(steps: np.ndarray, values: np.ndarray, picks: np.ndarray, chunk: int = 64) -> np.ndarray:
    """:func:`theil_sen` of the resamples ``steps[picks]``, ``values[picks]`` of one series (``picks``: (B, n)
    positions), equal to it value for value, without sorting each resample's slopes: a resample's slopes are the
    series' own pairwise slopes (a pair of the same point twice has no slope), the pair (i, j) counted ``c_i c_j``
    times by the resample's counts ``c``; so the series' slopes are sorted once and each resample's two middle
    slopes are found in the running sum of its counts along them (O(B n^2) instead of O(B n^2 log n); issue 60)."""
    n, boots = steps.size, len(picks)
    left, right = np.triu_indices(n, 1)
    dx = steps[right] - steps[left]
    valid = dx != 0  # as theil_sen: a pair of repeated steps has no slope
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        slopes = (values[right] - values[left])[valid] / dx[valid]
    order = np.argsort(slopes, kind="stable")
    slopes, left, right = slopes[order], left[valid][order], right[valid][order]
    counts = np.bincount((np.arange(boots)[:, None] * n + picks).ravel(), minlength=boots * n).reshape(boots, n)
    counts = counts.astype(np.int32 if n * n < 2 ** 31 else np.int64)
    medians = np.full(boots, np.nan)
    for row in range(0, boots, chunk):
        part = counts[row:row + chunk]
        running = np.cumsum(part[:, left] * part[:, right], axis=1)  # (rows, pairs) slopes counted so far
        total = running[:, -1] if slopes.size else np.zeros(len(part), dtype=counts.dtype)
        low, high = (total - 1) // 2, total // 2  # the middle two order statistics (one when the count is odd)
        # the position of the slope holding order statistic ``low`` (``high``): the first whose running sum passes it
        at_low = np.array([np.searchsorted(sums, k, side="right") for sums, k in zip(running, low, strict=True)])
        at_high = np.array([np.searchsorted(sums, k, side="right") for sums, k in zip(running, high, strict=True)])
        has = total > 0
        middle = (slopes[np.minimum(at_low, slopes.size - 1)] + slopes[np.minimum(at_high, slopes.size - 1)]) / 2
        medians[row:row + chunk] = np.where(has, middle, np.nan) if slopes.size else np.nan
    return medians


def _nanmedian(rows: np.ndarray) -> np.ndarray:
    """(B, P) -> (B,) medians of each row's finite entries (NaN for a row without). ``np.nanmedian`` goes through
    masked arrays for rows shorter than :data:`SORT_PAIRS`, ten times slower than sorting them (NaNs sort last)."""
    count = np.count_nonzero(np.isfinite(rows), axis=1)
    if rows.shape[1] >= SORT_PAIRS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row: NaN
            return np.nanmedian(rows, axis=1)
    ordered, index = np.sort(rows, axis=1), np.arange(len(rows))
    middle = (ordered[index, np.maximum(count - 1, 0) // 2] + ordered[index, count // 2]) / 2
    return np.where(count > 0, middle, np.nan)


def lag1(values: np.ndarray, residuals: np.ndarray) -> float:
    """The lag-1 autocorrelation ``rho`` a series' noise is read to have, for the block length: the larger of two
    estimates from ``values`` (n,) in step order and their ``residuals`` (n,) about the Theil-Sen line, clipped to
    ``[0, RHO_MAX]`` (0 below :data:`MIN_POINTS` points):

    * from the first differences ``r_d``: for AR(1) noise their lag-1 autocorrelation is ``-(1 - rho) / 2``, so
      ``rho = 1 + 2 r_d``; a linear trend is a constant in the differences and cannot absorb the noise's wander;
    * from the residuals ``r``, bias-corrected for a short series (Marriott & Pope: ``(n r + 1) / (n - 3)``).

    A short autocorrelated series that wanders looks like a trend with white residuals; the larger estimate errs
    towards longer blocks (wider intervals). On AR(1) noise of 21 points the differences read 0.79 on average for
    rho 0.8, and 0.10 for white noise."""
    n = values.size
    if n < MIN_POINTS:
        return 0.0
    estimate = max(1 + 2 * _autocorrelation(np.diff(values)), (n * _autocorrelation(residuals) + 1) / (n - 3))
    return float(np.clip(estimate, 0.0, RHO_MAX))


def _autocorrelation(series: np.ndarray) -> float:
    """The sample lag-1 autocorrelation of ``series`` (n,), about its mean (0 for a constant series)."""
    centred = series - series.mean()
    power = float(np.dot(centred, centred))
    return float(np.dot(centred[1:], centred[:-1])) / power if power > 0 else 0.0


def block_length(n: int, rho: float) -> int:
    """The block length for ``n`` points whose noise has lag-1 autocorrelation ``rho``: the larger of
    ``ceil(n^(1/3))`` (the textbook rate) and Carlstein's optimum for an AR(1) series,
    ``ceil((sqrt(6) rho / (1 - rho^2))^(2/3) n^(1/3))``, kept at most ``n // 2`` (two blocks at least)."""
    optimum = (math.sqrt(6) * rho / (1 - rho * rho)) ** (2 / 3) * n ** (1 / 3)
    return int(min(max(1, math.ceil(n ** (1 / 3)), math.ceil(optimum)), max(1, n // 2)))


def block_indices(n: int, block: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n) positions of a moving-block bootstrap: blocks of ``block`` consecutive positions starting
    anywhere in ``[0, n - block]``, laid end to end and cut at ``n``."""
    starts = rng.integers(0, n - block + 1, size=(n_boot, math.ceil(n / block)))
    return (starts[:, :, None] + np.arange(block)).reshape(n_boot, -1)[:, :n]


@functools.lru_cache(maxsize=1024)  # the same few block counts for every series of a length (issue 60)
def widening(blocks: float) -> float:
    """Hesterberg's expanded-percentile factor for a bootstrap of ``blocks`` independent units,
    ``t(blocks - 1) / z * sqrt(blocks / (blocks - 1))`` at the level :data:`analysis.stats.verdicts.CI`."""
    from scipy import stats

    if blocks <= 1:
        return math.inf
    tail = (1 + CI) / 2
    return float(stats.t.ppf(tail, blocks - 1) / stats.norm.ppf(tail) * math.sqrt(blocks / (blocks - 1)))


def _interval(draws: np.ndarray) -> tuple[float, float]:
    """The central :data:`analysis.stats.verdicts.CI` percentile interval of the finite ``draws``."""
    lo, hi = np.nanpercentile(draws, [100 * (1 - CI) / 2, 100 * (1 + CI) / 2])
    return float(lo), float(hi)


def direction(lo: float, hi: float) -> str:
    """:data:`FELL` (interval below 0), :data:`ROSE` (above 0) or :data:`NO_TREND` (spans 0 or undefined)."""
    if math.isnan(lo) or math.isnan(hi):
        return NO_TREND
    return FELL if hi < 0 else ROSE if lo > 0 else NO_TREND


def held(lo: float, hi: float, margin: float = HOLD_MARGIN) -> str:
    """Equivalence of a relative change's interval with no change: :data:`HELD` when it lies inside
    ``[-margin, +margin]``, :data:`CHANGED` when it lies wholly outside it, :data:`UNDETERMINED` otherwise."""
    if math.isnan(lo) or math.isnan(hi):
        return UNDETERMINED
    if -margin <= lo and hi <= margin:
        return HELD
    return CHANGED if lo > margin or hi < -margin else UNDETERMINED


def _percent(fraction: float) -> str:
    """A signed percentage, whole below -1% and above +1%, with one decimal in between (no '-0%' for a bound
    just below 0)."""
    return f"{100 * fraction:+.{0 if abs(fraction) >= 0.01 or fraction == 0 else 1}f}%"


@dataclass(frozen=True)
class Trend:
    """A change over training with its interval: ``value`` [``lo``, ``hi``], as a fraction of the early level
    (``relative``) or in the metric's units; ``change``: the same change in the metric's units (for pooling runs);
    ``first`` and ``last``: the steps covered; ``runs``: each run's own verdict (one entry for a single run). A run of
    an arm of several, whose interval no report shows, may carry its verdict alone (``lo`` and ``hi`` NaN:
    :func:`trends`)."""

    value: float
    lo: float
    hi: float
    relative: bool
    change: float
    first: float
    last: float
    runs: tuple[str, ...]
    # the smallest change (units of value) detected with POWER at this length; NaN when not computed
    detectable: float = field(default=float("nan"), compare=False)

    @property
    def verdict(self) -> str:
        """:func:`direction` of the interval: fell, rose or no trend detected (one run's: its own verdict, which is
        the direction of its interval, or the verdict alone when only that was read: :func:`trends`)."""
        return self.runs[0] if len(self.runs) == 1 else direction(self.lo, self.hi)

    @property
    def level(self) -> str:
        """:func:`held` of the relative interval (undetermined when the change is not relative)."""
        return held(self.lo, self.hi) if self.relative else UNDETERMINED

    def size(self) -> str:
        """The change and its interval in words: '-42% [-60%, -20%]' (relative) or '-0.12 [-0.20, -0.04]'."""
        if self.relative:
            return f"{_percent(self.value)} [{_percent(self.lo)}, {_percent(self.hi)}]"
        return f"{self.value:+.2f} [{self.lo:+.2f}, {self.hi:+.2f}]"

    def detectable_text(self) -> str:
        """'a change of 95% or more would be detected 80% of the time at this length' (module docstring)."""
        if math.isnan(self.detectable):
            return "the smallest detectable change is unknown (too few points or no spread)"
        size = f"{100 * self.detectable:.0f}%" if self.relative else f"{self.detectable:.2g}"
        return (f"only a change of {size}{' of the early level' if self.relative else ''} or more would be "
                f"detected {POWER:.0%} of the time at this length")

    def text(self) -> str:
        """E.g. 'fell -42% [-60%, -20%] over steps 1-100 (5 runs: fell 4, no trend detected 1)'; a reading of no
        trend adds the smallest change the test would have detected (:meth:`detectable_text`)."""
        text = f"{self.verdict} {self.size()} over steps {self.first:g}-{self.last:g}"
        if len(self.runs) > 1:
            counts = ", ".join(f"{said} {self.runs.count(said)}" for said in (FELL, ROSE, NO_TREND) if said in self.runs)
            text += f" ({len(self.runs)} runs: {counts})"
        if self.verdict == NO_TREND:
            text += f" -- {self.detectable_text()}"
        return text


def run_trend(steps, values, n_boot: int = N_BOOT, rng: np.random.Generator | None = None,
              detect: bool = False, interval: bool = True) -> Trend | None:
    """The trend of one run's series (module docstring): ``steps`` and ``values`` (n,), in any order, NaNs dropped;
    relative to the early level when that is positive. None with fewer than :data:`MIN_POINTS` points. ``detect``:
    also the smallest change detectable at this length (:func:`detectable_change`, seconds; else NaN).
    ``interval=False``: the verdict alone (:func:`_verdict`: the same verdict from the same draws, without the
    O(n_boot n^2 log n) interval; ``lo`` and ``hi`` NaN)."""

    steps, values = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    keep = np.isfinite(steps) & np.isfinite(values)
    order = np.argsort(steps[keep], kind="stable")
    steps, values = steps[keep][order], values[keep][order]
    if steps.size < MIN_POINTS or steps[0] == steps[-1]:
        return None
    rng = np.random.default_rng(BOOT_SEED) if rng is None else rng
    fit = theil_sen_line(steps, values)
    span = float(steps[-1] - steps[0])
    change = float(fit.slope) * span
    block = block_length(steps.size, lag1(values, values - (fit.intercept + fit.slope * steps)))
    picks = block_indices(steps.size, block, n_boot, rng)
    factor = widening(steps.size / block)
    said = None if interval else _verdict(steps, values, picks, span, change, factor)
    if said is None:
        many = steps.size * (steps.size - 1) // 2 >= SORT_PAIRS  # then the running sums are the faster way
        slopes = resampled_theil_sen(steps, values, picks) if many else theil_sen(steps[picks], values[picks])
        lo, hi = (change + factor * (end - change) for end in _interval(slopes * span))
        said = direction(lo, hi)
    else:
        lo = hi = float("nan")
    level = float(fit.intercept + fit.slope * steps[0])
    scale = level if level > 0 else 1.0
    residuals = values - (fit.intercept + fit.slope * steps)
    spread = float(np.std(residuals, ddof=2)) if steps.size > 2 else float("nan")
    detectable = (spread * detectable_change(tuple(steps.tolist()), _rho_bucket(lag1(values, residuals)))
                  if detect else float("nan"))
    return Trend(value=change / scale, lo=lo / scale, hi=hi / scale, relative=level > 0, change=change,
                 first=float(steps[0]), last=float(steps[-1]), runs=(said,), detectable=detectable / scale)


def _verdict(steps: np.ndarray, values: np.ndarray, picks: np.ndarray, span: float, change: float,
             factor: float) -> str | None:
    """:func:`run_trend`'s verdict from its bootstrap ``picks`` (B, n) without the B Theil-Sen medians, or None when
    it is too close to call this way (then the caller computes the interval; it is the same verdict either way).

    The widened interval lies below 0 exactly when its upper percentile of the draws lies below ``t = change -
    change / factor``, and above 0 when its lower one lies above ``t``; so only how many draws lie below ``t`` is
    needed, with a band of 1e-9 relative about it for rounding (none when ``t`` is 0: the signs are exact). A
    replicate's pairwise slopes are the series' own (a pair of resampled points is a pair of the series' points, or
    the same point twice: no slope), each counted ``c_i c_j`` times by the replicate's counts ``c`` of each point; so
    the number of a replicate's slopes below ``x`` is ``c' U c`` over the upper-triangular indicator ``U`` of the
    series' pairs whose slope is below ``x``: one matrix product for every replicate (O(B n^2) in BLAS instead of
    sorting B n^2 / 2 slopes). A draw (a median: the mean of the middle two slopes when their count is even) then
    surely lies below ``x`` when its upper middle slope does, surely not when its lower middle slope does not, and
    possibly otherwise; each verdict is read from the sure side only."""
    if not math.isfinite(factor) or not factor > 0:
        return None
    n, boots = steps.size, len(picks)
    all_left, all_right = np.triu_indices(n, 1)
    dx = steps[all_right] - steps[all_left]
    valid = dx != 0  # the pairs with a slope, exactly as theil_sen computes it
    left, right = all_left[valid], all_right[valid]
    slopes = (values[right] - values[left]) / dx[valid]
    threshold = change - change / factor
    band = 1e-9 * (abs(change) + abs(threshold))  # 0 when the change is 0: then every sign below is exact
    # U of the pairs below t - band (strictly) by one matrix product; the pairs at or below t + band are those and
    # the few in the band (counted pair by pair, unless they are many: then a second product), and (with repeated
    # steps) every pair with a slope is all pairs less those without (issue 60: one product, not three)
    below = slopes < (threshold - band) / span
    counts = np.bincount((np.arange(boots)[:, None] * n + picks).ravel(), minlength=boots * n).reshape(boots, n)
    counts = counts.astype(_exact_dtype(n))
    upper = np.zeros((n, n), dtype=counts.dtype)
    upper[left[below], right[below]] = 1
    under = np.einsum("bi,bi->b", counts @ upper, counts).astype(np.float64)  # each replicate's slopes below
    upto = under + _pair_weights(counts, *_pairs(left, right, below ^ (slopes <= (threshold + band) / span)))
    every = (n * n - np.einsum("bi,bi->b", counts, counts, dtype=np.float64)) / 2  # pairs of distinct points
    total = every - _pair_weights(counts, *_pairs(all_left, all_right, ~valid)) if not valid.all() else every
    weights = (under, upto)
    low_middle, high_middle = (total - 1) // 2, total // 2
    finite = total > 0  # a replicate without a pair with a slope draws NaN, which the percentiles leave out
    kept = int(finite.sum())
    if kept == 0:
        return None
    surely_under = int((finite & (weights[0] > high_middle)).sum())  # draws surely below t - band
    possibly_upto = int((finite & (weights[1] > low_middle)).sum())  # draws possibly at or below t + band
    # and for the verdict of neither: draws possibly below t + band, surely at or below t - band; with a band, the
    # counts above bound them (the conservative side); without (t is 0), draws tied at t are common (a flat
    # series), and both are counted exactly from the same two selections
    possibly_under = int((finite & (weights[0] > low_middle)).sum()) if band == 0 else possibly_upto
    surely_upto = int((finite & (weights[1] > high_middle)).sum()) if band == 0 else surely_under
    # percentile positions (from 0) as numpy's interpolation places them, each bracketed by its two order statistics
    low_rank, high_rank = ((100 * (1 - CI) / 2) / 100 * (kept - 1), (100 * (1 + CI) / 2) / 100 * (kept - 1))
    if surely_under >= math.ceil(high_rank + 1e-6) + 1:  # the upper percentile's order statistics both below t
        return FELL
    if possibly_upto <= math.floor(low_rank - 1e-6):  # the lower percentile's both above t
        return ROSE
    if possibly_under <= math.floor(high_rank - 1e-6) and surely_upto >= math.ceil(low_rank + 1e-6) + 1:
        return NO_TREND  # the upper percentile's both at or above t, the lower one's both at or below it
    return None


def _pairs(left: np.ndarray, right: np.ndarray, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return left[chosen], right[chosen]


def _pair_weights(counts: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """(B,) each replicate's count of the pairs (left[k], right[k]): sum of c_i c_j, exact; pair by pair when
    they are few, else as one product over their upper-triangular indicator."""
    n = counts.shape[1]
    if left.size <= n:
        return np.einsum("bk,bk->b", counts[:, left], counts[:, right], dtype=np.float64)
    upper = np.zeros((n, n), dtype=counts.dtype)
    upper[left, right] = 1
    return np.einsum("bi,bi->b", counts @ upper, counts).astype(np.float64)


def _exact_dtype(n: int) -> type:
    """The dtype in which :func:`_verdict`'s counts of pairs of ``n`` resampled points are exact integers: float32
    (twice as fast in BLAS) while every partial sum stays below 2^24, else float64."""
    return np.float32 if n * n < 2 ** 24 else np.float64

def _rho_bucket(rho: float) -> float:
    """The lag-1 autocorrelation rounded down to 0.1, at most 0.9 (the simulation of :func:`detectable_change` is
    cached per value)."""
    return min(math.floor(max(rho, 0.0) * 10 + 1e-9), 9) / 10


def _fell(steps: np.ndarray, rows: np.ndarray, rng: np.random.Generator, n_boot: int = DETECT_BOOT) -> np.ndarray:
    """(R,) whether :func:`run_trend`'s test reads each row of ``rows`` (R, n), at ``steps`` (n,), as *fell*: the same
    Theil-Sen change, block length, moving-block bootstrap and widening, for many series at once."""
    n, span = steps.size, float(steps[-1] - steps[0])
    tiled = np.broadcast_to(steps, rows.shape)
    slopes = theil_sen(tiled, rows)
    intercepts = np.median(rows, axis=1) - slopes * np.median(steps)
    residuals = rows - (intercepts[:, None] + slopes[:, None] * steps)
    blocks = np.array([block_length(n, lag1(row, res)) for row, res in zip(rows, residuals, strict=True)])
    fell = np.zeros(len(rows), dtype=bool)
    for block in np.unique(blocks):
        which = np.flatnonzero(blocks == block)
        picks = block_indices(n, int(block), n_boot, rng)  # (n_boot, n), shared by the rows of this block length
        draws = theil_sen(steps[picks][None].repeat(len(which), 0).reshape(-1, n),
                          rows[which][:, picks].reshape(-1, n)).reshape(len(which), n_boot) * span
        changes = slopes[which] * span
        highs = np.nanpercentile(draws, 100 * (1 + CI) / 2, axis=1)
        fell[which] = changes + widening(n / block) * (highs - changes) < 0
    return fell


@functools.lru_cache(maxsize=256)
def detectable_change(steps: tuple[float, ...], rho: float) -> float:
    """The smallest linear fall over ``steps``, in units of the noise's standard deviation, that :func:`run_trend`
    reads as *fell* in at least :data:`POWER` of :data:`DETECT_SERIES` simulated series of stationary AR(1) noise
    with lag-1 autocorrelation ``rho`` (the test is scale-equivariant, so one unit-noise simulation serves every
    series of that shape). Bisection on the planted size with the same noise draws (seeded); NaN below
    :data:`MIN_POINTS` points. A fall and a rise of the same size are detected alike (the test is symmetric). A
    series longer than :data:`DETECT_POINTS` is simulated on that many of its steps, evenly spread (the cost grows
    as n^2 per bootstrap replicate): more points detect at least as small a change, so the figure is then an upper
    bound."""
    points = np.asarray(steps, dtype=np.float64)
    if points.size > DETECT_POINTS:
        points = points[np.linspace(0, points.size - 1, DETECT_POINTS).round().astype(int)]
    n = points.size
    if n < MIN_POINTS or points[0] == points[-1]:
        return float("nan")
    rng = np.random.default_rng(BOOT_SEED)
    shocks = rng.standard_normal((DETECT_SERIES, n + 50))
    noise = np.zeros_like(shocks)
    for t in range(1, shocks.shape[1]):
        noise[:, t] = rho * noise[:, t - 1] + shocks[:, t]
    noise = math.sqrt(1 - rho * rho) * noise[:, 50:] if rho > 0 else shocks[:, 50:]
    ramp = (points - points[0]) / (points[-1] - points[0])

    def power(size: float) -> float:
        return float(_fell(points, noise - size * ramp, np.random.default_rng(BOOT_SEED)).mean())

    low, high = 0.0, 1.0
    while power(high) < POWER:
        low, high = high, 2 * high
        if high > 1e4:
            return float("inf")
    for _ in range(6):  # to 1/64 of the bracket
        middle = (low + high) / 2
        low, high = (low, middle) if power(middle) >= POWER else (middle, high)
    return high


def detectable_mean_change(changes: np.ndarray) -> float:
    """The smallest mean change that an arm's t interval over runs whose changes spread like ``changes`` (k,) would
    exclude from 0 with :data:`POWER` probability: the noncentral-t power of the two-sided test at the level
    :data:`analysis.stats.verdicts.CI` (NaN with fewer than 2 runs or no spread)."""
    k = changes.size
    spread = float(np.std(changes, ddof=1)) if k > 1 else float("nan")
    if not spread > 0:
        return float("nan")
    return _detectable_shift(k) * spread / math.sqrt(k)


@functools.lru_cache(maxsize=64)
def _detectable_shift(k: int) -> float:
    """The noncentrality (mean change over its standard error) at which the two-sided t test of ``k`` runs has
    :data:`POWER`: it depends on ``k`` alone, so it is solved once per run count (a report asks for 264 arms')."""
    from scipy import optimize, stats

    critical = stats.t.ppf((1 + CI) / 2, k - 1)

    def shortfall(shift: float) -> float:  # power at noncentrality ``shift`` (mean change over its standard error)
        far = float(np.nan_to_num(stats.nct.cdf(-critical, k - 1, shift)))  # the wrong-sign tail: ~0, NaN far out
        return float(np.nan_to_num(stats.nct.sf(critical, k - 1, shift), nan=1.0)) + far - POWER

    return float(optimize.brentq(shortfall, 0.0, 3 * critical + 10))


def arm_trend(series: list[Trend]) -> Trend | None:
    """The trend of an arm of runs (each :func:`run_trend`'s); None without runs. One run: its own. Several: the mean
    of the runs' changes (relative when every run's is, else in the metric's units) with Student's t interval over
    the runs, which are independent whatever each series' autocorrelation."""
    from scipy import stats

    if len(series) <= 1:
        return series[0] if series else None
    relative = all(run.relative for run in series)
    values = np.array([run.value if relative else run.change for run in series])
    mean, sem = float(values.mean()), float(stats.sem(values))
    lo, hi = (mean, mean) if sem == 0 else stats.t.interval(CI, values.size - 1, loc=mean, scale=sem)
    return Trend(value=mean, lo=float(lo), hi=float(hi), relative=relative,
                 change=float(np.mean([run.change for run in series])), first=min(run.first for run in series),
                 last=max(run.last for run in series), runs=tuple(verdict for run in series for verdict in run.runs),
                 detectable=detectable_mean_change(values))


def trends(data: RunData, keys: tuple[str, ...], run_ids, n_boot: int = N_BOOT) -> dict[str, Trend]:
    """Each metric's arm trend (:func:`arm_trend`) over the runs ``run_ids`` (their histories in ``data``), keyed by
    metric; a metric no run logged on :data:`MIN_POINTS` steps is left out. Seeded per metric: the same runs read
    the same."""
    from threadpoolctl import threadpool_limits

    readings = {}
    wanted = sorted(set(run_ids))
    with threadpool_limits(1, user_api="blas"):  # one thread: the verdict's products (B x n x n) are too small
        # for BLAS threads to pay, and on a shared machine they wait for each other (3x slower at load 4, issue 60)
        for key in keys:
            readings.update(_key_trends(data, key, wanted, n_boot))
    return readings


def _key_trends(data: RunData, key: str, wanted: list[str], n_boot: int) -> dict[str, Trend]:
    """:func:`trends` of one metric (empty when no run logged it on :data:`MIN_POINTS` steps)."""
    logged = data.series(key)  # each run's (steps, values), found once per key (issue 60)
    rng = np.random.default_rng(BOOT_SEED)
    groups = [logged[run] for run in wanted if run in logged]  # by run id, as the runs were always read
    alone = len(groups) == 1  # one run: its own test, whose detectable change is simulated (arm_trend)
    # several: the arm's interval is over the runs' changes, and of each run only its verdict is shown
    series = [run for steps, values in groups
              if (run := run_trend(steps, values, n_boot, rng, detect=alone, interval=alone)) is not None]
    return {key: arm_trend(series)} if series else {}
