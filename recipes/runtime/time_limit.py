"""`trainer.time_limit`: the run's wall-time budget, checked before each step (`TimeLimit`).

The torch trainer (`recipes.torch_trainer.trainer`) creates one at its start and, before each step, stops as on a stop
signal when the next step and a checkpoint would end past the limit; the veRL trainer reads it at the same point
(counted from the driver's start, `spent_s`, so the warm start and Ray's start-up count too). SLURM's own limit reaches both as SIGUSR2 (`recipes.runtime.stop`).
"""

from __future__ import annotations

import time


class TimeLimit:
    """`trainer.time_limit`: whether the next step (as long as the longest so far) and a checkpoint (as long as the
    longest so far; 5 s before the first) would end past the limit, counted from this object's creation."""

    MARGIN = 1.5  # the next step may be this much longer than the longest so far
    FIRST_CHECKPOINT_S = 5.0  # what a checkpoint is assumed to take before one was timed

    def __init__(self, limit_s: float | None, spent_s: float = 0.0) -> None:
        """`spent_s`: seconds of the limit already used before this object's creation (another process's)."""
        self.deadline = None if limit_s is None else time.monotonic() + limit_s - spent_s
        self.limit_s = limit_s
        self.step_s = 0.0
        self.checkpoint_s: float | None = None

    def took(self, step_s: float, checkpoint: float | None = None) -> None:
        self.step_s = max(self.step_s, step_s)
        if checkpoint is not None:
            self.checkpoint_s = max(self.checkpoint_s or 0.0, checkpoint)

    def would_overrun(self) -> str | None:
        """The reason to stop now, or None."""
        if self.deadline is None or self.step_s == 0.0:  # no limit, or no step measured yet
            return None
        left = self.deadline - time.monotonic()
        checkpoint = self.FIRST_CHECKPOINT_S if self.checkpoint_s is None else self.checkpoint_s
        if left >= self.step_s * self.MARGIN + checkpoint:
            return None
        return (f"time limit: {left:.0f} s of trainer.time_limit={self.limit_s:g} left, a step takes up to "
                f"{self.step_s:.1f} s")
