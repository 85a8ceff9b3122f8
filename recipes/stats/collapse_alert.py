"""The collapse alert: an online rule over the MI proxies (RAGEN-2 (arXiv 2604.06268): MI falls before success).

The rule, evaluated every time the MI proxies are computed (step 1 and every ``mi_every`` steps):

1. Track a reference level of two signals: MI-ZScore-EMA, and retrieval accuracy's excess over chance
   (:func:`recipes.stats.mi.retrieval_excess`). ``reference: peak`` -- the running peak; ``reference: baseline``
   -- the mean of the first ``min_points`` computations (the policy before any collapse the rule could report; the
   alert may fire from the computation after them).
2. A signal has *fallen* when it is at or below ``(1 - drop_fraction) * reference`` (the reference must be positive).
3. ``signals`` says which must have fallen: ``both`` (MI-ZScore-EMA and retrieval excess), ``mi``, ``retrieval`` or
   ``either``. Raise the alert when they have fallen on ``patience`` consecutive computations, after at least
   ``min_points`` computations, **while task success has not yet fallen**: the latest validation success is
   above ``success_peak - success_tolerance`` (or no validation has run yet). That is the early-warning case the
   paper describes; once success has dropped too the collapse is no longer early news (``success_tolerance`` >= 1
   turns the guard off).

The defaults are the rule chosen offline from planted and honest runs (`analysis.stats.collapse_alert_calibration`,
docs/diagnostics.md#the-collapse-alerts-error-rates); :data:`LEGACY_RULE` is the rule before that choice, which every cell
planned before it ran with. The rates measured there are recorded beside the rule, in :data:`RATES`
(``collapse_alert_rates.yaml``, written by ``benchmarks/bench_collapse_alert.py --record``; `analysis` reads the same file), so
the alert a run prints while training names its rule and its measured rates (:func:`rates_line`).

The alert latches: it is raised once (``new_alert``) and stays on. Its state travels with checkpoints.

:func:`decline_onset` is the same rule on one logged series (steps 1, 2 and the ``patience`` / ``min_points`` gate;
no success guard): `analysis.stats.early_warning` dates MI's and success's declines with it, so the paper's "MI falls
before success" is measured with the rule the alert runs, not with a copy of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from orchlib.fields import integer, number
from recipes.stats.mi import retrieval_excess


class CollapseRule(BaseModel):
    """Knobs of the collapse alert's rule (defaults: MI-ZScore-EMA 40% below its early level on two computations in a
    row, no success guard, chosen offline -- module docstring); the config's `diagnostics.rule` section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    drop_fraction: Annotated[float, number(lambda v: 0.0 < v < 1.0,
                                           "in (0, 1) (the share of its reference a collapse signal must lose)")] = 0.4
    patience: Annotated[int, integer(1, "collapse computations in a row with the signals fallen")] = 2
    min_points: Annotated[int, integer(1, "collapse computations before the alert may fire")] = 3
    success_tolerance: Annotated[float, number(
        lambda v: v >= 0.0, ">= 0 (how far success may fall below its peak before the collapse alert is moot)")] = 1.0
    signals: Literal["both", "mi", "retrieval", "either"] = "mi"
    reference: Literal["peak", "baseline"] = "baseline"

    # Keys added after cells had run with the rule (`recipes.config.schema.config_digest` leaves them out of a cell's
    # identity while they hold these values, which reproduce the rule as it was before them).
    late_keys: ClassVar[dict[str, object]] = {"signals": "both", "reference": "peak"}

    def level(self, peak: float, first_total: float, count: int) -> float:
        """The level a series is measured against after ``count`` values: its running ``peak`` (reference: peak), or
        the mean of its first ``min_points`` values, whose sum is ``first_total`` (reference: baseline)."""
        return peak if self.reference == "peak" else first_total / min(count, self.min_points)

    def fallen(self, drop: float) -> bool:
        """Whether a signal that lost ``drop`` (a share of its level, :func:`drop_below`) has fallen."""
        return drop >= self.drop_fraction

    def settled(self, count: int) -> bool:
        """Whether ``count`` values are enough for the rule to fire (a whole baseline before, under reference:
        baseline)."""
        return count >= self.min_points + (self.reference == "baseline")


