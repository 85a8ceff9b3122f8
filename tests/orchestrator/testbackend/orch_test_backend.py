"""TEST-ONLY trainer backend `orch-test`: exercises executors and state transitions without torch.

It is NOT a stand-in for the real trainer (the end-to-end tests use the torch backend). It counts steps, logs one
metric per step to the cell's pre-created MLflow run (through `recipes.tracking.RunTracker`, as the real backend
does), writes its step to `trainer.checkpoint_dir` and resumes from it, reports its step and phase in the progress
file (`recipes.progress`, as the real trainers do), and honours `should_stop` like the real trainer: stop at the
next step boundary and return `preempted`.

It also logs `test/score` = step x (1 - |filter.value - 0.8|): an objective whose optimum is known, for the
`orch tune` tests. Knobs (environment, test-only): ORCH_TEST_STEP_S seconds per step (default 0.05); ORCH_TEST_FAIL_SEED makes the
cell with that seed raise while the file named by ORCH_TEST_FAIL_FLAG exists (delete it to "fix the bug").
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from recipes.backends import TrainResult, register_backend

NAME = "orch-test"


@register_backend(NAME)
def run(cfg, should_stop=None) -> TrainResult:
    """Count `trainer.total_steps` steps, resuming from the checkpoint folder."""
    from recipes.progress import ProgressFile
    from recipes.tracking import RunTracker, default_tracking_uri

    mlflow = cfg.infra.mlflow
    tracker = RunTracker(default_tracking_uri(mlflow.tracking_uri), mlflow.experiment_name, mlflow.run_id)
    folder = Path(cfg.infra.checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "step.txt"
    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    flag = os.environ.get("ORCH_TEST_FAIL_FLAG")
    if os.environ.get("ORCH_TEST_FAIL_SEED") == str(cfg.seed) and flag and Path(flag).exists():
        tracker.end("FAILED")
        raise RuntimeError(f"orch-test backend: failing seed {cfg.seed} on purpose")
    step_s = float(os.environ.get("ORCH_TEST_STEP_S", "0.05"))
    total = int(cfg.trainer.total_steps)
    progress = ProgressFile(folder, total, start)
    score_scale = 1.0 - abs(float(cfg.filter.value) - 0.8)  # `orch tune` tests: best at filter.value 0.8
    for step in range(start + 1, total + 1):
        progress.update(step=step, phase="update")
        time.sleep(step_s)
        tracker.log_metrics({"test/step": step, "test/pid": os.getpid(), "test/resumed_from": start,
                             "test/score": step * score_scale}, step)
        checkpoint.write_text(str(step))
        progress.update(done=step, phase="logging", success=step / total)
        if should_stop is not None and should_stop() and step < total:
            return TrainResult("preempted", step, tracker.run_id, f"checkpointed at step {step}")
    tracker.end("FINISHED")
    return TrainResult("finished", total, tracker.run_id)
