"""TEST-ONLY trainer backend `orch-test`: exercises executors and state transitions without torch.

It is NOT a stand-in for the real trainer (the end-to-end tests use the torch backend). It counts steps, logs one
metric per step to the cell's pre-created MLflow run (through `recipes.run.tracking.RunTracker`, as the real backend
does), writes its step to `trainer.checkpoint_dir` and resumes from it, reports its step and phase in the progress
file (`recipes.run.progress`, as the real trainers do), and honours `should_stop` like the real trainer: stop at the
next step boundary and return `preempted`.

It also logs `test/score` = step x (1 - |filter.value - 0.8|): an objective whose optimum is known, for the
`orch tune` tests. Knobs (environment, test-only): ORCH_TEST_STEP_S seconds per step (default 0.05); ORCH_TEST_FAIL_SEED makes the
cell with that seed raise while the file named by ORCH_TEST_FAIL_FLAG exists (delete it to "fix the bug");
ORCH_TEST_GATE names a JSON file `{run id or "*": highest step allowed}` (see `tests/orchestrator/gate.py`): a step
starts only once the gate allows it, so a test decides when each step may run instead of racing sleeps against
the machine's speed. While it waits at the gate the job still honours a stop request.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from recipes.config.backends import register_backend
from recipes.runtime.result import TrainResult

NAME = "orch-test"


@register_backend(NAME)
def run(cfg, should_stop=None) -> TrainResult:
    """Count `trainer.total_steps` steps, resuming from the checkpoint folder, inside `recipes.run.tracking.tracked_run`
    as the real backends do (so a tracking-store outage buffers, spills and stops the same way)."""
    from recipes.run.tracking import tracked_run

    folder = Path(cfg.infra.checkpoint_dir) if cfg.infra.checkpoint_dir else None
    asked = should_stop or (lambda: False)
    return tracked_run(cfg.infra, None, folder, lambda tracker: _train(
        cfg, tracker, folder or Path("checkpoints") / tracker.run_id, lambda: asked() or tracker.store_down))


def _train(cfg, tracker, folder: Path, should_stop) -> TrainResult:
    from recipes.run.progress import ProgressFile

    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "step.txt"
    start = int(checkpoint.read_text()) if checkpoint.exists() else 0
    flag = os.environ.get("ORCH_TEST_FAIL_FLAG")
    if os.environ.get("ORCH_TEST_FAIL_SEED") == str(cfg.seed) and flag and Path(flag).exists():
        raise RuntimeError(f"orch-test backend: failing seed {cfg.seed} on purpose")
    step_s = float(os.environ.get("ORCH_TEST_STEP_S", "0.05"))
    total = int(cfg.trainer.total_steps)
    progress = ProgressFile(folder, total, start)
    score_scale = 1.0 - abs(float(cfg.filter.value) - 0.8)  # `orch tune` tests: best at filter.value 0.8
    for step in range(start + 1, total + 1):
        if not _wait_at_gate(tracker.run_id, step, should_stop):
            return TrainResult("preempted", step - 1, tracker.run_id, f"checkpointed at step {step - 1}")
        progress.update(step=step, phase="update")
        time.sleep(step_s)
        tracker.log_metrics({"test/step": step, "test/pid": os.getpid(), "test/resumed_from": start,
                             "test/score": step * score_scale}, step)
        checkpoint.write_text(str(step))
        progress.update(done=step, phase="logging", success=step / total)
        if should_stop() and step < total:
            return TrainResult("preempted", step, tracker.run_id, f"checkpointed at step {step}")
    return TrainResult("finished", total, tracker.run_id)


GATE_TIMEOUT_S = 300.0


def _wait_at_gate(run_id: str, step: int, should_stop) -> bool:
    """Block until the gate (ORCH_TEST_GATE) allows `step` for this run; False when a stop was requested meanwhile.
    No gate set: True at once. A gate never opened within GATE_TIMEOUT_S is a broken test: raise."""
    path = os.environ.get("ORCH_TEST_GATE")
    if not path:
        return True
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while True:
        try:
            allowed = json.loads(Path(path).read_text() or "{}")
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or caught mid-write
            allowed = {}
        if int(allowed.get(run_id, allowed.get("*", 0))) >= step:
            return True
        if should_stop is not None and should_stop():
            return False
        if time.monotonic() > deadline:
            raise RuntimeError(f"orch-test backend: the gate {path} never allowed step {step} of run {run_id}")
        time.sleep(0.02)