def drop_below(value: float, level: float) -> float:
    """The share of ``level`` that ``value`` has lost, in [0, 1]: 0 at or above it, and 0 for a level that is not
    positive (nothing to fall from)."""
    return 0.0 if level <= 0.0 else max(0.0, 1.0 - value / level)


# The rule every cell ran with before the offline choice (issue 46): both signals 30% below their running peaks twice
# in a row, after 3 computations, while success holds within 0.05.
LEGACY_RULE = CollapseRule(drop_fraction=0.3, patience=2, min_points=3, success_tolerance=0.05, signals="both",
                           reference="peak")

# The measured error rates of the shipped rule and of LEGACY_RULE (analysis.stats.collapse_alert_calibration's record): one file,
# read here for the training-time alert line and by analysis for every report.
RATES = Path(__file__).with_name("collapse_alert_rates.yaml")
SIGNAL_NAMES = {"both": "MI-ZScore-EMA and retrieval excess both", "mi": "MI-ZScore-EMA", "retrieval":
                "retrieval excess", "either": "MI-ZScore-EMA or retrieval excess"}


def rule_text(rule: CollapseRule) -> str:
    """`MI-ZScore-EMA 40% below the mean of the first 3 computations on 2 computations in a row, no success guard`."""
    level = "running peak" if rule.reference == "peak" else f"mean of the first {rule.min_points} computations"
    guard = ("no success guard" if rule.success_tolerance >= 1 else
             f"while success is within {rule.success_tolerance:g} of its peak")
    return (f"{SIGNAL_NAMES[rule.signals]} {rule.drop_fraction:.0%} below the {level} on {rule.patience} computation"
            f"{'s' if rule.patience > 1 else ''} in a row, {guard}")


def recorded_rates(path: Path = RATES) -> dict:
    """The recorded rates file ({} when there is none): parsed once per version of the file
    (`orchlib.records.recorded_yaml`; a report reads it for every decline it judges), a copy returned."""
    import copy

    from orchlib.records import recorded_yaml

    return copy.deepcopy(recorded_yaml(path))


def rates_line(rule: CollapseRule, record: dict | None = None) -> str:
    """The rule and its measured error rates in one line, for the training-time alert: the shipped rule's on the
    runs held out from its choice, the legacy rule's over every run, or that a rule has none."""
    record = recorded_rates() if record is None else record
    entry, where = None, ""
    if record and rule == CollapseRule(**record["rule"]):
        entry, where = record["held_out"], "on runs held out from its choice"
    elif record and rule == CollapseRule(**record["legacy"]["rule"]):
        entry, where = record["legacy"]["all"], "over every calibration run (the rule before the offline choice)"
    if entry is None:
        return f"rule: {rule_text(rule)}; no measured error rates for this rule (docs/diagnostics.md)"
    steps = entry.get("watched_steps")
    per_step = (f", {100 * entry['false_alarms'] / steps:.2f} per 100 steps watched" if steps else "")
    return (f"rule: {rule_text(rule)}; measured {where}: false alarms in {entry['false_alarms']} of "
            f"{entry['honest']} runs with nothing to detect{per_step}; planted collapses (strength >= 0.5) detected "
            f"within 5 steps in {entry['detected']} of {entry['strong']} (docs/diagnostics.md#the-collapse-alerts-error-rates)")


@dataclass(frozen=True)
class CollapseStatus:
    """The alert's view after one update."""

    alert: bool
    new_alert: bool
    mi_drop: float  # fraction of the MI-ZScore-EMA reference lost, in [0, 1] (0 at or above it)
    retrieval_drop: float
    reason: str


