"""How training reports progress: a live bar (rich, on stderr) in a terminal, log lines in batch jobs."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from recipes.stats.rollout_stats import VAL_SUCCESS

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
        if VAL_SUCCESS in metrics:
            figures += f"  val {metrics[VAL_SUCCESS]:.2f}"
        self._progress.update(self._task, completed=step, figures=figures)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


# -- the progress file: what a running job shows in `orch status` and `orch sweep --wait` --------------------------

PROGRESS_FILE = "progress.json"
# The trainers' timed phases (`timing_s/<name>`) as the user reads them.
PHASES = {"gen": "rollout", "diagnostics": "diagnostics", "filter": "filter", "old_log_prob": "scoring",
          "ref": "scoring", "values": "scoring", "adv": "scoring", "update_critic": "update",
          "update_actor": "update", "val": "validation"}
_REPORTER: ContextVar[ProgressFile | None] = ContextVar("orch_progress", default=None)


class ProgressFile:
    """A run's progress as one small JSON file, `<folder>/progress.json`, replaced whole at every change: `step`
    (the step in progress, or the last one done), `done` (steps completed), `total`, `phase` (warm start, rollout,
    diagnostics, filter, scoring, update, validation, done), `success` (the last step's rollout success rate) and
    `time`. Both trainers write it (the verl backend from veRL's TaskRunner); a sweep job's heartbeat copies it into
    the store for `orch status` and `orch sweep --wait`. Writing never fails a run."""

    def __init__(self, folder: Path | None, total: int, done: int = 0) -> None:
        self.path = None if folder is None else Path(folder) / PROGRESS_FILE
        self.state: dict[str, Any] = {"step": done, "done": done, "total": total, "phase": "starting",
                                      "success": None}

    def update(self, **fields: Any) -> None:
        self.state.update(fields, time=time.time())
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            scratch = self.path.with_suffix(f".{os.getpid()}.tmp")
            scratch.write_text(json.dumps(self.state))
            os.replace(scratch, self.path)
        except OSError:  # a full or read-only disk must not end the run over a progress line
            pass


@contextmanager
def reporting(progress: ProgressFile) -> Iterator[ProgressFile]:
    """Make `progress` the one `report` writes to while the block runs."""
    token = _REPORTER.set(progress)
    try:
        yield progress
    finally:
        _REPORTER.reset(token)


def report(**fields: Any) -> None:
    """Update the current run's progress file (a no-op outside `reporting`); `phase` may be a timed-phase name."""
    progress = _REPORTER.get()
    if progress is not None:
        if "phase" in fields:
            fields["phase"] = PHASES.get(fields["phase"], fields["phase"])
        progress.update(**fields)


def read_progress(folder: Path | str | None) -> dict[str, Any] | None:
    """The progress a run in `folder` wrote last (None if none, or unreadable mid-replace)."""
    if folder is None:
        return None
    try:
        return json.loads((Path(folder) / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
