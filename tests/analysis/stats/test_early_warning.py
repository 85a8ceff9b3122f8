"""Early-warning leads: MI's decline onset vs success's, on constructed series and the demo sweep."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.stats.early_warning import DEFAULT_RULE, early_warning
from recipes.stats.collapse_alert import CollapseAlert, CollapseRule, decline_onset


def test_decline_onset_needs_a_sustained_fall_from_the_running_peak():
    steps = np.arange(0, 70, 10)

    def onset(values, **changed):
        return decline_onset(steps, np.array(values, dtype=float), DEFAULT_RULE.model_copy(update=changed))

    assert onset([1, 2, 3, 2.5, 2.0, 1.9, 1.0]) == 40  # <= 0.7 * 3 from step 40 on
    assert onset([1, 2, 3, 2.0, 3.0, 2.0, 3.0]) is None  # never twice in a row
    assert onset([1, 2, 3, 2.0, 3.0, 2.0, 3.0], patience=1) == 30
    assert onset(np.full(7, 2.0)) is None  # flat
    assert onset([0, 0, -1, -2, -3, -4, -5.0]) is None  # no positive peak
    assert onset([1, np.nan, 3, np.nan, 1.0, 1.0, 1.0]) == 40  # NaNs skipped
    assert onset([1, 2, 3, 2.5, 2.0, 1.9, 1.0], drop_fraction=0.5) is None
    assert onset([1, 2, 3, 2.5, 2.0, 1.9, 1.0], drop_fraction=0.5, patience=1) == 60
    assert onset([3, 1, 1, 1, 1, 1, 1], patience=1) == 20  # the rule's gate: not before min_points (3) values
    # reference: baseline -- the mean of the first 3 values (2), the alert's default rule on one series
    assert onset([1, 2, 3, 1.2, 1.0, 0.9, 1.0], drop_fraction=0.5, patience=1, reference="baseline") == 40


def test_the_early_warning_dates_a_decline_exactly_when_the_alert_would_fire_on_that_series():
    """One decline rule (issue 48): the alert's detector, watching one signal with no success guard, fires at the
    step where `decline_onset` dates the decline ends its `patience` streak -- for the legacy and the shipped rule."""
    rng = np.random.default_rng(0)
    for rule in (DEFAULT_RULE, CollapseRule()):
        fired_in = 0
        for _ in range(200):
            values = np.abs(np.cumsum(rng.normal(0, 0.3, 12)) + 2.0)
            steps = np.arange(1, 13) * 5
            detector = CollapseAlert(rule=rule.model_copy(update={"signals": "mi", "success_tolerance": 1.0}))
            fired = next((int(step) for step, value in zip(steps, values, strict=True)
                          if detector.update(int(step), float(value), 1.0, 0.5, None).new_alert), None)
            began = decline_onset(steps, values, rule)
            assert (None if began is None else began + 5 * (rule.patience - 1)) == fired
            fired_in += fired is not None
        assert 20 < fired_in < 180  # both cases met


def test_early_warning_on_the_demo_sweep(demo_store, demo_data):
    leads = early_warning(demo_data).set_index("run_id")
    assert len(leads) == 16  # every run with results; the failed and scheduled cells logged nothing
    baseline = leads.loc[demo_store.run_ids["sokoban", "ppo", False, 0]]
    assert (baseline["mi_peak_step"], baseline["mi_decline_step"]) == (0, 25)
    assert (baseline["success_peak_step"], baseline["success_decline_step"]) == (30, 50)
    assert baseline["lead_steps"] == 25 and baseline["outcome"] == "MI first"
    assert (baseline["alert_step"], baseline["alert_lead_steps"]) == (30, 20)
    filtered = leads.loc[demo_store.run_ids["frozenlake", "grpo", True, 1]]
    assert filtered["outcome"] == "success only"
    assert pd.isna(filtered["mi_decline_step"]) and pd.isna(filtered["lead_steps"])
    assert leads["outcome"].value_counts().to_dict() == {"MI first": 8, "success only": 8}
