"""Spearman and Pearson correlations with bootstrap confidence intervals.

Point estimates and p-values are scipy's (``scipy.stats.spearmanr`` / ``pearsonr``). Confidence intervals are
percentile bootstrap intervals: resample the observations with replacement ``n_boot`` times (or, with ``groups``,
resample whole groups -- e.g. runs, when one run contributes many steps -- and keep all their observations), compute
both coefficients on each resample, and take the ``(1 - ci) / 2`` and ``(1 + ci) / 2`` quantiles. Resamples on which
a coefficient is undefined (a constant column) are left out. Fewer than :data:`MIN_N` paired observations give NaN.

Frames returned here share the columns :data:`STAT_COLUMNS`:

    n (paired observations), spearman, spearman_lo, spearman_hi, spearman_p, pearson, pearson_lo, pearson_hi, pearson_p
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis import names

if TYPE_CHECKING:
    import pandas as pd

    from analysis.stores.mlflow_store import RunData

MIN_N = 3
STAT_COLUMNS = (
    "n",
    "spearman",
    "spearman_lo",
    "spearman_hi",
    "spearman_p",
    "pearson",
    "pearson_lo",
    "pearson_hi",
    "pearson_p",
)
TARGETS = {"final_success": "final validation success", "peak_success": "peak validation success"}


BOOT_CELLS = 2_000_000  # resampled values held at once by the vectorised bootstrap (some 16 MB per array)
GROUP_ROWS = 4  # groups left out at once by the closed-form jackknife ((4, n) arrays: in cache)
RANK_CELLS = 100_000  # resampled values ranked at once by the grouped bootstrap (0.4 MB int32 arrays stay in L2
# cache: 0.7 CPU s a Table-4 proxy against 1.2 s at 400,000 values)


def rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row pair of two (B, n) arrays; NaN where a row is constant."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    denominator = np.sqrt((xc * xc).sum(axis=1) * (yc * yc).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (xc * yc).sum(axis=1) / denominator
    r[(np.ptp(x, axis=1) == 0) | (np.ptp(y, axis=1) == 0)] = np.nan
    return np.clip(r, -1.0, 1.0)


def rowwise_spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row pair of two (B, n) arrays (average ranks for ties); NaN where a row is constant."""
    from scipy.stats import rankdata

    return rowwise_pearson(rankdata(x, axis=1), rankdata(y, axis=1))


def _resample_indices(n: int, groups: np.ndarray | None, n_boot: int, rng: np.random.Generator) -> list[np.ndarray]:
    if groups is None:
        return list(rng.integers(0, n, size=(n_boot, n)))
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    picks = rng.integers(0, len(members), size=(n_boot, len(members)))
    return [np.concatenate([members[i] for i in row]) for row in picks]


