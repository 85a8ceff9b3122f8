"""Early-warning leads: MI's decline onset vs success's, on constructed series and the demo sweep."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.early_warning import decline_onset, early_warning


def test_decline_onset_needs_a_sustained_fall_from_the_running_peak():
    steps = np.arange(0, 70, 10)
    assert decline_onset(steps, np.array([1, 2, 3, 2.5, 2.0, 1.9, 1.0])) == 40  # <= 0.7 * 3 from step 40 on
    assert decline_onset(steps, np.array([1, 2, 3, 2.0, 3.0, 2.0, 3.0])) is None  # never twice in a row
    assert decline_onset(steps, np.array([1, 2, 3, 2.0, 3.0, 2.0, 3.0]), patience=1) == 30
    assert decline_onset(steps, np.full(7, 2.0)) is None  # flat
    assert decline_onset(steps, np.array([0, 0, -1, -2, -3, -4, -5.0])) is None  # no positive peak
    assert decline_onset(steps, np.array([1, np.nan, 3, np.nan, 1.0, 1.0, 1.0])) == 40  # NaNs skipped
    assert decline_onset(steps, np.array([1, 2, 3, 2.5, 2.0, 1.9, 1.0]), drop_fraction=0.5) is None
    assert decline_onset(steps, np.array([1, 2, 3, 2.5, 2.0, 1.9, 1.0]), drop_fraction=0.5, patience=1) == 60


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
