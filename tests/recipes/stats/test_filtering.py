"""SNR-Aware Filtering: semantics of RAGEN-2 (arXiv 2604.06268) and RAGEN's `RolloutFilter`, hand-computed cases and invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recipes.stats.filtering import (
    FilterConfig,
    filter_groups,
    group_stats,
    loss_scale,
    select_groups,
    select_quartile,
    select_trajectories,
)

positive_scores = st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=40).map(np.array)
rhos = st.floats(0.01, 1.0)


def descending_prefix(scores: np.ndarray, keep: np.ndarray) -> bool:
    """True iff the kept set is the first len(kept) groups of the stable descending order."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    count = int(keep.sum())
    return set(order[:count]) == set(np.flatnonzero(keep).tolist())


# --- group statistics -----------------------------------------------------------------------------------------


def test_group_stats_match_numpy_unbiased_estimates():
    rewards = [1.0, 3.0, 0.0, 0.0, 5.0, 2.0, 2.0, 8.0]
    groups = ["b", "b", "a", "a", "c", "c", "c", "c"]
    stats = group_stats(rewards, groups)
    assert stats.keys.tolist() == ["b", "a", "c"]  # order of first appearance
    assert stats.size.tolist() == [2, 2, 4]
    for g, members in enumerate(([1.0, 3.0], [0.0, 0.0], [5.0, 2.0, 2.0, 8.0])):
        assert stats.mean[g] == pytest.approx(np.mean(members))
        assert stats.var[g] == pytest.approx(np.var(members, ddof=1))
        assert stats.std[g] == pytest.approx(np.std(members, ddof=1))
    assert stats.zero_variance.tolist() == [False, True, False]
    assert stats.inverse.tolist() == [0, 0, 1, 1, 2, 2, 2, 2]


def test_group_stats_accepts_torch_tensors():
    stats = group_stats(torch.tensor([0.0, 1.0, 1.0, 1.0]), torch.tensor([7, 7, 9, 9]))
    assert stats.keys.tolist() == [7, 9]
    assert stats.var.tolist() == pytest.approx([0.5, 0.0])


@pytest.mark.parametrize(
    ("rewards", "groups", "message"),
    [
        ([], [], "empty"),
        ([1.0, float("nan")], [0, 0], "NaN"),
        ([1.0, 2.0, 3.0], [0, 0, 1], "single trajectory"),
        ([1.0, 2.0], [0], "must match"),
        (["x", "y"], [0, 0], "numeric"),
    ],
)
def test_group_stats_rejects_bad_input(rewards, groups, message):
    with pytest.raises(ValueError, match=message):
        group_stats(rewards, groups)


# --- hand-computed selections ---------------------------------------------------------------------------------


def test_linear_top_p_hand_case():
    # scores 4, 3, 2, 1 (total 10); rho 0.6 -> threshold 5.99: 4 (<5.99), 4+3 = 7 >= 5.99 -> keep {0, 1}
    keep = select_groups([1.0, 4.0, 2.0, 3.0], "top_p", 0.6)
    assert keep.tolist() == [False, True, False, True]
    # rho 0.7 -> 6.99: still {4, 3}; rho 0.71 -> 7.09: needs the 2 as well
    assert select_groups([1.0, 4.0, 2.0, 3.0], "top_p", 0.71).tolist() == [False, True, True, True]


def test_linear_top_p_eps_lets_a_near_miss_count():
    # total 10, rho 0.7 -> 7 - eps; 4 + 3 = 7 reaches it only thanks to eps
    assert select_groups([4.0, 3.0, 3.0], "top_p", 0.7, eps=0.01).sum() == 2
    assert select_groups([4.0, 3.0, 3.0], "top_p", 0.7, eps=0.0).sum() == 2  # 7 >= 7 exactly
    assert select_groups([4.0, 3.0, 3.0], "top_p", 0.71, eps=0.0).sum() == 3


