"""Checkpoints of a training run, and the requeue contract with the orchestrator.

On SIGUSR2 or SIGTERM (SLURM's pre-emption / time-limit warning; `recipes.runtime.stop.StopRequest`) the trainer stops: it
ends its current work (`recipes.runtime.stop`), saves a checkpoint at its last completed step and the process exits with `REQUEUE_EXIT_CODE`, which the orchestrator reads
as "requeue me". The next attempt finds the checkpoint in `trainer.checkpoint_dir` and continues the same MLflow
run from the step after it.

Layout: `<checkpoint_dir>/step_000010/state.pt` (one `torch.save` dict: model and optimiser states, RNG states,
trainer counters, diagnostic trackers, the MLflow run id, the resolved config) and `<checkpoint_dir>/latest`
naming the newest complete one. Writes are atomic (temporary folder, then rename); older checkpoints are pruned.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchlib.errors import DISK_FULL_ERRNOS

REQUEUE_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"
STATE_FILE = "state.pt"
LATEST_FILE = "latest"
VERL_STATE_FILE = "orch_state.json"  # orch's state beside a veRL checkpoint's actor (global_step_N/orch_state.json)
VERL_ITERATION_FILE = "latest_checkpointed_iteration.txt"  # veRL's pointer to its newest checkpoint (its step)
BEST_DIR = "best"  # <checkpoint_dir>/best/step_N: the policy at the run's peak validation success so far


def rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


DISK_FULL_FREE_BYTES = 16 * 2 ** 20  # a write that failed with less free than this ran out of space


def save_checkpoint(directory: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write `state` as the checkpoint of `step`, point `latest` at it, keep the newest `keep` checkpoints.

    All or nothing: the state is written to a scratch folder, flushed to disk (`fsync`), renamed into place, and only
    then does `latest` point at it. A failed write removes its scratch folder and leaves `latest` as it was.

    Raises:
        OSError: ENOSPC, naming the folder and the step, when the disk is full (also when torch reports it as a
            C++ stream error: judged by the free space left at the failure); any other write error as raised.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step_{step:06d}"
    scratch = directory / f".step_{step:06d}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        scratch.mkdir()
        torch.save({**state, "rng": rng_states(), "step": step}, scratch / STATE_FILE)
        _fsync(scratch / STATE_FILE)
        _fsync(scratch)
    except (OSError, RuntimeError) as err:
        full = _disk_full(err, directory)
        shutil.rmtree(scratch, ignore_errors=True)
        if full:
            previous = latest_checkpoint(directory)
            kept = f"the checkpoint {previous.name} stays the latest" if previous else "no earlier checkpoint"
            raise OSError(errno.ENOSPC, f"No space left on device while writing the checkpoint of step {step} "
                                        f"({kept})", str(directory)) from None
        raise
    shutil.rmtree(final, ignore_errors=True)
    scratch.rename(final)
    pointer = directory / f".{LATEST_FILE}.tmp-{os.getpid()}"
    pointer.write_text(final.name)
    _fsync(pointer)
    os.replace(pointer, directory / LATEST_FILE)
    _fsync(directory)
    for old in sorted(directory.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


CHECKPOINT_BYTES_PER_PARAMETER = 12  # fp32 weights and AdamW's two fp32 moments, for the policy and for a critic


def checkpoint_bytes(parameters: int, critic: bool) -> int:
    """About what one checkpoint of a model of `parameters` takes on disk (a critic doubles it)."""
    return CHECKPOINT_BYTES_PER_PARAMETER * parameters * (2 if critic else 1)


def check_free_space(directory: Path, need: int, key: str) -> None:
    """OrchError (one line, naming `key`) unless the file system holding `directory` (or its nearest existing
    ancestor: nothing is created) has at least `need` bytes free: a run that could not write one checkpoint would
    train for nothing."""
    from orchlib.errors import OrchError

    probe = directory
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise OrchError(f"{key} {str(directory)!r}: {free / 2**20:.1f} MiB free on its file system, but one checkpoint "
                        f"needs about {need / 2**20:.1f} MiB; free some space or choose another folder")


def remove_scratch(directory: Path) -> list[str]:
    """Remove the scratch folders and pointer files that writers which died mid-checkpoint left in `directory`
    (call it only as the folder's one writer: `orchlib.lease`). Returns their names."""
    gone = []
    for path in [*directory.glob(".step_*.tmp-*"), *directory.glob(f".{LATEST_FILE}.tmp-*")]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        gone.append(path.name)
    return gone


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's entries to disk (a folder: so a rename survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _disk_full(err: BaseException, directory: Path) -> bool:
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        return True
    try:
        return shutil.disk_usage(directory).free < DISK_FULL_FREE_BYTES
    except OSError:
        return False


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