def _group_counts(groups: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The resamples of :func:`_resample_indices` (the same draws) as counts: (n_boot, groups) times each group is
    picked, and each value's group."""
    labels, member_of = np.unique(groups, return_inverse=True)
    size = len(labels)
    picks = rng.integers(0, size, size=(n_boot, size))
    counts = np.bincount((np.arange(n_boot)[:, None] * size + picks).ravel(), minlength=n_boot * size)
    return counts.reshape(n_boot, size).astype(np.float64), member_of.reshape(-1)


EXACT = 2.0 ** 53  # float64 holds every integer below this: sums of rank products below it are exact


def _flat_rows(values: np.ndarray, member_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(B,) whether the values of the groups each resample picked (``counts``: (B, groups)) are all equal, from
    each group's least and largest value. Ranks are equal exactly where the values are, so it serves both
    coefficients."""
    least, most = _group_extremes(values, member_of, counts.shape[1])
    picked = counts > 0
    return np.where(picked, least, np.inf).min(axis=1) == np.where(picked, most, -np.inf).max(axis=1)


def _group_extremes(values: np.ndarray, member_of: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each group's least and largest value (``member_of``: each value's group, 0..size-1; a group without a value:
    inf and -inf)."""
    least, most = np.full(size, np.inf), np.full(size, -np.inf)
    if values.size:
        order = np.argsort(member_of, kind="stable")
        grouped = member_of[order]
        starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
        least[grouped[starts]] = np.minimum.reduceat(values[order], starts)
        most[grouped[starts]] = np.maximum.reduceat(values[order], starts)
    return least, most


def _pearson_from_sums(total: np.ndarray, sx: np.ndarray, sy: np.ndarray, sxx: np.ndarray, syy: np.ndarray,
                       sxy: np.ndarray) -> np.ndarray:
    """Pearson's r from a sample's count and its sums of x, y, x^2, y^2 and xy (arrays alike)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = sxy - sx * sy / total
        r = cov / np.sqrt((sxx - sx * sx / total) * (syy - sy * sy / total))
    return np.clip(r, -1.0, 1.0)


def _group_pearson(x: np.ndarray, y: np.ndarray, member_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(B,) Pearson's r of each resample that takes group g ``counts[b, g]`` times, from the groups' sums of the
    values centred on their overall means (O(B groups) rather than O(B values); equal to the coefficient of the
    concatenated resample to rounding, some 1e-15)."""
    xc, yc = x - x.mean(), y - y.mean()
    size = counts.shape[1]
    sums = np.stack([np.bincount(member_of, weights=w, minlength=size)
                     for w in (np.ones_like(xc), xc, yc, xc * xc, yc * yc, xc * yc)], axis=1)
    per_resample = counts @ sums  # (B, 6)
    total, sx, sy, sxx, syy, sxy = per_resample.T
    return _pearson_from_sums(total, sx, sy, sxx, syy, sxy)


class _Ranks:
    """Average ranks (ties averaged, as ``rankdata``) of ``values`` in resamples that take value i as often as its
    group (``member_of[i]``) is picked: a value whose ties weigh W in all, above C of smaller weight, ranks
    C + (W + 1) / 2. Ranks are kept doubled, ``C_first + C_last + 1`` from the running sums of the weights along the
    sorted values (before a tie's first, through its last): integers, so every sum of their products below
    :data:`EXACT` is exact."""

    def __init__(self, values: np.ndarray, member_of: np.ndarray) -> None:
        self.order = np.argsort(values, kind="stable")
        ordered = values[self.order]
        self.groups = member_of[self.order]  # each sorted value's group
        new_value = np.r_[True, ordered[1:] != ordered[:-1]]
        starts = np.flatnonzero(new_value)
        ends = np.r_[starts[1:], values.size] - 1
        tie = np.cumsum(new_value) - 1  # each sorted value's tie (distinct value)
        self.tied = np.flatnonzero(starts[tie] != ends[tie])  # the sorted values with a tie
        self.first, self.last = starts[tie][self.tied], ends[tie][self.tied]

    def doubled(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, n) each sorted value's weight in each resample (``counts``: (B, groups) integers) and its doubled
        rank there."""
        w = np.take(counts, self.groups, axis=1)
        through = np.cumsum(w, axis=1, dtype=counts.dtype)
        doubled = 2 * through - w + 1  # an untied value's: C + (C + w) + 1
        if self.tied.size:
            doubled[:, self.tied] = (np.take(through, self.first, axis=1) - np.take(w, self.first, axis=1)
                                     + np.take(through, self.last, axis=1) + 1)
        return w, doubled


def _group_spearman(counts: np.ndarray, rank_x: _Ranks, rank_y: _Ranks, y_in_x_order: np.ndarray) -> np.ndarray:
    """(B,) Spearman's rho of each resample that takes group g ``counts[b, g]`` times (integers): the Pearson's r
    of the resample's average ranks, each value counted as often as its group is, from exact sums of the doubled
    ranks (``y_in_x_order``: the position in y's order of each value in x's)."""
    weight_x, doubled_x = rank_x.doubled(counts)
    weight_y, doubled_y = rank_y.doubled(counts)
    exact = {"dtype": np.float64, "casting": "safe"}
    products = np.einsum("bi,bi,bi->b", weight_x, doubled_x, np.take(doubled_y, y_in_x_order, axis=1),
                         **exact)
    square_x = np.einsum("bi,bi,bi->b", weight_x, doubled_x, doubled_x, **exact)
    square_y = np.einsum("bi,bi,bi->b", weight_y, doubled_y, doubled_y, **exact)
    total = weight_x.sum(axis=1, dtype=np.float64)
    doubled_sum = total * (total + 1)  # the doubled ranks' sum, 2 W (W + 1) / 2
    return _pearson_from_sums(total, doubled_sum, doubled_sum, square_x, square_y, products)


def _bootstrap_groups(x: np.ndarray, y: np.ndarray, groups: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """:func:`_bootstrap` with whole groups resampled, computed from each resample's group counts rather than from
    the concatenated resample: the same draws, the same statistics to rounding (some 1e-15), without concatenating
    or sorting any resample. Pearson's r from the groups' sums (O(B groups)); Spearman's rho from the weighted
    ranks (O(B n), sums exact: a Table-4 sweep's 52,000 (run, step) pairs x 1000 resamples took minutes and 2.4 GB
    concatenated, 3 s as weighted ranks in float64 arrays, issue 60)."""
    counts, member_of = _group_counts(groups, n_boot, np.random.default_rng(seed))
    flat = _flat_rows(x, member_of, counts) | _flat_rows(y, member_of, counts)
    largest = float((counts @ np.bincount(member_of, minlength=counts.shape[1])).max(initial=0))  # values drawn
    if 4 * (largest + 1) ** 3 >= EXACT:  # a resample too large for exact rank sums: the concatenated way
        return _bootstrap_concatenated(x, y, groups, n_boot, seed)
    rank_x, rank_y = _Ranks(x, member_of), _Ranks(y, member_of)
    y_in_x_order = np.argsort(rank_y.order, kind="stable")[rank_x.order]
    whole = counts.astype(np.int32)
    step = max(1, RANK_CELLS // max(x.size, 1))
    spearman = np.concatenate([_group_spearman(whole[start:start + step], rank_x, rank_y, y_in_x_order)
                               for start in range(0, n_boot, step)])
    out = np.column_stack([spearman, _group_pearson(x, y, member_of, counts)])
    out[flat] = np.nan
    return out


def _bootstrap(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, 2) array of (spearman, pearson) over resamples: with ``groups``, whole groups resampled; without,
    single pairs, which is resampling groups of one pair each (the same draws: :func:`_group_counts` of
    ``0..n-1`` draws as :func:`_resample_indices` does), so both go the counts' way (:func:`_bootstrap_groups`)."""
    return _bootstrap_groups(x, y, np.arange(x.size) if groups is None else groups, n_boot, seed)


def _bootstrap_concatenated(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None, n_boot: int,
                            seed: int) -> np.ndarray:
    """(n_boot, 2) (spearman, pearson) of each resample, concatenated and ranked (the definition)."""
    indices = _resample_indices(x.size, groups, n_boot, np.random.default_rng(seed))
    if len({idx.size for idx in indices}) == 1:  # equal sizes (always without groups): vectorised, in slices of
        # about BOOT_CELLS values (a Table-4 sweep's 52,000 (run, step) pairs x 1000 resamples took 2.4 GB at once)
        step = max(1, BOOT_CELLS // max(indices[0].size, 1))
        parts = []
        for start in range(0, len(indices), step):
            stacked = np.stack(indices[start:start + step])
            parts.append(np.column_stack([rowwise_spearman(x[stacked], y[stacked]),
                                          rowwise_pearson(x[stacked], y[stacked])]))
        return np.concatenate(parts)
    out = np.empty((n_boot, 2))
    for b, idx in enumerate(indices):
        out[b] = rowwise_spearman(x[idx][None], y[idx][None])[0], rowwise_pearson(x[idx][None], y[idx][None])[0]
    return out


def correlate(
    x: Any,
    y: Any,
    *,
    groups: Any | None = None,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Spearman and Pearson correlation of paired samples with bootstrap CIs (pairs with a NaN are dropped).

    Returns a dict with the keys :data:`STAT_COLUMNS`.
    """
    from scipy.stats import pearsonr, spearmanr

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    groups = None if groups is None else np.asarray(groups)[keep]
    result = dict.fromkeys(STAT_COLUMNS, math.nan)
    result["n"] = int(x.size)
    if x.size < MIN_N or np.ptp(x) == 0 or np.ptp(y) == 0:
        return result
    spearman, pearson = spearmanr(x, y), pearsonr(x, y)
    result.update(
        spearman=float(spearman.statistic),
        spearman_p=float(spearman.pvalue),
        pearson=float(pearson.statistic),
        pearson_p=float(pearson.pvalue),
    )
    if n_boot > 0:
        boot = _bootstrap(x, y, groups, n_boot, seed)
        tails = [100 * (1 - ci) / 2, 100 * (1 + ci) / 2]
        for column, name in enumerate(("spearman", "pearson")):
            values = boot[:, column][np.isfinite(boot[:, column])]
            if values.size:
                result[f"{name}_lo"], result[f"{name}_hi"] = (float(v) for v in np.percentile(values, tails))
    return result


def diagnostic_correlations(
    diagnostics: pd.DataFrame,
    performance: pd.DataFrame,
    *,
    families: dict[str, str] | None = None,
    targets: tuple[str, ...] = tuple(TARGETS),
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Correlate each diagnostic with task performance across runs.

    Args:
        diagnostics: run x diagnostic frame (index run_id), e.g. :func:`analysis.stats.summary.metric_summary`.
        performance: run-level frame with ``run_id`` and the ``targets`` columns (e.g. :func:`analysis.stats.summary.summarize`).
        families: diagnostic -> family (default :data:`analysis.names.DIAGNOSTIC_FAMILIES`).

    Returns one row per (diagnostic, target): diagnostic, family, target, then :data:`STAT_COLUMNS`.
    """
    import pandas as pd

    families = names.DIAGNOSTIC_FAMILIES if families is None else families
    joined = diagnostics.join(performance.set_index("run_id")[list(targets)], how="inner")
    rows = []
    for diagnostic in diagnostics.columns:
        for target in targets:
            stats = correlate(joined[diagnostic], joined[target], n_boot=n_boot, ci=ci, seed=seed)
            rows.append({"diagnostic": diagnostic, "family": families.get(diagnostic, "other"), "target": target, **stats})
    return pd.DataFrame(rows, columns=["diagnostic", "family", "target", *STAT_COLUMNS])


def rv_proxy_pairs(data: RunData, proxy: str, rv_key: str = names.RV_STD_MEAN) -> pd.DataFrame:
    """The (run, step) pairs where both reward variance and ``proxy`` were logged: run_id, step, rv, value."""
    rv = data.history(rv_key).rename(columns={"value": "rv"})
    return rv.merge(data.history(proxy), on=["run_id", "step"], how="inner")


def rv_proxy_correlations(
    data: RunData,
    *,
    rv_key: str = names.RV_STD_MEAN,
    proxies: tuple[str, ...] = names.RV_PROXIES,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Correlate reward variance with candidate proxies over (run, step) pairs where both were logged; the
    bootstrap resamples whole runs (steps of one run are not independent).

    Returns one row per proxy logged by any run: proxy, runs, then :data:`STAT_COLUMNS`.
    """
    import pandas as pd

    rows = []
    for proxy in proxies:
        paired = rv_proxy_pairs(data, proxy, rv_key)
        if paired.empty:
            continue
        stats = correlate(paired["value"], paired["rv"], groups=paired["run_id"], n_boot=n_boot, ci=ci, seed=seed)
        rows.append({"proxy": proxy, "runs": int(paired["run_id"].nunique()), **stats})
    return pd.DataFrame(rows, columns=["proxy", "runs", *STAT_COLUMNS])


def leave_one_group_out(x: Any, y: Any, groups: Any, coefficient: str = "pearson") -> np.ndarray:
    """The coefficient (``coefficient``: "pearson" or "spearman") of the pairs ``x``, ``y`` left when each group
    (in ``np.unique`` order) is left out, NaN where fewer than :data:`MIN_N` pairs are left or either side left is
    constant: what one ``scipy.stats.pearsonr`` / ``spearmanr`` per left-out group gives, to rounding, from sums over
    the groups (Pearson: the groups' sums of the centred values; Spearman: the ranks without a group are the ranks
    less the count of that group's values below, ties halved, and every sum of doubled ranks is exact). The judge's
    delete-one-run jackknife (:func:`analysis.stats.verdicts.correlation_interval`) took one scipy call per run."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    labels, member_of = np.unique(np.asarray(groups), return_inverse=True)
    member_of = member_of.reshape(-1)
    size = labels.size
    sizes = np.bincount(member_of, minlength=size).astype(np.float64)
    left = x.size - sizes
    constant = np.zeros(size, dtype=bool)
    for values in (x, y):  # the values left all equal: from the other groups' least and largest
        least, most = _group_extremes(values, member_of, size)
        constant |= _others(least, np.minimum, np.inf) == _others(most, np.maximum, -np.inf)
    undefined = (left < MIN_N) | constant
    if coefficient == "pearson":
        xc, yc = x - x.mean(), y - y.mean()
        sums = [np.bincount(member_of, weights=w, minlength=size) for w in (xc, yc, xc * xc, yc * yc, xc * yc)]
        totals = [float(part.sum()) for part in sums]
        r = _pearson_from_sums(left, *(total - part for total, part in zip(totals, sums, strict=True)))
    else:
        from scipy.stats import rankdata

        if 4 * (x.size + 1) ** 3 >= EXACT:  # too many pairs for exact rank sums: one scipy call per group
            from scipy.stats import spearmanr

            r = np.array([float(spearmanr(x[member_of != g], y[member_of != g]).statistic) if not undefined[g]
                          else np.nan for g in range(size)])
            r[undefined] = np.nan
            return r
        doubled_x, doubled_y = 2 * rankdata(x), 2 * rankdata(y)  # integers
        shift_x, shift_y = _RankShift(x, member_of), _RankShift(y, member_of)
        sums = np.empty((5, size))
        for start in range(0, size, GROUP_ROWS):  # a few groups at a time: (groups, n) arrays stay small
            chunk = np.arange(start, min(start + GROUP_ROWS, size))
            outside = member_of[None, :] != chunk[:, None]
            kept_x = (doubled_x - shift_x.of(chunk)) * outside  # each pair's doubled rank without the group
            kept_y = (doubled_y - shift_y.of(chunk)) * outside
            sums[:, chunk] = [kept_x.sum(axis=1), kept_y.sum(axis=1), np.einsum("gi,gi->g", kept_x, kept_x),
                              np.einsum("gi,gi->g", kept_y, kept_y), np.einsum("gi,gi->g", kept_x, kept_y)]
        r = _pearson_from_sums(left, *sums)
    r[undefined] = np.nan
    return r


def _others(per_group: np.ndarray, reduce: Any, identity: float) -> np.ndarray:
    """Per group, ``reduce`` (np.minimum or np.maximum) of every other group's value."""
    before = reduce.accumulate(np.r_[identity, per_group[:-1]])
    after = reduce.accumulate(np.r_[per_group[1:], identity][::-1])[::-1]
    return reduce(before, after)


class _RankShift:
    """How much leaving a group out lowers each value's doubled average rank: twice the number of the group's
    values below it, plus the number equal to it (``of``: (groups, n) for some groups, in the values' order)."""

    def __init__(self, values: np.ndarray, member_of: np.ndarray) -> None:
        order = np.argsort(values, kind="stable")
        ordered = values[order]
        new_value = np.r_[True, ordered[1:] != ordered[:-1]]
        starts = np.flatnonzero(new_value)
        tie = np.cumsum(new_value) - 1
        self.before, self.through = starts[tie], np.r_[starts[1:], values.size][tie]  # per sorted value
        self.sorted_groups = member_of[order]
        self.position = np.argsort(order, kind="stable")  # each value's place in the sorted order

    def of(self, groups: np.ndarray) -> np.ndarray:
        running = np.zeros((groups.size, self.sorted_groups.size + 1))
        np.cumsum(self.sorted_groups[None, :] == groups[:, None], axis=1, out=running[:, 1:])
        shift = np.take(running, self.before, axis=1) + np.take(running, self.through, axis=1)
        return np.take(shift, self.position, axis=1)