def test_linear_top_p_stops_at_non_positive_scores_and_keeps_nothing_if_short():
    # a negative mass makes the threshold unreachable before the walk hits a score <= 0
    scores = np.array([1.0, -5.0, 0.0])
    assert not select_groups(scores, "top_p", 0.9, include_zero=True).any()


def test_softmax_top_p_hand_case():
    scores = np.array([0.0, 2.0, 1.0])
    probs = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()  # 0.665, 0.245, 0.090
    assert probs[0] < 0.7 < probs[0] + probs[1]
    keep = select_groups(scores, "top_p", 0.7, prob_mode="softmax", include_zero=True)
    assert keep.tolist() == [False, True, True]
    # rho below the top probability still keeps one group
    assert select_groups(scores, "top_p", 0.1, prob_mode="softmax", include_zero=True).tolist() == [False, True, False]


def test_include_zero_controls_zero_variance_groups():
    scores = np.array([0.0, 0.0, 0.0, 1e-12])
    assert not select_groups(scores, "top_p", 0.5, prob_mode="softmax", include_zero=False).any()
    assert select_groups(scores, "top_p", 0.5, prob_mode="softmax", include_zero=True).sum() >= 1
    mixed = np.array([2.0, 0.0, 1.0])
    assert select_groups(mixed, "top_k_abs", 3, include_zero=False).tolist() == [True, False, True]
    assert select_groups(mixed, "top_k_abs", 3, include_zero=True).tolist() == [True, True, True]


def test_top_k_counts():
    scores = np.arange(10, dtype=float) + 1.0
    assert select_groups(scores, "top_k", 0.25).sum() == int(0.25 * 10)
    assert select_groups(scores, "top_k", 0.01).sum() == 1  # max(1, int(0.1))
    assert select_groups(scores, "top_k", 0.25).tolist() == [False] * 8 + [True] * 2
    assert select_groups(scores, "top_k_abs", 3.7).sum() == 3
    assert select_groups(scores, "top_k_abs", 50).sum() == 10


def test_min_p_threshold():
    scores = np.array([10.0, 5.0, 4.9, 0.5])
    assert select_groups(scores, "min_p", 0.5).tolist() == [True, True, False, False]
    assert select_groups(scores, "min_p", 0.0).tolist() == [True, True, True, True]


def test_smallest_reverses_the_order():
    scores = np.array([5.0, 1.0, 3.0, 2.0])
    assert select_groups(scores, "top_k_abs", 2, select_type="smallest").tolist() == [False, True, False, True]
    # mirrored scores 1, 5, 3, 4 (total 13); rho 0.6 -> 7.79: 5 + 4 = 9 -> the two smallest originals
    assert select_groups(scores, "top_p", 0.6, select_type="smallest").tolist() == [False, True, False, True]


def test_ties_break_toward_earlier_groups():
    assert select_groups([1.0, 2.0, 2.0, 2.0], "top_k_abs", 2).tolist() == [False, True, True, False]
    assert select_groups([2.0, 2.0, 2.0], "top_k_abs", 1, select_type="smallest").tolist() == [True, False, False]


def test_rho_one_and_none_keep_everything_including_zero_variance():
    scores = np.array([0.0, 3.0, 0.0])
    assert select_groups(scores, "top_p", 1.0).all()
    assert select_groups(scores, "none", 0.0).all()


@pytest.mark.parametrize(
    ("strategy", "value", "message"),
    [
        ("top_q", 0.9, "valid choices: top_p, top_k, top_k_abs, min_p, quartile, none"),
        ("trajectory", 1, "keeps trajectories, not whole groups"),
        ("quartile", 0, "1, 2, 3 or 4"),
        ("quartile", 5, "1, 2, 3 or 4"),
        ("quartile", 1.5, "1, 2, 3 or 4"),
        ("top_p", 0.0, r"rho must be in \(0, 1\]"),
        ("top_p", 1.5, r"rho must be in \(0, 1\]"),
        ("top_k", 0.0, r"kept fraction must be in \(0, 1\]"),
        ("top_k_abs", 0.5, "k = int"),
        ("min_p", -0.1, r"\[0, 1\]"),
        ("top_p", float("nan"), "finite"),
    ],
)
def test_select_groups_rejects_bad_arguments(strategy, value, message):
    with pytest.raises(ValueError, match=message):
        select_groups([1.0, 2.0], strategy, value)


