"""Correlations equal scipy's; bootstrap intervals are sane and reproducible."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr, spearmanr

from analysis.stats.correlations import (
    STAT_COLUMNS,
    correlate,
    diagnostic_correlations,
    rowwise_pearson,
    rowwise_spearman,
    rv_proxy_correlations,
)


def test_point_estimates_and_p_values_are_scipys():
    rng = np.random.default_rng(1)
    x = rng.normal(size=40)
    y = 0.5 * x + rng.normal(size=40)
    y[::7] = y[3]  # ties
    result = correlate(x, y, n_boot=200)
    assert result["n"] == 40
    assert result["spearman"] == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert result["spearman_p"] == pytest.approx(spearmanr(x, y).pvalue, rel=1e-9)
    assert result["pearson"] == pytest.approx(pearsonr(x, y).statistic, abs=1e-12)
    assert result["pearson_p"] == pytest.approx(pearsonr(x, y).pvalue, rel=1e-9)
    assert set(result) == set(STAT_COLUMNS)


def test_rowwise_coefficients_equal_scipy_row_by_row():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 5, size=(30, 12)).astype(float)  # many ties
    y = x + rng.normal(size=(30, 12))
    x[0] = 1.0  # a constant row: undefined
    spearman, pearson = rowwise_spearman(x, y), rowwise_pearson(x, y)
    assert np.isnan(spearman[0]) and np.isnan(pearson[0])
    for row in range(1, 30):
        assert spearman[row] == pytest.approx(spearmanr(x[row], y[row]).statistic, abs=1e-12)
        assert pearson[row] == pytest.approx(pearsonr(x[row], y[row]).statistic, abs=1e-12)


def test_bootstrap_interval_brackets_the_estimate_and_is_reproducible():
    rng = np.random.default_rng(3)
    x = rng.normal(size=60)
    y = 0.6 * x + rng.normal(scale=0.8, size=60)
    first = correlate(x, y, n_boot=500, seed=7)
    again = correlate(x, y, n_boot=500, seed=7)
    assert first == again
    for name in ("spearman", "pearson"):
        assert first[f"{name}_lo"] < first[name] < first[f"{name}_hi"]
        assert first[f"{name}_hi"] - first[f"{name}_lo"] < 0.6
    wider = correlate(x, y, n_boot=500, seed=7, ci=0.99)
    assert wider["pearson_lo"] <= first["pearson_lo"] and wider["pearson_hi"] >= first["pearson_hi"]


def test_perfect_monotone_relation_and_degenerate_inputs():
    x = np.arange(10.0)
    result = correlate(x, x**3, n_boot=100)
    assert result["spearman"] == pytest.approx(1.0) and result["spearman_lo"] == pytest.approx(1.0)
    assert result["pearson"] < 1.0
    assert np.isnan(correlate([1.0, 2.0], [3.0, 4.0])["spearman"])  # too few points
    assert np.isnan(correlate(np.ones(5), np.arange(5.0))["pearson"])  # constant input
    with_nan = correlate([1.0, 2.0, np.nan, 4.0, 5.0], [2.0, 1.0, 3.0, 5.0, 4.0], n_boot=0)
    assert with_nan["n"] == 4 and np.isnan(with_nan["spearman_lo"])


def test_cluster_bootstrap_resamples_whole_groups():
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(8), [3, 5, 4, 6, 2, 5, 3, 4])  # unequal sizes: the per-resample path
    x = rng.normal(size=groups.size) + groups
    y = x + rng.normal(size=groups.size)
    clustered = correlate(x, y, groups=groups, n_boot=300)
    plain = correlate(x, y, n_boot=300)
    assert clustered["spearman"] == plain["spearman"]
    assert clustered["spearman_lo"] <= clustered["spearman"] <= clustered["spearman_hi"]
    equal = correlate(x[:32], y[:32], groups=np.repeat(np.arange(8), 4), n_boot=300)  # the vectorised path
    assert equal["pearson_lo"] <= equal["pearson"] <= equal["pearson_hi"]


def test_diagnostic_correlations_frame():
    diagnostics = pd.DataFrame(
        {"collapse/trajectory/mi_zscore_ema": [1.0, 2.0, 3.0, 4.0, 5.0], "actor/entropy": [5.0, 3.0, 4.0, 1.0, 2.0]},
        index=pd.Index(list("abcde"), name="run_id"),
    )
    performance = pd.DataFrame(
        {"run_id": list("edcba"), "final_success": [50.0, 40.0, 30.0, 20.0, 10.0], "peak_success": [5, 4, 3, 2, 1.0]}
    )
    table = diagnostic_correlations(diagnostics, performance, n_boot=100)
    assert list(table.columns) == ["diagnostic", "family", "target", *STAT_COLUMNS]
    assert len(table) == 4
    mi = table[(table["diagnostic"] == "collapse/trajectory/mi_zscore_ema") & (table["target"] == "final_success")]
    assert mi["family"].item() == "MI" and mi["spearman"].item() == pytest.approx(1.0)
    entropy = table[(table["diagnostic"] == "actor/entropy") & (table["target"] == "peak_success")]
    assert entropy["family"].item() == "entropy"
    assert entropy["spearman"].item() == pytest.approx(spearmanr([5, 3, 4, 1, 2], [1, 2, 3, 4, 5]).statistic)


def test_rv_proxy_correlations_on_the_demo_sweep(demo_data):
    table = rv_proxy_correlations(demo_data, n_boot=100)
    # the demo logs RV, reward mean, response length and trajectory MI-Est at shared steps
    assert set(table["proxy"]) == {"rollout/reward_mean", "response_length/mean", "collapse/trajectory/mi_est"}
    length = table[table["proxy"] == "response_length/mean"].iloc[0]
    assert length["runs"] == 16 and length["n"] == 16 * 60
    assert length["spearman"] == pytest.approx(1.0)  # both fall linearly with the step


def _grouped_fixture(seed: int):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(12), [3, 5, 4, 6, 2, 5, 3, 4, 7, 1, 5, 4])  # unequal sizes, a single-value group
    x = rng.normal(size=groups.size) + groups % 3
    y = 0.5 * x + rng.normal(size=groups.size)
    x[::4] = np.round(x[::4])  # ties within and across groups
    y[groups == 1] = 2.0  # a constant group: resamples of it alone are flat
    return x, y, groups


def test_grouped_bootstrap_equals_the_concatenated_resamples():
    """The grouped bootstrap's coefficients (from group counts: sums of the groups, weighted ranks) are those of
    each concatenated resample, ranked and correlated as rowwise_spearman/pearson do: the same draws, to rounding."""
    from analysis.stats.correlations import _bootstrap_concatenated, _bootstrap_groups

    for seed in range(3):
        x, y, groups = _grouped_fixture(seed)
        fast, slow = _bootstrap_groups(x, y, groups, 400, seed), _bootstrap_concatenated(x, y, groups, 400, seed)
        assert (np.isnan(fast) == np.isnan(slow)).all()
        assert np.nanmax(np.abs(fast - slow)) < 1e-12
        single = _bootstrap_concatenated(x, y, None, 400, seed)  # pairs resampled one by one: groups of one pair
        paired = _bootstrap_groups(x, y, np.arange(x.size), 400, seed)
        assert (np.isnan(paired) == np.isnan(single)).all() and np.nanmax(np.abs(paired - single)) < 1e-12
    x, y, groups = _grouped_fixture(0)  # and a resample of one group picked every time is flat: NaN in both
    assert np.isnan(_bootstrap_groups(x[groups == 1], y[groups == 1], groups[groups == 1], 5, 0)).all()


def test_leave_one_group_out_equals_scipy_per_group():
    """The closed-form jackknife's coefficients are scipy's on the pairs left when each group is left out; NaN where
    scipy's would be undefined (fewer than 3 pairs left, or one side constant)."""
    from analysis.stats.correlations import leave_one_group_out

    for seed in range(3):
        x, y, groups = _grouped_fixture(seed)
        groups = np.asarray([f"run-{g:02d}" for g in groups])  # run ids: np.unique order
        for coefficient, scipy_call in (("pearson", pearsonr), ("spearman", spearmanr)):
            fast = leave_one_group_out(x, y, groups, coefficient)
            slow = [scipy_call(x[groups != g], y[groups != g]).statistic for g in np.unique(groups)]
            assert fast == pytest.approx(slow, abs=1e-12)
    x = np.r_[np.ones(6), 0.0, 5.0]  # leaving out the group of the two distinct values leaves x constant
    y = np.arange(8.0)
    groups = np.r_[0, 0, 1, 1, 2, 2, 3, 3]
    assert np.isnan(leave_one_group_out(x, y, groups, "spearman")).tolist() == [False, False, False, True]
    assert np.isnan(leave_one_group_out(x[:4], y[:4], groups[:4])).all()  # 2 pairs left: too few
