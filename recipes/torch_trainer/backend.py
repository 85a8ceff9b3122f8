"""The `torch` trainer backend: one process, CPU or one GPU, veRL's algorithm math, SNR-Aware Filtering. Its loop is
`recipes.torch_trainer.trainer` (read it top to bottom).

`run(cfg, should_stop)`, in the job's process (registered as backend `torch`: `recipes.config.backends`):

    1 the device checked, the threads set (`trainer.threads`, else `available_cpus`)
    2 the checkpoint folder: the scratch a previous writer left half-written removed; with `trainer.resume=auto` its
      latest checkpoint loaded, refused (`check_resumable`) when written under another model or algorithm
    3 the cell's MLflow run (the configured one, else the checkpoint's, else a new one: `recipes.run.tracking`)
    4 the loop (`recipes.torch_trainer.trainer.train`): setup, resume or validate at step 0, the steps; `should_stop`
      (a stop signal, or the tracking store down) is polled at step boundaries and inside the steps

Checkpoints are orch's own (`recipes.runtime.checkpoint`), in `trainer.checkpoint_dir` (default
`checkpoints/<mlflow run id>`); a run started again with the same folder resumes after its last checkpoint, into the
same MLflow run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from orchlib.errors import OrchError
from recipes.config.schema import TrainConfig
from recipes.run.tracking import tracked_run
from recipes.runtime.checkpoint import latest_checkpoint, load_checkpoint, remove_scratch
from recipes.runtime.result import TrainResult
from recipes.torch_trainer.trainer import train

log = logging.getLogger(__name__)


def available_cpus() -> int:
    """CPU cores this run may use: `$ORCH_CPUS` (set by the local sweep executor to the cell's share), else
    `$SLURM_CPUS_PER_TASK`, else every core this process may run on."""
    for name in ("ORCH_CPUS", "SLURM_CPUS_PER_TASK"):
        if os.environ.get(name, "").isdigit():
            return max(1, int(os.environ[name]))
    return len(os.sched_getaffinity(0))


def run(cfg: TrainConfig, should_stop: Callable[[], bool] | None = None) -> TrainResult:
    """Train `cfg` (see the module docstring). `should_stop` is polled at step boundaries: when it returns True the
    run checkpoints and returns status 'preempted'."""
    if cfg.trainer.device.startswith("cuda") and not torch.cuda.is_available():
        raise OrchError(f"config key trainer.device: {cfg.trainer.device!r} but no CUDA device is available")
    should_stop = should_stop or (lambda: False)
    infra = cfg.infra
    torch.set_num_threads(int(infra.threads or available_cpus()))

    checkpoint_dir = Path(infra.checkpoint_dir) if infra.checkpoint_dir else None
    if checkpoint_dir and checkpoint_dir.is_dir():  # this run is the folder's one writer (`run_training`'s lease)
        for name in remove_scratch(checkpoint_dir):
            log.info("removed %s: a checkpoint a previous writer left half-written", name)
    latest = latest_checkpoint(checkpoint_dir) if checkpoint_dir and infra.resume == "auto" else None
    resumed = load_checkpoint(latest) if latest else None
    if resumed is not None:
        check_resumable(cfg, resumed, latest)
    return tracked_run(infra, resumed["mlflow_run_id"] if resumed else None, checkpoint_dir, lambda tracker: train(
        cfg, tracker, checkpoint_dir or Path("checkpoints") / tracker.run_id, resumed,
        lambda: should_stop() or tracker.store_down))


# What a checkpoint's weights are shaped by: a resume under other values of these cannot load them.
RESUME_MUST_MATCH = (("model", "name"), ("model", "path"), ("model", "preset"), ("algorithm", "name"))


def check_resumable(cfg: TrainConfig, resumed: dict[str, Any], folder: Path) -> None:
    """OrchError (one line, before anything is written) when the checkpoint in `folder` was written under another
    model or algorithm than `cfg` (its weights or its critic would not fit); other changes (steps, learning rate)
    resume as asked."""
    saved = yaml.safe_load(resumed.get("config") or "{}") or {}
    tree = cfg.to_tree()
    for section, key in RESUME_MUST_MATCH:
        before, now = (saved.get(section) or {}).get(key), tree[section].get(key)
        if before == now:
            continue
        name = f"{section}.{key}"
        if isinstance(before, dict) and isinstance(now, dict):  # name the first differing sub-key, not the dicts
            sub = next(k for k in [*before, *now] if before.get(k) != now.get(k))
            name, before, now = f"{name}.{sub}", before.get(sub), now.get(sub)
        raise OrchError(
            f"config key trainer.checkpoint_dir {str(folder.parent)!r}: its checkpoint {folder.name} was written with "
            f"{name}={before!r}, this run has {now!r}; resume with the same {name}, or use another "
            "trainer.checkpoint_dir (or trainer.resume=never to start over there)")