def test_select_groups_rejects_empty_and_bad_modes():
    with pytest.raises(ValueError, match="empty"):
        select_groups([], "top_p", 0.9)
    with pytest.raises(ValueError, match="valid choices: linear, softmax"):
        select_groups([1.0], "top_p", 0.9, prob_mode="cubic")
    with pytest.raises(ValueError, match="valid choices: largest, smallest"):
        select_groups([1.0], "top_p", 0.9, select_type="middle")


# --- invariants (hypothesis) ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(scores=positive_scores, rho=rhos, include_zero=st.booleans())
def test_linear_top_p_is_a_prefix_reaching_the_mass(scores, rho, include_zero):
    keep = select_groups(scores, "top_p", rho, include_zero=include_zero)
    if rho >= 1.0:
        assert keep.all()
        return
    eligible = scores if include_zero else scores[np.abs(scores) > 1e-10]
    masked = np.where(np.abs(scores) > 1e-10, scores, -np.inf) if not include_zero else scores
    assert descending_prefix(masked, keep)
    if eligible.size and eligible.sum() > 0:
        assert scores[keep].sum() >= rho * eligible.sum() - 0.01
        # minimal: dropping the last kept group would fall short
        if keep.sum() > 1:
            smallest_kept = scores[keep].min()
            assert scores[keep].sum() - smallest_kept < rho * eligible.sum() - 0.01


@settings(max_examples=300, deadline=None)
@given(scores=positive_scores, rho=st.floats(0.01, 0.999))
def test_softmax_top_p_keeps_at_least_one_prefix(scores, rho):
    keep = select_groups(scores, "top_p", rho, prob_mode="softmax", include_zero=True)
    assert keep.sum() >= 1
    assert descending_prefix(scores, keep)
    shifted = np.exp(scores - scores.max())
    probs = shifted / shifted.sum()
    kept_mass = probs[keep].sum()
    assert kept_mass >= rho - 1e-9 or keep.all()
    if keep.sum() > 1:
        assert kept_mass - probs[keep].min() < rho + 1e-12


@settings(max_examples=200, deadline=None)
@given(scores=positive_scores, fraction=st.floats(0.01, 1.0), k=st.integers(1, 60), ratio=st.floats(0.0, 1.0))
def test_count_and_threshold_strategies(scores, fraction, k, ratio):
    keep = select_groups(scores, "top_k", fraction, include_zero=True)
    assert keep.sum() == min(scores.size, max(1, int(fraction * scores.size)))
    assert descending_prefix(scores, keep)
    keep = select_groups(scores, "top_k_abs", k, include_zero=True)
    assert keep.sum() == min(k, scores.size)
    keep = select_groups(scores, "min_p", ratio, include_zero=True)
    assert keep.tolist() == (scores >= ratio * scores.max()).tolist()


# --- filter_groups, metrics, scaling --------------------------------------------------------------------------


def test_filter_groups_keeps_whole_groups_and_reports_metrics():
    # group 0: var 2 (1,3), group 1: zero var, group 2: rewards 0,0,6 -> var 12
    rewards = np.array([1.0, 3.0, 5.0, 5.0, 0.0, 0.0, 6.0])
    groups = np.array([0, 0, 1, 1, 2, 2, 2])
    result = filter_groups(rewards, groups, FilterConfig(strategy="top_k_abs", value=1, metric="var"))
    assert result.keep_groups.tolist() == [False, False, True]
    assert result.keep_samples.tolist() == [False, False, False, False, True, True, True]
    m = result.metrics
    stds = [math.sqrt(2.0), 0.0, math.sqrt(12.0)]
    assert m["rollout/in_group_reward_std_mean"] == pytest.approx(np.mean(stds))
    assert m["rollout/in_group_reward_std_max"] == pytest.approx(max(stds))
    assert m["rollout/chosen_in_group_reward_std_mean"] == pytest.approx(math.sqrt(12.0))
    assert m["rollout/kept_groups"] == 1
    assert m["rollout/kept_ratio"] == pytest.approx(3 / 7)
    assert m["rollout/zero_variance_groups"] == 1
    assert result.loss_scale == 1.0


