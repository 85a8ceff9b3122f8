"""MI proxy family: formulas of RAGEN-2 (arXiv 2604.06268) on constructed score matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import logsumexp

from recipes.stats.mi import ZScoreEMA, mi_proxies, retrieval_excess


def balanced_columns(num_samples: int, num_columns: int) -> np.ndarray:
    return np.arange(num_samples) % num_columns


def diagonal_scores(column: np.ndarray, num_columns: int, gap: float) -> np.ndarray:
    """Log-probs that are 0 under the true column and -gap elsewhere."""
    return np.where(np.eye(num_columns, dtype=bool)[column], 0.0, -gap)


def test_input_agnostic_policy_sits_at_collapse_values():
    rng = np.random.default_rng(0)
    column = balanced_columns(64, 8)
    row_values = rng.normal(-2.0, 0.5, size=(64, 1))
    L = np.repeat(row_values, 8, axis=1)  # every column scores a sample the same: identical rows
    proxies = mi_proxies(L, L * 30, column)
    assert proxies.mi_est == pytest.approx(0.0, abs=1e-12)
    assert proxies.mi_seq_est == pytest.approx(0.0, abs=1e-9)
    assert proxies.mi_zscore == pytest.approx(0.0, abs=1e-9)
    assert proxies.retrieval_chance == pytest.approx(1 / 8)
    assert proxies.retrieval_acc == pytest.approx(1 / 8)  # ties broken uniformly at random -> chance exactly
    assert proxies.recall_at[2] == pytest.approx(2 / 8)
    assert proxies.recall_at[4] == pytest.approx(4 / 8)
    assert proxies.recall_at[8] == pytest.approx(1.0)
    assert proxies.conditional_entropy == pytest.approx(proxies.reasoning_entropy)


def test_strongly_diagonal_scores_reach_perfect_retrieval_and_log_n():
    column = balanced_columns(64, 64)
    L = diagonal_scores(column, 64, gap=50.0)
    proxies = mi_proxies(L, 20 * L, column)
    assert proxies.retrieval_acc == 1.0
    assert proxies.retrieval_chance == pytest.approx(1 / 64)
    assert proxies.recall_chance_at == {2: pytest.approx(2 / 64), 4: pytest.approx(4 / 64), 8: pytest.approx(8 / 64)}
    assert proxies.mi_est == pytest.approx(math.log(64), abs=1e-6)
    assert proxies.mi_seq_est == pytest.approx(math.log(64), abs=1e-6)
    assert proxies.conditional_entropy == pytest.approx(0.0)
    assert proxies.reasoning_entropy == pytest.approx(math.log(64), abs=1e-6)


def test_formulas_against_direct_computation():
    rng = np.random.default_rng(1)
    M, N = 24, 6
    column = rng.integers(0, N, size=M)
    L = rng.normal(-3.0, 1.0, size=(M, N))
    L_sum = L * rng.integers(5, 40, size=(M, 1))
    proxies = mi_proxies(L, L_sum, column)
    matched = L[np.arange(M), column]
    marginal = logsumexp(L, axis=1) - np.log(N)
    assert proxies.mi_est == pytest.approx(matched.mean() - marginal.mean())
    assert proxies.mi_zscore == pytest.approx(np.mean(matched - marginal) / (np.std(marginal) + 1e-3))
    matched_s = L_sum[np.arange(M), column]
    marginal_s = logsumexp(L_sum, axis=1) - np.log(N)
    assert proxies.mi_seq_est == pytest.approx(matched_s.mean() - marginal_s.mean())
    assert proxies.mi_seq_zscore == pytest.approx(np.mean(matched_s - marginal_s) / (np.std(marginal_s) + 1e-3))
    assert proxies.conditional_entropy == pytest.approx(-matched.mean())
    assert proxies.reasoning_entropy_seq == pytest.approx(-marginal_s.mean())
    argmax_hits = np.argmax(L, axis=1) == column  # no ties in continuous random scores
    assert proxies.retrieval_acc == pytest.approx(argmax_hits.mean())
    top2 = np.argsort(-L, axis=1)[:, :2]
    assert proxies.recall_at[2] == pytest.approx(np.mean([column[i] in top2[i] for i in range(M)]))
    assert proxies.recall_at[8] == 1.0  # k = 8 is evaluated at N = 6: every column is in the top 6


def test_recall_k_is_capped_at_number_of_columns_but_keeps_its_name():
    column = balanced_columns(6, 3)
    L = np.repeat(np.arange(3.0)[None, :], 6, axis=0)  # column 2 always wins
    proxies = mi_proxies(L, L, column)
    assert set(proxies.recall_at) == {2, 4, 8}
    assert proxies.recall_at[2] == pytest.approx(4 / 6)  # columns 2 and 1 retrieved
    assert proxies.recall_at[4] == proxies.recall_at[8] == 1.0
    assert proxies.recall_chance_at[4] == proxies.recall_chance_at[8] == 1.0


def test_equivalent_columns_count_as_correct_and_raise_chance():
    # columns 0 and 1 hold identical prompt tokens; samples of column 0 that retrieve column 1 are still right
    column = np.array([0, 1, 2, 3])
    L = np.array(
        [
            [-2.0, -1.0, -5.0, -5.0],  # from column 0, best under 1 (equivalent) -> correct
            [-1.0, -2.0, -5.0, -5.0],  # from column 1, best under 0 (equivalent) -> correct
            [-5.0, -5.0, -1.0, -2.0],
            [-5.0, -5.0, -1.0, -2.0],  # from column 3, best under 2 -> wrong
        ]
    )
    classes = np.array([0, 0, 1, 2])
    proxies = mi_proxies(L, L, column, column_classes=classes)
    assert proxies.retrieval_acc == pytest.approx(3 / 4)
    assert proxies.retrieval_chance == pytest.approx((2 + 2 + 1 + 1) / 4 / 4)
    assert mi_proxies(L, L, column).retrieval_acc == pytest.approx(1 / 4)


def test_partial_ties_use_expected_value_of_random_tie_breaking():
    # true column tied with one other at the top: hit@1 with probability 1/2; at k = 2 certainly
    L = np.array([[-1.0, -1.0, -3.0]])
    proxies = mi_proxies(L, L, np.array([0]))
    assert proxies.retrieval_acc == pytest.approx(0.5)
    assert proxies.recall_at[2] == 1.0
    # three-way tie, one strictly better other column: top-2 leaves one slot for 3 tied -> 1/3
    L = np.array([[-1.0, -1.0, 0.0, -1.0]])
    assert mi_proxies(L, L, np.array([0])).recall_at[2] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("L", "L_sum", "column", "message"),
    [
        (np.zeros((0, 3)), np.zeros((0, 3)), np.zeros(0, dtype=int), "non-empty"),
        (np.zeros((2, 3)), np.zeros((2, 2)), np.array([0, 1]), "must match"),
        (np.zeros((2, 3)), np.zeros((2, 3)), np.array([0, 3]), r"\[0, 3\)"),
        (np.zeros((2, 3)), np.zeros((2, 3)), np.array([0.0, 1.0]), "integer"),
        (np.full((2, 3), np.nan), np.zeros((2, 3)), np.array([0, 1]), "NaN"),
    ],
)
def test_bad_input_raises(L, L_sum, column, message):
    with pytest.raises(ValueError, match=message):
        mi_proxies(L, L_sum, column)


@settings(max_examples=100, deadline=None)
@given(
    L=arrays(np.float64, (12, 4), elements=st.floats(-30.0, 0.0)),
    column=arrays(np.int64, (12,), elements=st.integers(0, 3)),
)
def test_bounds_hold_for_any_matrix(L, column):
    proxies = mi_proxies(L, L, column)
    assert 0.0 <= proxies.retrieval_acc <= 1.0
    assert all(0.0 <= v <= 1.0 for v in proxies.recall_at.values())
    # recall is monotone in k and retrieval is recall@1
    values = [proxies.retrieval_acc, *[proxies.recall_at[k] for k in sorted(proxies.recall_at)]]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:], strict=False))
    # MI-Est <= log N: matched_i <= logsumexp_j L[i, j]
    assert proxies.mi_est <= math.log(4) + 1e-9


def test_zscore_ema_semantics_and_checkpoint_roundtrip():
    rng = np.random.default_rng(2)
    column = balanced_columns(16, 4)
    batches = [rng.normal(-2.0, s, size=(16, 4)) for s in (0.5, 2.0, 1.0)]
    ema = ZScoreEMA()
    proxies = [mi_proxies(L, L, column) for L in batches]
    first = ema.update(proxies[0])
    assert ema.sigma == pytest.approx(proxies[0].marginal_std)  # initialised to the first std
    assert first == pytest.approx(proxies[0].mi_zscore)  # so the first value equals the plain z-score
    second = ema.update(proxies[1])
    expected_sigma = 0.9 * proxies[0].marginal_std + 0.1 * proxies[1].marginal_std
    assert ema.sigma == pytest.approx(expected_sigma)
    assert second == pytest.approx(proxies[1].mi_est / (expected_sigma + 1e-3))

    restored = ZScoreEMA()
    restored.load_state_dict(ema.state_dict())
    assert restored.update(proxies[2]) == pytest.approx(ema.update(proxies[2]))
    with pytest.raises(ValueError, match="decay"):
        ZScoreEMA(decay=1.0)


def test_retrieval_excess_over_chance_for_scalars_and_columns():
    proxies = mi_proxies(diagonal_scores(balanced_columns(16, 4), 4, 5.0), np.zeros((16, 4)), balanced_columns(16, 4))
    assert retrieval_excess(proxies.retrieval_acc, proxies.retrieval_chance) == pytest.approx(3.0)  # 1.0 vs 0.25
    assert retrieval_excess(0.25, 0.25) == 0.0
    assert retrieval_excess(0.3, 0.0) == 0.0  # no columns to tell apart: no excess, and no division error
    assert math.isnan(retrieval_excess(float("nan"), 0.25))
    assert math.isnan(retrieval_excess(0.5, float("nan")))
    pd = pytest.importorskip("pandas")
    values = retrieval_excess(pd.Series([0.5, 0.1, 0.2]), pd.Series([0.25, 0.1, 0.0]))
    np.testing.assert_allclose(values, [1.0, 0.0, 0.0])
