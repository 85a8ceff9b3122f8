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
from collections.abc import Callable
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
    picks = rng.integers(0, len(labels), size=(n_boot, len(labels)))
    counts = np.zeros((n_boot, len(labels)))
    np.add.at(counts, (np.arange(n_boot)[:, None], picks), 1.0)
    return counts, member_of.reshape(-1)


def _weighted_pearson(x: np.ndarray, y: np.ndarray, w: np.ndarray, flat: np.ndarray | None = None) -> np.ndarray:
    """Pearson's r of each row of (B, n) values with (B, n) weights (a value counted w times); NaN where a row's
    values with weight are all equal (``flat``: (B,) those rows, when the caller knows them; else found here)."""
    total = w.sum(axis=1, keepdims=True)
    xc = x - (w * x).sum(axis=1, keepdims=True) / total
    yc = y - (w * y).sum(axis=1, keepdims=True) / total
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (w * xc * yc).sum(axis=1) / np.sqrt((w * xc * xc).sum(axis=1) * (w * yc * yc).sum(axis=1))
    if flat is None:
        used = w > 0
        flat = np.zeros(len(r), dtype=bool)
        for values in (x, y):
            flat |= np.where(used, values, np.inf).min(axis=1) == np.where(used, values, -np.inf).max(axis=1)
    r[flat] = np.nan
    return np.clip(r, -1.0, 1.0)


def _flat_rows(values: np.ndarray, member_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(B,) whether the values of the groups each resample picked (``counts``: (B, groups)) are all equal, from
    each group's least and largest value: what :func:`_weighted_pearson` finds over the (B, n) values, on (B,
    groups). Ranks are equal exactly where the values are, so it serves both coefficients."""
    size = counts.shape[1]
    least, most = np.full(size, np.inf), np.full(size, -np.inf)
    np.minimum.at(least, member_of, values)
    np.maximum.at(most, member_of, values)
    picked = counts > 0
    return np.where(picked, least, np.inf).min(axis=1) == np.where(picked, most, -np.inf).max(axis=1)


def _ranker(values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """Average ranks (ties averaged, as `rankdata`) of `values` in each row's resample, where value i is there
    w[b, i] times: a distinct value holding total weight W above C of smaller values ranks C + (W + 1) / 2."""
    from scipy import sparse

    distinct, which = np.unique(values, return_inverse=True)
    which = which.reshape(-1)
    indicator = sparse.csr_matrix((np.ones(values.size), (which, np.arange(values.size))),
                                  shape=(distinct.size, values.size))

    def ranks(w: np.ndarray) -> np.ndarray:
        per_value = np.asarray((indicator @ w.T).T)  # (B, distinct values) weight of each
        rank = np.cumsum(per_value, axis=1) - per_value + (per_value + 1) / 2
        return rank[:, which]

    return ranks


def _bootstrap_groups(x: np.ndarray, y: np.ndarray, groups: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """:func:`_bootstrap` with whole groups resampled, computed from each resample's group counts (weighted ranks
    and weighted Pearson) rather than from the concatenated resample: the same statistics of the same draws, without
    sorting every resample (a Table-4 sweep's 52,000 (run, step) pairs x 1000 resamples took minutes and 2.4 GB)."""
    counts, member_of = _group_counts(groups, n_boot, np.random.default_rng(seed))
    rank_x, rank_y = _ranker(x), _ranker(y)
    step = max(1, BOOT_CELLS // max(x.size, 1))
    parts = []
    for start in range(0, n_boot, step):
        chunk = counts[start:start + step]
        w = chunk[:, member_of]
        xs, ys = np.broadcast_to(x, w.shape), np.broadcast_to(y, w.shape)
        flat = _flat_rows(x, member_of, chunk) | _flat_rows(y, member_of, chunk)  # found once, on the groups
        parts.append(np.column_stack([_weighted_pearson(rank_x(w), rank_y(w), w, flat),
                                      _weighted_pearson(xs, ys, w, flat)]))
    return np.concatenate(parts)


def _bootstrap(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, 2) array of (spearman, pearson) over resamples."""
    if groups is not None:
        return _bootstrap_groups(x, y, groups, n_boot, seed)
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
