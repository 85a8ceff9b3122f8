"""Template-collapse early warning: an online rule over the MI proxies (RAGEN-2 (arXiv 2604.06268): MI falls before success).

The rule, evaluated every time the MI proxies are computed (step 1 and every ``mi_every`` steps):

1. Track the running peak of two signals: MI-ZScore-EMA, and retrieval accuracy's excess over chance
   (:func:`recipes.stats.mi.retrieval_excess`).
2. A signal has *fallen* when it is at or below ``(1 - drop_fraction) * peak`` (peaks must be positive).
3. Raise the alert when **both** signals have fallen on ``patience`` consecutive computations, after at least
   ``min_points`` computations, **while task success has not yet fallen**: the latest validation success is
   above ``success_peak - success_tolerance`` (or no validation has run yet). That is the early-warning case the
   paper describes; once success has dropped too the collapse is no longer early news.

The alert latches: it is raised once (``new_alert``) and stays on. Its state travels with checkpoints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict

from orchlib.fields import integer, number
from recipes.stats.mi import retrieval_excess


class CollapseRule(BaseModel):
    """Knobs of the early-warning rule (defaults: a 30% fall from the peak, seen twice in a row); the config's
    `diagnostics.rule` section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    drop_fraction: Annotated[float, number(lambda v: 0.0 < v < 1.0,
                                           "in (0, 1) (the share of its peak a collapse signal must lose)")] = 0.3
    patience: Annotated[int, integer(1, "collapse computations in a row with both signals fallen")] = 2
    min_points: Annotated[int, integer(1, "collapse computations before the alert may fire")] = 3
    success_tolerance: Annotated[float, number(
        lambda v: v >= 0.0, ">= 0 (how far success may fall below its peak before a collapse warning is moot)")] = 0.05


@dataclass(frozen=True)
class CollapseStatus:
    """The detector's view after one update."""

    alert: bool
    new_alert: bool
    mi_drop: float  # fraction of the MI-ZScore-EMA peak lost, in [0, 1] (0 at the peak)
    retrieval_drop: float
    reason: str


@dataclass
class CollapseDetector:
    """Online detector; feed it every MI computation with :meth:`update`."""

    rule: CollapseRule = field(default_factory=CollapseRule)
    points: int = 0
    mi_peak: float = float("-inf")
    retrieval_peak: float = float("-inf")
    success_peak: float = float("-inf")
    fallen_streak: int = 0
    alert_step: int | None = None

    @staticmethod
    def _drop(value: float, peak: float) -> float:
        return 0.0 if peak <= 0.0 else max(0.0, 1.0 - value / peak)

    def update(
        self, step: int, mi_zscore_ema: float, retrieval_acc: float, retrieval_chance: float, success: float | None
    ) -> CollapseStatus:
        """Fold in one computation of the proxies; ``success`` is the latest validation success rate (or None)."""
        excess = retrieval_excess(retrieval_acc, retrieval_chance)
        self.points += 1
        self.mi_peak = max(self.mi_peak, mi_zscore_ema)
        self.retrieval_peak = max(self.retrieval_peak, excess)
        if success is not None:
            self.success_peak = max(self.success_peak, success)
        mi_drop = self._drop(mi_zscore_ema, self.mi_peak)
        retrieval_drop = self._drop(excess, self.retrieval_peak)
        fallen = min(mi_drop, retrieval_drop) >= self.rule.drop_fraction
        self.fallen_streak = self.fallen_streak + 1 if fallen else 0
        success_holding = success is None or success > self.success_peak - self.rule.success_tolerance

        new_alert = (
            self.alert_step is None
            and self.points >= self.rule.min_points
            and self.fallen_streak >= self.rule.patience
            and success_holding
        )
        if new_alert:
            self.alert_step = step
        reason = ""
        if self.alert_step is not None:
            reason = (
                f"template-collapse warning since step {self.alert_step}: MI-ZScore-EMA is {mi_drop:.0%} below its "
                f"peak ({mi_zscore_ema:.3f} vs {self.mi_peak:.3f}) and retrieval's excess over chance is "
                f"{retrieval_drop:.0%} below its peak, while validation success has not fallen"
            )
        return CollapseStatus(
            alert=self.alert_step is not None,
            new_alert=new_alert,
            mi_drop=mi_drop,
            retrieval_drop=retrieval_drop,
            reason=reason,
        )

    def state_dict(self) -> dict:
        state = asdict(self)
        state["rule"] = self.rule.model_dump()
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, CollapseRule(**value) if name == "rule" else value)