def test_filter_groups_empty_result_and_loss_scaling():
    rewards = np.zeros(6)
    result = filter_groups(rewards, [0, 0, 1, 1, 2, 2], FilterConfig(strategy="top_p", value=0.9))
    assert result.is_empty
    assert result.metrics["rollout/kept_ratio"] == 0.0
    assert result.metrics["rollout/chosen_in_group_reward_std_mean"] == 0.0
    assert loss_scale(0.25, "linear") == 0.25
    assert loss_scale(0.25, "sqrt") == 0.5
    assert loss_scale(0.25, "none") == 1.0
    with pytest.raises(ValueError, match="valid choices: none, linear, sqrt"):
        loss_scale(0.5, "cubic")


def test_filter_config_validates_value_per_strategy():
    with pytest.raises(ValueError, match=r"rho must be in \(0, 1\]"):
        FilterConfig(strategy="top_p", value=2.0)
    with pytest.raises(ValueError, match="strategy"):
        FilterConfig(strategy="bogus")
    with pytest.raises(ValueError, match="extra"):
        FilterConfig(rho=0.9)
    assert FilterConfig(strategy="none", value=0.0).strategy == "none"


# --- ablation selectors ---------------------------------------------------------------------------------------


def test_quartiles_partition_the_groups_by_descending_score():
    scores = np.array([0.1, 8.0, 3.0, 5.0, 0.0, 2.0, 7.0, 1.0])
    masks = [select_quartile(scores, q) for q in (1, 2, 3, 4)]
    assert np.all(np.sum(masks, axis=0) == 1)  # a partition
    assert sorted(scores[masks[0]].tolist()) == [7.0, 8.0]
    assert sorted(scores[masks[3]].tolist()) == [0.0, 0.1]
    assert all(scores[masks[q]].min() >= scores[masks[q + 1]].max() for q in range(3))
    with pytest.raises(ValueError, match="1, 2, 3 or 4"):
        select_quartile(scores, 5)


def test_trajectory_level_selection_keeps_extremes_of_each_group():
    rewards = np.array([5.0, 1.0, 3.0, 4.0, 2.0, 0.0, 9.0, 9.0, 8.0])
    groups = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1])
    keep = select_trajectories(rewards, groups, 1)
    # group 0: best 5.0 (index 0), worst 0.0 (index 5); group 1 has 3 > 2 members: best 9.0 (first, index 6), worst 8.0
    assert np.flatnonzero(keep).tolist() == [0, 5, 6, 8]
    assert select_trajectories(rewards, groups, 3).sum() == 6 + 3
    with pytest.raises(ValueError, match="n >= 1"):
        select_trajectories(rewards, groups, 0)


# --- the ablations as filter strategies (Tables 6 and 7) ------------------------------------------------------