@dataclass
class CollapseAlert:
    """The collapse alert, online; feed it every MI computation with :meth:`update`."""

    rule: CollapseRule = field(default_factory=CollapseRule)
    points: int = 0
    mi_peak: float = float("-inf")
    retrieval_peak: float = float("-inf")
    success_peak: float = float("-inf")
    mi_sum: float = 0.0  # the first min_points values (reference: baseline)
    retrieval_sum: float = 0.0
    fallen_streak: int = 0
    alert_step: int | None = None

    def update(
        self, step: int, mi_zscore_ema: float, retrieval_acc: float, retrieval_chance: float, success: float | None
    ) -> CollapseStatus:
        """Fold in one computation of the proxies; ``success`` is the latest validation success rate (or None)."""
        excess = retrieval_excess(retrieval_acc, retrieval_chance)
        self.points += 1
        self.mi_peak = max(self.mi_peak, mi_zscore_ema)
        self.retrieval_peak = max(self.retrieval_peak, excess)
        if self.points <= self.rule.min_points:
            self.mi_sum += mi_zscore_ema
            self.retrieval_sum += excess
        if success is not None:
            self.success_peak = max(self.success_peak, success)
        mi_ref, retrieval_ref = self.references()
        mi_drop = drop_below(mi_zscore_ema, mi_ref)
        retrieval_drop = drop_below(excess, retrieval_ref)
        drops = {"both": min(mi_drop, retrieval_drop), "mi": mi_drop, "retrieval": retrieval_drop,
                 "either": max(mi_drop, retrieval_drop)}
        fallen = self.rule.fallen(drops[self.rule.signals])
        self.fallen_streak = self.fallen_streak + 1 if fallen else 0
        success_holding = success is None or success > self.success_peak - self.rule.success_tolerance

        new_alert = (
            self.alert_step is None
            and self.rule.settled(self.points)
            and self.fallen_streak >= self.rule.patience
            and success_holding
        )
        if new_alert:
            self.alert_step = step
        reason = ""
        if self.alert_step is not None:
            reason = f"collapse alert since step {self.alert_step}: {self.checked(mi_drop, retrieval_drop)}"
        return CollapseStatus(
            alert=self.alert_step is not None,
            new_alert=new_alert,
            mi_drop=mi_drop,
            retrieval_drop=retrieval_drop,
            reason=reason,
        )

    def checked(self, mi_drop: float, retrieval_drop: float) -> str:
        """What the rule read, in words: only the signals ``rule.signals`` names, and the success guard only when it
        is on (with success >= 1 off, the alert says nothing about success)."""
        level = "running peak" if self.rule.reference == "peak" else "early level"
        mi_ref, retrieval_ref = self.references()
        read = {"mi": [f"MI-ZScore-EMA {mi_drop:.0%} below its {level} ({mi_ref:.3f})"],
                "retrieval": [f"retrieval's excess over chance {retrieval_drop:.0%} below its {level}"]}
        parts = {"both": read["mi"] + read["retrieval"], "either": read["mi"] + read["retrieval"]}.get(
            self.rule.signals, read.get(self.rule.signals, []))
        joint = {"both": " and ", "either": " or "}.get(self.rule.signals, "")
        text = (f"{joint.join(parts)} (at least {self.rule.drop_fraction:.0%} below on {self.rule.patience} "
                f"computation{'s' if self.rule.patience > 1 else ''} in a row)")
        if self.rule.success_tolerance < 1:
            text += f", while success was within {self.rule.success_tolerance:g} of its peak"
        else:
            text += "; success is not checked by this rule"
        return text

    def references(self) -> tuple[float, float]:
        """The levels MI-ZScore-EMA and retrieval excess are measured against (see ``reference``)."""
        return (self.rule.level(self.mi_peak, self.mi_sum, self.points),
                self.rule.level(self.retrieval_peak, self.retrieval_sum, self.points))

    def state_dict(self) -> dict:
        state = asdict(self)
        state["rule"] = self.rule.model_dump()
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, CollapseRule(**value) if name == "rule" else value)


def decline_onset(steps: Sequence[int], values: Sequence[float], rule: CollapseRule) -> int | None:
    """The step at which one logged series' decline began under ``rule``, or None if it never declined: the first of
    ``patience`` values in a row each fallen below the series' level (:meth:`CollapseRule.level`, counted up to that
    value), once ``rule.settled``. ``steps`` ascending; NaN values are skipped (they are not computations)."""
    peak, first_total, streak = float("-inf"), 0.0, 0
    kept = [(int(step), float(value)) for step, value in zip(steps, values, strict=True) if math.isfinite(value)]
    for count, (_, value) in enumerate(kept, start=1):
        peak = max(peak, value)
        if count <= rule.min_points:
            first_total += value
        streak = streak + 1 if rule.fallen(drop_below(value, rule.level(peak, first_total, count))) else 0
        if rule.settled(count) and streak >= rule.patience:
            return kept[count - rule.patience][0]
    return None
