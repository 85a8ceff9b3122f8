"""Running a training config: on the backend it names (`recipes.config.backends`), as the one writer of its
checkpoint folder, after checking the folder's file system holds a checkpoint.

    result = run_training(cfg, should_stop=lambda: preempted)   # `orch train` and every sweep job go through it
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchlib.errors import OrchError
from recipes.config.backends import get_backend
from recipes.runtime.result import TrainResult

if TYPE_CHECKING:
    from recipes.config.schema import TrainConfig


def _check_checkpoint_space(cfg: TrainConfig, folder: Path | None) -> None:
    """Before any work: the checkpoint folder's file system holds one checkpoint (`recipes.runtime.checkpoint`), judged
    from the model the run starts from (its safetensors headers; a warm start keeps the parameter count)."""
    if str(cfg.backend) not in ("torch", "verl"):
        return  # the trainers that write model checkpoints (a test backend writes a few bytes, and needs no torch)
    from recipes.policy.algorithms import get_algorithm
    from recipes.policy.models import base_model_folder, count_parameters_in
    from recipes.runtime.checkpoint import check_free_space, checkpoint_bytes

    need = checkpoint_bytes(count_parameters_in(base_model_folder(cfg.model)),
                            get_algorithm(cfg.algorithm.name).uses_critic)
    check_free_space(folder or Path("checkpoints"), need, "config key trainer.checkpoint_dir")


def writer_folder(cfg: TrainConfig) -> Path | None:
    """The checkpoint folder `cfg` will write: `trainer.checkpoint_dir`, else `checkpoints/<mlflow.run_id>` for a
    named run; None for a new run (its folder is named by a run id nobody else has)."""
    infra = cfg.infra
    if infra.checkpoint_dir:
        return Path(infra.checkpoint_dir)
    return Path("checkpoints") / str(infra.mlflow.run_id) if infra.mlflow.run_id else None


def run_training(cfg: TrainConfig, should_stop: Callable[[], bool] | None = None, wait_s: float = 0.0,
                 on_wait: Callable[[str], None] | None = None) -> TrainResult:
    """Run `cfg` on the backend it names (`cfg.backend`), as the one writer of its checkpoint folder: a lease
    (`orchlib.lease`) held from before the checkpoint is read until the run ends. Another live writer: `OrchError`
    naming it, at once (`wait_s` 0: `orch train`) or after waiting up to `wait_s` for it to end (a sweep's job,
    whose cell's previous attempt may still be stopping). A lease lost meanwhile (this process froze for longer
    than the lease and another took over) stops the run at its next step boundary."""
    from orchlib.lease import InUseError, WriterLease

    backend = get_backend(str(cfg.backend))
    folder = writer_folder(cfg)
    _check_checkpoint_space(cfg, folder)
    if folder is None:
        return backend(cfg, should_stop=should_stop)
    lease = WriterLease(folder, "config key trainer.checkpoint_dir")
    asked = should_stop or (lambda: False)
    try:
        if not lease.acquire(wait_s, asked, on_wait):
            return TrainResult("preempted", 0, str(cfg.infra.mlflow.run_id or ""),
                               f"stop requested while waiting for the checkpoint folder {folder}")
    except InUseError as err:
        raise OrchError(str(err)) from None
    try:
        return backend(cfg, should_stop=lambda: asked() or lease.lost)
    finally:
        lease.release()