def quartile_sizes(count: int) -> list[int]:
    """Four near-equal parts of `count` groups, sizes differing by at most one, larger parts first."""
    return [count // 4 + (1 if part < count % 4 else 0) for part in range(4)]


def make_batch(group_rewards: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """(rewards, group_ids) with the groups' trajectories interleaved, so groups are not contiguous."""
    width = max(len(rewards) for rewards in group_rewards)
    pairs = [(rewards[k], g) for k in range(width) for g, rewards in enumerate(group_rewards) if k < len(rewards)]
    return np.array([r for r, _ in pairs]), np.array([g for _, g in pairs])


group_batches = st.lists(st.lists(st.integers(-3, 3).map(float), min_size=2, max_size=6), min_size=1, max_size=23)


@pytest.mark.parametrize("num_groups", [1, 3, 4, 5, 8, 10, 17])
def test_quartile_keeps_exactly_one_quartile_by_descending_std(num_groups):
    # group g: rewards 0 and g, so its std (g / sqrt 2) grows with g; the ranking is the reverse group order
    rewards, groups = make_batch([[0.0, float(g + 1)] for g in range(num_groups)])
    descending = list(range(num_groups))[::-1]
    start = 0
    for quartile, size in enumerate(quartile_sizes(num_groups), start=1):
        result = filter_groups(rewards, groups, FilterConfig(strategy="quartile", value=quartile))
        assert np.flatnonzero(result.keep_groups).tolist() == sorted(descending[start : start + size])
        assert result.keep_samples.tolist() == result.keep_groups[groups].tolist()  # whole groups
        assert result.metrics["rollout/kept_ratio"] == pytest.approx(size / num_groups)
        start += size


@settings(max_examples=200, deadline=None)
@given(batch=group_batches, include_zero=st.booleans())
def test_quartiles_partition_the_eligible_groups(batch, include_zero):
    rewards, groups = make_batch(batch)
    stds = np.array([np.std(r, ddof=1) for r in batch])
    results = [
        filter_groups(rewards, groups, FilterConfig(strategy="quartile", value=q, include_zero=include_zero))
        for q in (1, 2, 3, 4)
    ]
    eligible = np.ones(len(batch), dtype=bool) if include_zero else stds > 1e-10
    masks = np.array([result.keep_groups for result in results])
    assert (masks.sum(axis=0) == eligible).all()  # every eligible group in exactly one quartile
    assert masks.sum(axis=1).tolist() == quartile_sizes(int(eligible.sum()))
    kept = [stds[mask] for mask in masks]
    for upper, lower in zip(kept, kept[1:], strict=False):
        if upper.size and lower.size:
            assert upper.min() >= lower.max() - 1e-9


@settings(max_examples=200, deadline=None)
@given(batch=group_batches, n=st.integers(1, 4))
def test_trajectory_mode_keeps_top_n_and_bottom_n_of_every_group(batch, n):
    rewards, groups = make_batch(batch)
    result = filter_groups(rewards, groups, FilterConfig(strategy="trajectory", value=n, include_zero=True))
    for g, group_rewards in enumerate(batch):
        members = np.flatnonzero(groups == g)  # in trajectory order
        # rank by reward, earlier trajectories first among ties; keep both ends of the ranking
        ranking = sorted(members, key=lambda i: (-rewards[i], i))
        expected = set(ranking[:n]) | set(ranking[-n:])
        assert set(np.flatnonzero(result.keep_samples & (groups == g))) == expected
        assert len(expected) == min(len(group_rewards), 2 * n)
    assert result.keep_groups.all()
    total_kept = sum(min(len(r), 2 * n) for r in batch)
    assert result.metrics["rollout/kept_samples"] == total_kept
    assert result.metrics["rollout/kept_ratio"] == pytest.approx(total_kept / len(rewards))
    assert result.metrics["rollout/kept_groups"] == len(batch)


def test_trajectory_mode_reproduces_the_papers_batch_shape():
    # Table 7: 8 prompts x 16 trajectories; top-4 + bottom-4 of each prompt -> 8/8 prompts, 64 trajectories
    rng = np.random.default_rng(0)
    rewards, groups = rng.normal(size=128), np.repeat(np.arange(8), 16)
    config = FilterConfig(strategy="trajectory", value=4, include_zero=True, loss_scaling="linear")
    result = filter_groups(rewards, groups, config)
    assert result.metrics["rollout/kept_groups"] == 8 and result.metrics["rollout/kept_samples"] == 64
    assert result.loss_scale == pytest.approx(0.5)
    for g in range(8):
        kept, dropped = rewards[(groups == g) & result.keep_samples], rewards[(groups == g) & ~result.keep_samples]
        middle = np.sort(rewards[groups == g])[4:12]
        assert sorted(dropped) == pytest.approx(middle)
        assert kept.size == 8


def test_trajectory_mode_drops_zero_variance_groups_unless_include_zero():
    rewards = np.array([1.0, 1.0, 1.0, 0.0, 5.0, 2.0])
    groups = np.array([0, 0, 0, 1, 1, 1])
    dropped = filter_groups(rewards, groups, FilterConfig(strategy="trajectory", value=1))
    assert dropped.keep_samples.tolist() == [False, False, False, True, True, False]
    assert dropped.keep_groups.tolist() == [False, True]
    assert dropped.metrics["rollout/kept_ratio"] == pytest.approx(2 / 6)
    kept = filter_groups(rewards, groups, FilterConfig(strategy="trajectory", value=1, include_zero=True))
    assert kept.keep_samples.tolist() == [True, False, True, True, True, False]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"strategy": "quartile", "value": 5}, "1, 2, 3 or 4"),
        ({"strategy": "quartile", "value": 0.5}, "1, 2, 3 or 4"),
        ({"strategy": "trajectory", "value": 0}, "whole number >= 1"),
        ({"strategy": "trajectory", "value": 2.5}, "whole number >= 1"),
        ({"strategy": "quartile", "value": 1, "select_type": "smallest"}, "value 4 keeps the lowest-RV quartile"),
        ({"strategy": "trajectory", "value": 1, "select_type": "smallest"}, "does not apply to strategy trajectory"),
    ],
)
def test_filter_config_validates_the_ablation_values(fields, message):
    with pytest.raises(ValueError, match=message):
        FilterConfig(**fields)


