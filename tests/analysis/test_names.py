"""The names analysis reads are the names the trainer's code writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis import names
from recipes.stats.filtering import filter_metrics, group_stats
from recipes.stats.mi import mi_proxies


def test_filter_metric_names_are_those_of_recipes_filtering():
    stats = group_stats(np.array([0.0, 1.0, 1.0, 1.0]), np.array([0, 0, 1, 1]))
    logged = set(filter_metrics(stats, np.array([True, False])))
    assert set(names.FILTER_METRICS) <= logged


def test_mi_metric_names_are_those_of_recipes_mi():
    L = np.array([[-1.0, -2.0], [-2.0, -1.0]])
    logged = set(mi_proxies(L, L * 10, np.array([0, 1])).to_metrics("collapse/trajectory"))
    assert {names.collapse_metric("trajectory", proxy) for proxy in names.MI_PROXY_NAMES} <= logged
    assert {names.MI_EST, names.RETRIEVAL_ACC, names.CONDITIONAL_ENTROPY} <= logged


def _recipes_source() -> str:
    import recipes

    return "\n".join(path.read_text() for path in sorted(Path(recipes.__file__).parent.rglob("*.py")))


def test_trainer_metric_names_appear_in_the_trainer_code():
    source = _recipes_source()
    logged = (
        names.VAL_SUCCESS, names.VAL_MEAN_RETURN, names.VAL_FORMAT_VALID, names.VAL_RESPONSE_LENGTH,
        names.STEP_TIME, names.REWARD_MEAN, names.RESPONSE_LENGTH, names.ENTROPY,
    )
    for name in logged:
        assert f'"{name}"' in source, name


def test_collapse_metric_names_appear_in_the_trainer_code():
    source = _recipes_source()
    assert f'"{names.COLLAPSE_ALERT}"' in source
    assert "/mi_zscore_ema" in source
    for sample_set in names.SAMPLE_SETS:
        assert f'"{sample_set}"' in source, sample_set


def test_every_diagnostic_has_a_family_and_curves_are_known_metrics():
    assert set(names.DIAGNOSTIC_FAMILIES.values()) == {"MI", "entropy", "reward", "response length"}
    assert names.MI_ZSCORE_EMA in names.DIAGNOSTIC_FAMILIES
    assert names.CURVES[0] == names.VAL_SUCCESS
