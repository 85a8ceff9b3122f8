"""Checkpoints of a training run, and the requeue contract with the orchestrator.

On SIGUSR2 or SIGTERM (SLURM's pre-emption / time-limit warning; `recipes.stop.StopRequest`) the trainer stops: it
saves a checkpoint at the next step boundary and the process exits with `REQUEUE_EXIT_CODE`, which the orchestrator reads
as "requeue me". The next attempt finds the checkpoint in `trainer.checkpoint_dir` and continues the same MLflow
run from the step after it.

Layout: `<checkpoint_dir>/step_000010/state.pt` (one `torch.save` dict: model and optimiser states, RNG states,
trainer counters, diagnostic trackers, the MLflow run id, the resolved config) and `<checkpoint_dir>/latest`
naming the newest complete one. Writes are atomic (temporary folder, then rename); older checkpoints are pruned.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"
STATE_FILE = "state.pt"
LATEST_FILE = "latest"


def rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write `state` as the checkpoint of `step`, point `latest` at it, keep the newest `keep` checkpoints."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step:06d}"
    scratch = directory / f".step_{step:06d}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    torch.save({**state, "rng": rng_states(), "step": step}, scratch / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)
    pointer = directory / f".{LATEST_FILE}.tmp-{os.getpid()}"
    pointer.write_text(final.name)
    os.replace(pointer, directory / LATEST_FILE)
    for old in sorted(directory.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint folder in `directory`, or None."""
    pointer = directory / LATEST_FILE
    if not pointer.is_file():
        return None
    folder = directory / pointer.read_text().strip()
    return folder if (folder / STATE_FILE).is_file() else None


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """The state dict saved by `save_checkpoint` (RNG states not yet restored; see `restore_rng_states`)."""
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)