# --- the strategy registry and the reference code's top_k rule ------------------------------------------------


def test_top_k_sizes_k_on_all_groups_like_the_reference_code():
    # RAGEN's RolloutFilter._select_top_groups: k = int(value * num_groups) over ALL groups, capped at the eligible
    # (non-zero) groups, at least 1. 11 groups of which 5 have reward variance, value 0.5: k = int(5.5) = 5, so
    # all 5 non-zero groups are kept (sizing k on the eligible groups would keep int(2.5) = 2).
    scores = np.array([0.0, 3.0, 0.0, 1.0, 0.0, 2.0, 0.0, 5.0, 0.0, 4.0, 0.0])
    keep = select_groups(scores, "top_k", 0.5, include_zero=False)
    assert np.flatnonzero(keep).tolist() == [1, 3, 5, 7, 9]
    # capped at the eligible groups: value 1.0 would ask for 11
    assert select_groups(scores, "top_k", 1.0, include_zero=False).sum() == 5
    # at least one: int(0.05 * 11) = 0 -> 1, the largest
    assert np.flatnonzero(select_groups(scores, "top_k", 0.05, include_zero=False)).tolist() == [7]
    # zero-variance groups kept eligible: int(0.5 * 11) = 5 of all 11
    assert select_groups(scores, "top_k", 0.5, include_zero=True).sum() == 5


def test_is_off_is_the_one_definition_of_no_filtering():
    assert FilterConfig(strategy="none").is_off
    assert FilterConfig(strategy="top_p", value=1.0).is_off
    assert not FilterConfig(strategy="top_p", value=0.9).is_off
    assert not FilterConfig(strategy="top_k", value=1.0).is_off  # top_k keeps >= 1 group, drops zero variance


def test_a_registered_strategy_is_a_valid_filter_setting(monkeypatch):
    from recipes.stats import filtering

    monkeypatch.setattr(filtering.STRATEGIES, "entries", dict(filtering.STRATEGIES.entries))

    @filtering.register_strategy("first_half")
    class FirstHalf(filtering.Strategy):
        value_meaning = "ignored"
        takes_value = False

        def keep_candidates(self, scores, value, total_groups, config):
            return np.arange(scores.size) < scores.size // 2

    config = FilterConfig(strategy="first_half", include_zero=True)
    result = filter_groups(np.array([0.0, 1.0, 2.0, 2.0, 5.0, 9.0, 1.0, 1.0]), [0, 0, 1, 1, 2, 2, 3, 3], config)
    assert result.keep_groups.tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="valid choices: top_p, .*first_half"):
        FilterConfig(strategy="second_half")
