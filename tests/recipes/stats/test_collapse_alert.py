"""The collapse alert's rule on constructed series."""

from __future__ import annotations

import pytest

from recipes.stats.collapse_alert import LEGACY_RULE, CollapseAlert, CollapseRule

CHANCE = 0.125


def run(series, success=None, rule=None):
    detector = CollapseAlert(rule or LEGACY_RULE)
    statuses = []
    for index, (mi, retrieval) in enumerate(series):
        value = None if success is None else success[index]
        statuses.append(detector.update(1 + 5 * index, mi, retrieval, CHANCE, value))
    return detector, statuses


def test_declining_mi_fires_once_before_success_falls():
    mi = [1.0, 1.2, 1.3, 1.2, 0.8, 0.7, 0.5, 0.3]
    retrieval = [0.6, 0.65, 0.7, 0.66, 0.4, 0.35, 0.25, 0.2]
    success = [0.1, 0.2, 0.3, 0.3, 0.3, 0.32, 0.31, 0.3]
    detector, statuses = run(list(zip(mi, retrieval, strict=True)), success)
    fired = [s.new_alert for s in statuses]
    assert fired.count(True) == 1
    first = fired.index(True)
    # 0.8 / 1.3 is a 38% drop (>= 30%), and retrieval excess (0.4/0.125-1 = 2.2 vs 4.6) fell by 52%: the second
    # such point in a row (index 5) fires
    assert first == 5
    assert all(s.alert for s in statuses[first:]) and not any(s.alert for s in statuses[:first])
    assert detector.alert_step == 1 + 5 * first
    assert "step 26" in statuses[-1].reason


def test_flat_series_never_fires():
    _, statuses = run([(1.0, 0.6)] * 20, [0.3] * 20)
    assert not any(s.alert for s in statuses)
    assert all(s.mi_drop == 0.0 for s in statuses)


def test_noisy_but_level_series_does_not_fire():
    mi = [1.0, 0.85, 1.05, 0.9, 1.0, 0.8, 1.1, 0.95, 1.0]
    retrieval = [0.6, 0.5, 0.62, 0.55, 0.6, 0.5, 0.6, 0.58, 0.6]
    _, statuses = run(list(zip(mi, retrieval, strict=True)), [0.3] * 9)
    assert not any(s.alert for s in statuses)


def test_no_warning_when_success_has_already_fallen():
    mi = [1.0, 1.3, 1.3, 0.7, 0.6, 0.5]
    retrieval = [0.7, 0.7, 0.7, 0.3, 0.3, 0.25]
    success = [0.5, 0.6, 0.6, 0.3, 0.2, 0.2]  # success fell with MI: no alert (not early)
    _, statuses = run(list(zip(mi, retrieval, strict=True)), success)
    assert not any(s.alert for s in statuses)


def test_mi_alone_falling_is_not_enough():
    mi = [1.0, 1.3, 1.3, 0.7, 0.6, 0.5]
    retrieval = [0.7] * 6  # retrieval stays well above chance
    _, statuses = run(list(zip(mi, retrieval, strict=True)))
    assert not any(s.alert for s in statuses)


def test_state_roundtrip_continues_identically():
    series = [(1.0, 0.6), (1.3, 0.7), (1.2, 0.6), (0.8, 0.4), (0.7, 0.3), (0.5, 0.2)]
    straight, expected = run(series)
    first = CollapseAlert(LEGACY_RULE)
    for index, (mi, retrieval) in enumerate(series[:3]):
        first.update(1 + 5 * index, mi, retrieval, CHANCE, None)
    resumed = CollapseAlert(LEGACY_RULE)
    resumed.load_state_dict(first.state_dict())
    tail = [resumed.update(1 + 5 * index, mi, r, CHANCE, None) for index, (mi, r) in enumerate(series) if index >= 3]
    assert tail == expected[3:]
    assert resumed.state_dict() == straight.state_dict()


@pytest.mark.parametrize(
    "kwargs", [{"drop_fraction": 0.0}, {"drop_fraction": 1.0}, {"patience": 0}, {"success_tolerance": -1}]
)
def test_rule_validation(kwargs):
    with pytest.raises(ValueError, match="collapse"):
        CollapseRule(**kwargs)


@pytest.mark.parametrize("signals, fires", [("both", False), ("mi", True), ("retrieval", False), ("either", True)])
def test_the_signals_knob_says_which_must_fall(signals: str, fires: bool) -> None:
    mi = [1.0, 1.3, 1.3, 0.7, 0.6, 0.5]
    retrieval = [0.7] * 6  # only MI falls
    _, statuses = run(list(zip(mi, retrieval, strict=True)), rule=LEGACY_RULE.model_copy(update={"signals": signals}))
    assert statuses[-1].alert is fires


def test_the_baseline_reference_is_the_mean_of_the_first_points_and_resumes() -> None:
    series = [(1.0, 0.6), (1.6, 0.6), (1.0, 0.6), (2.0, 0.6), (0.8, 0.25), (0.8, 0.25)]
    rule = LEGACY_RULE.model_copy(update={"reference": "baseline"})
    detector, statuses = run(series, rule=rule)
    assert detector.references()[0] == pytest.approx(1.2)  # (1.0 + 1.6 + 1.0) / 3: later points do not move it
    assert statuses[4].mi_drop == pytest.approx(1 - 0.8 / 1.2)
    assert detector.alert_step == 26  # the fifth and sixth points, 33% below the early level, twice in a row
    resumed = CollapseAlert(rule)
    resumed.load_state_dict(detector.state_dict())
    assert resumed.references() == detector.references()


def test_the_alert_says_only_what_its_rule_checked():
    series = [(2.0, 0.6), (2.1, 0.6), (1.9, 0.6), (0.9, 0.6), (0.6, 0.6), (0.5, 0.6)]  # MI falls, retrieval holds
    _, statuses = run(series, [0.5] * 6, rule=CollapseRule())  # the shipped rule: MI-ZScore-EMA only, no guard
    reason = statuses[-1].reason
    assert statuses[-1].alert and "MI-ZScore-EMA" in reason
    assert "retrieval" not in reason and "had not fallen" not in reason and "success is not checked" in reason
    _, statuses = run([(m, a) for m, a in zip([2.0, 2.1, 1.9, 0.9, 0.6, 0.5], [0.6, 0.6, 0.6, 0.2, 0.2, 0.2],
                                              strict=True)], [0.5] * 6, rule=LEGACY_RULE)
    assert "retrieval" in statuses[-1].reason and "within 0.05 of its peak" in statuses[-1].reason


def test_the_alert_line_carries_the_recorded_rates_of_its_rule():
    from recipes.stats.collapse_alert import rates_line, recorded_rates

    record = recorded_rates()
    held = record["held_out"]
    line = rates_line(CollapseRule(**record["rule"]))
    assert f"false alarms in {held['false_alarms']} of {held['honest']} runs" in line
    assert f"detected within 5 steps in {held['detected']} of {held['strong']}" in line and "held out" in line
    assert "per 100 steps" in line
    other = CollapseRule(**{**record["rule"], "drop_fraction": 0.55})
    assert "no measured error rates" in rates_line(other)
    assert "no measured error rates" in rates_line(CollapseRule(), record={})
