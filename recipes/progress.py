"""How training reports progress: a live bar (rich, on stderr) in a terminal, log lines in batch jobs."""

from __future__ import annotations

import logging
from typing import Any

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging() -> None:
    """INFO log lines on stderr (the trainer's one line per step when the bar is off); no-op if already set up."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


class TrainProgress:
    """Context manager; `update(step, metrics)` after each step. Does nothing when `enabled` is false."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool = True) -> None:
        self.enabled = enabled
        self.total_steps = total_steps
        self.start_step = start_step
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[figures]}"), console=Console(stderr=True),
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total_steps, completed=self.start_step, figures=""
            )
        return self

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if self._progress is None:
            return
        figures = (
            f"success {metrics.get('rollout/success_rate', float('nan')):.2f}"
            f"  kept {metrics.get('rollout/kept_ratio', 1.0):.2f}"
            f"  step {metrics.get('timing_s/step', float('nan')):.1f}s"
        )
        if "val/success_rate" in metrics:
            figures += f"  val {metrics['val/success_rate']:.2f}"
        self._progress.update(self._task, completed=step, figures=figures)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
