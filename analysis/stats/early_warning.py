"""Early warning: per run, how many steps MI's decline preceded the decline of task success (RAGEN-2, arXiv
2604.06268: MI falls before success).

Both series go through the collapse alert's own rule on one series, :func:`recipes.stats.collapse_alert.decline_onset`: a
series has *declined* once it has fallen ``drop_fraction`` below its level (running peak, or early baseline) on
``patience`` consecutive logged points; the onset is the step of the first of those points. The rule here is the
collapse alert's first (``recipes.stats.collapse_alert.LEGACY_RULE``: 30% below the running peak, seen twice in a
row; the findings' rules were declared with it, so it stays theirs when the alert's own default moves -- issue 46
chose that offline); pass ``rule`` to date declines under another. The lead is
``success_decline_step - mi_decline_step``: positive when MI fell first. The step at which the run's own
collapse alert raised ``collapse/alert`` is reported beside it.

:func:`early_warning` returns one row per run with results:

    run_id, mi_peak_step, mi_decline_step, success_peak_step, success_decline_step, lead_steps,
    alert_step, alert_lead_steps (success_decline_step - alert_step), outcome
    (MI first | success first | together | MI only | success only | no decline | no data); steps are Int64
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analysis import names
from analysis.stats.verdicts import Measurement
from recipes.stats.collapse_alert import LEGACY_RULE, CollapseRule, decline_onset

if TYPE_CHECKING:
    import pandas as pd

    from analysis.stores.mlflow_store import RunData

DEFAULT_RULE = LEGACY_RULE  # the declared decline rule (module docstring), not the alert's current default

# Which series declined first, from :func:`early_warning`'s outcome, scored only where both declined: "MI only"
# (success had not fallen by the run's end), "success only", "together" and "no decline" are counted apart, never
# as either side (a run cut short would otherwise count for MI). A run missing either series is left out.
OUTCOMES = ("MI first", "success first", "together", "MI only", "success only", "no decline")


def decline_order(outcomes) -> Measurement:
    """The ordering measurement of the per-run outcomes: the share of "MI first" among the runs where both series
    declined one before the other (n), every outcome's count beside (`analysis.stats.verdicts`' ordering path)."""
    import math

    counts = {outcome: int(sum(1 for o in outcomes if o == outcome)) for outcome in OUTCOMES}
    scored = counts["MI first"] + counts["success first"]
    if not any(counts.values()):
        return Measurement(math.nan, math.nan, math.nan, 0)
    share = counts["MI first"] / scored if scored else math.nan
    return Measurement(share, math.nan, math.nan, scored, counts=counts)


def _outcome(mi: int | None, success: int | None, has_data: bool) -> str:
    if not has_data:
        return "no data"
    if mi is None and success is None:
        return "no decline"
    if success is None:
        return "MI only"
    if mi is None:
        return "success only"
    return "MI first" if mi < success else "success first" if mi > success else "together"


def _peak_step(steps: np.ndarray, values: np.ndarray) -> int | None:
    """The step of a series' largest value (the first, NaN left out); None when it has none."""
    finite = ~np.isnan(values)
    return int(steps[np.flatnonzero(finite)[np.argmax(values[finite])]]) if finite.any() else None


def early_warning(
    data: RunData,
    *,
    mi_key: str = names.MI_ZSCORE_EMA,
    success_key: str = names.VAL_SUCCESS,
    rule: CollapseRule = DEFAULT_RULE,
) -> pd.DataFrame:
    """The per-run lead frame of the module docstring, for every run that logged MI or success."""
    import pandas as pd

    mi_all, success_all = data.series(mi_key), data.series(success_key)  # per run, in step order
    alerts = data.history(names.COLLAPSE_ALERT)
    first_alert = alerts[alerts["value"] >= 0.5].groupby("run_id")["step"].min()
    none = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
    rows = []
    for run_id in sorted(set(mi_all) | set(success_all)):
        (mi_steps, mi), (success_steps, success) = mi_all.get(run_id, none), success_all.get(run_id, none)
        mi_step = decline_onset(mi_steps, mi, rule)
        success_step = decline_onset(success_steps, success, rule)
        alert = first_alert.get(run_id)
        rows.append(
            {
                "run_id": run_id,
                "mi_peak_step": _peak_step(mi_steps, mi),
                "mi_decline_step": mi_step,
                "success_peak_step": _peak_step(success_steps, success),
                "success_decline_step": success_step,
                "lead_steps": None if mi_step is None or success_step is None else success_step - mi_step,
                "alert_step": alert,
                "alert_lead_steps": None if alert is None or success_step is None else success_step - alert,
                "outcome": _outcome(mi_step, success_step, bool(mi.size) and bool(success.size)),
            }
        )
    columns = [
        "run_id", "mi_peak_step", "mi_decline_step", "success_peak_step", "success_decline_step", "lead_steps",
        "alert_step", "alert_lead_steps", "outcome",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    for column in columns[1:-1]:
        frame[column] = pd.array(frame[column].tolist(), dtype="Int64")
    return frame
