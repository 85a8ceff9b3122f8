"""The report's first screen: the user's three questions answered in words, one figure each.

(a) *Did filtering help here?* -- per task, final success without and with the filter, the delta with its bootstrap
    interval over seeds (:func:`analysis.stats.science.filter_effect`) and the seed counts.
(b) *Did MI collapse, and before success did?* -- the baseline runs' MI proxies (retrieval excess over chance,
    MI-ZScore-EMA) against entropy and success over steps; the decline onsets and lead of
    :mod:`analysis.stats.early_warning` and the step at which the trainer's ``collapse/alert`` fired; and, per task and
    filter arm, whether each signal fell, rose or showed no trend (the post-hoc trend test of :mod:`analysis.stats.trend`,
    :func:`analysis.stats.science.arm_trends`; entropy also held or not).
(c) *What did the predictor say?* -- the Std(RV)/Mean(RV) verdict (:mod:`analysis.stats.predictor`) on each baseline
    run's first rollout batch, next to the filter's measured effect from (a).

A question without the data to answer it says so, with the cause (e.g. the MI diagnostics were off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from analysis import names
from analysis.stats.science import (
    DIAGNOSTICS_CAUSE,
    DROP,
    MIN_SEEDS,
    POST_HOC,
    Readings,
    _scope,
    arm_trends,
    diagnostics_state,
    side,
    with_retrieval_excess,
)

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from analysis.stores.mlflow_store import RunData

QUESTIONS = ("Did filtering help here?", "Did MI collapse, and before success did?", "What did the predictor say?")


@dataclass
class Answer:
    question: str
    words: list[str] = field(default_factory=list)
    figure: go.Figure | None = None
    brief: list[str] | None = None  # the headline lines `orch report` prints in the terminal (None: every line)

    def headline(self) -> list[str]:
        """The lines a terminal shows: `brief`, else the whole answer."""
        return self.words if self.brief is None else self.brief


def _effect_words(row: pd.Series) -> str:
    head = (f"{row['task']}" + ("" if row["variant"] == "base" else f" · {row['variant']}") + f": final success "
            f"{row['base_mean']:.1f}% without the filter, {row['filt_mean']:.1f}% with {row['filter']} "
            f"({row['delta']:+.1f} points")
    if min(row["base_n"], row["filt_n"]) < 2:
        return f"{head}; {row['base_n']} vs {row['filt_n']} seeds): too few seeds to tell an effect from noise."
    where = side(row["lo"], row["hi"], 0.0)
    said = {"clears": "it helped", "misses": "it hurt"}.get(where, "no clear difference: the interval spans 0")
    if min(row["base_n"], row["filt_n"]) < MIN_SEEDS:
        said = f"fewer than {MIN_SEEDS} seeds per side, so no verdict"
    return (f"{head}, 95% interval over seeds [{row['lo']:+.1f}, {row['hi']:+.1f}]; {row['base_n']} vs "
            f"{row['filt_n']} seeds): {said}.")


def filtering(summary: pd.DataFrame, effects: pd.DataFrame) -> Answer:
    from analysis.reports import figures

    answer = Answer(QUESTIONS[0])
    done = summary[summary["final_success"].notna()]
    if done.empty:
        answer.words.append(f"Cannot say yet: no run has validation results ({names.VAL_SUCCESS}).")
    elif not done["filtered"].eq(True).any():
        answer.words.append("Cannot say: every run with results ran without the filter; a sweep needs "
                            "filter: [none, top_p] (or another filter) in its grid to measure it.")
    elif not done["filtered"].eq(False).any():
        answer.words.append("Cannot say: every run with results ran with the filter; there is no baseline "
                            "(filter none) to compare with.")
    elif effects.dropna(subset=["delta"]).empty:
        answer.words.append("Cannot say: no task has finished runs both without and with the filter.")
    else:
        answer.words += [_effect_words(row) for _, row in effects.dropna(subset=["delta"]).iterrows()]
        answer.figure = figures.filter_effect_figure(done)
    return answer


def _median(values: pd.Series) -> str:
    return f"{float(values.median()):.0f}"


def _trend_words(readings: Readings) -> list[str]:
    """The post-hoc trend test in words: a header with its false-positive rate, then one sentence per task and
    filter arm (entropy's with whether it held)."""
    from analysis.stats.trend import HOLD_MARGIN, null_note

    shown = {names.MI_ZSCORE_EMA: "MI-ZScore-EMA", names.RETRIEVAL_EXCESS: "retrieval's excess over chance",
             names.ENTROPY: "entropy"}
    words = []
    for (task, variant), arms in readings.items():
        for arm, signals in arms.items():
            parts = [f"{label}: {signals[key].text()}" + (
                f", level {signals[key].level} (margin +-{HOLD_MARGIN:.0%} of its early level)"
                if key == names.ENTROPY else "") for key, label in shown.items() if key in signals]
            if parts:
                words.append(f"{_scope(task, variant)}, filter {arm}: " + "; ".join(parts) + ".")
    if words:
        words.insert(0, f"Trend over training ({POST_HOC}, made after the runs: the Theil-Sen change over the "
                        f"steps with its 95% interval; {null_note()}):")
    return words


def collapse(data: RunData, summary: pd.DataFrame, trends: Readings | None = None) -> Answer:
    """Question (b) (module docstring); ``trends``: :func:`analysis.stats.science.arm_trends` when already computed."""
    from analysis.reports import figures
    from analysis.stats.collapse_alert_calibration import alert_lines, fired_text, rules_used
    from analysis.stats.early_warning import early_warning

    answer = Answer(QUESTIONS[1])
    state = diagnostics_state(data)
    if state != "logged":
        answer.words.append(f"Cannot tell: {DIAGNOSTICS_CAUSE[state]}.")
        return answer
    data = with_retrieval_excess(data)
    baseline = summary[summary["filtered"].eq(False).fillna(False)]
    runs, which = (baseline, "Without filtering") if len(baseline) else (summary, "Every run (none ran without the filter)")
    leads = early_warning(data)
    leads = leads[leads["run_id"].isin(runs["run_id"])]
    n = len(leads)
    counts = leads["outcome"].value_counts()
    mi_fell = int(leads["mi_decline_step"].notna().sum())
    success_fell = int(leads["success_decline_step"].notna().sum())
    answer.words.append(
        f"{which}: MI-ZScore-EMA declined (at or below {1 - DROP:.0%} of "
        f"its running peak twice in a row) in {mi_fell} of {n} runs, success in {success_fell}."
    )
    answer.words += _trend_words(arm_trends(data, summary) if trends is None else trends)
    lead = leads["lead_steps"].dropna()
    if len(lead):
        answer.words.append(
            f"Where both declined ({len(lead)} runs), MI fell first in {int(counts.get('MI first', 0))}, success "
            f"first in {int(counts.get('success first', 0))}; median lead {_median(lead)} steps (positive: MI first)."
        )
    else:
        answer.words.append("No run saw both MI and success decline, so there is no lead to measure.")
    answer.brief = [answer.words[0], answer.words[-1]]  # the declines and the lead; the trends and the alert: the report
    answer.words.append(fired_text(data, leads))
    answer.words += [f"Its error rates: {line}." for line in alert_lines(rules_used(data))]
    answer.figure = figures.collapse_figure(data, summary)
    return answer


def predictor(summary: pd.DataFrame, effects: pd.DataFrame, predictions: pd.DataFrame | None) -> Answer:
    import pandas as pd

    from analysis.reports import figures
    from analysis.reports.tables import task_verdicts
    from analysis.stats.predictor_record import hit_rate_line, verdict_note

    answer = Answer(QUESTIONS[2])
    if predictions is None:
        answer.words.append("Not asked: the report was built without reading rollout batches (--no-rollouts).")
        return answer
    verdicts = task_verdicts(summary, predictions)
    if verdicts.empty:
        baseline = summary[summary["filtered"].eq(False).fillna(False)]
        cause = ("no run ran without the filter" if baseline.empty else
                 f"no baseline run dumped a rollout batch ({names.ROLLOUT_DIR}/step_NNNN.parquet; "
                 "trainer.dump_every > 0 writes them)")
        answer.words.append(f"Cannot say: {cause}.")
        return answer
    rows = []
    for _, said_row in verdicts.sort_values(["task", "variant"], kind="stable").iterrows():
        task, variant, said = said_row["task"], said_row["variant"], said_row["verdict"]
        mean = None if pd.isna(said_row["ratio_mean"]) else float(said_row["ratio_mean"])
        shown = "undefined (no prompt had reward variance)" if mean is None else f"{mean:.2f}"
        text = (f"{task}" + ("" if variant == "base" else f" · {variant}") + f": std(RV)/mean(RV) = {shown} on the "
                f"first rollout batch (mean of {said_row['batches']} baseline runs): {said} ({verdict_note()}).")
        measured = effects[(effects["task"] == task) & (effects["variant"] == variant)].dropna(subset=["delta"])
        for _, row in measured.iterrows():
            text += f" Measured with {row['filter']}: {row['delta']:+.1f} points"
            if min(row["base_n"], row["filt_n"]) >= 2 and not math.isnan(row["lo"]):
                text += f" [{row['lo']:+.1f}, {row['hi']:+.1f}]"
            text += "."
            rows.append({"task": task, "variant": variant, "verdict": said, "ratio_mean": mean,
                         "ratio_std": float(said_row["ratio_std"]), "gain": row["delta"]})
        if measured.empty:
            text += " No filtered run of this task to measure the effect against."
        answer.words.append(text)
    answer.brief = list(answer.words)
    answer.words.append(hit_rate_line())  # how often this verdict has been right on orch's own runs
    if rows:
        answer.figure = figures.predictor_figure(pd.DataFrame(rows))
    return answer


def answers(data: RunData, summary: pd.DataFrame, effects: pd.DataFrame,
            predictions: pd.DataFrame | None, trends: Readings | None = None) -> list[Answer]:
    """The three answers of the module docstring, in order (``trends``: as :func:`collapse` takes them)."""
    return [filtering(summary, effects), collapse(data, summary, trends), predictor(summary, effects, predictions)]
