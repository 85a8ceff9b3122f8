"""Trainer backends: a registry from name to a `run(cfg, should_stop) -> TrainResult` callable.

A built-in backend is named here as `"module:run"`, imported on first use, so listing and validating names stays
light (no torch at import) and no backend module imports this one; `@register_backend("name")` adds one from
outside (the tests' backend).

    result = get_backend(cfg.backend)(cfg, should_stop=lambda: preempted)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchlib.errors import OrchError
from orchlib.registry import Registry
from recipes.runtime.result import TrainResult

if TYPE_CHECKING:
    from omegaconf import DictConfig

Backend = Callable[..., TrainResult]
# Backend name -> its `run`, imported on first use.
BACKENDS: Registry[Backend] = Registry("trainer backend", where="config key backend",
                                      lazy={"torch": "recipes.torch_trainer.backend:run", "verl": "recipes.verl.backend:run"})
# Decorator: register `run(cfg: TrainConfig, should_stop: Callable[[], bool] | None = None) -> TrainResult`.
register_backend = BACKENDS.register
# Backend name -> its host check `check(cfg: TrainConfig) -> None`: what only the host that trains that backend's run
# can check (OrchError naming the config key), run by `TrainConfig.check_host` before anything is written; imported on
# first use, so the config room never imports a backend's room. A backend without one has nothing to add.
HOST_CHECKS: Registry[Callable[..., None]] = Registry("backend host check", where="config key backend",
                                                      lazy={"verl": "recipes.verl.patches:check_host"})


def check_backend_host(cfg: Any) -> None:
    """The host check `cfg.backend` registered (`HOST_CHECKS`), if any (`cfg`: the `TrainConfig` being checked)."""
    if cfg.backend in HOST_CHECKS:
        HOST_CHECKS.get(cfg.backend)(cfg)


def backend_names() -> list[str]:
    """Every backend name that can be requested (registered or importable on demand)."""
    return BACKENDS.names()


def get_backend(name: str) -> Backend:
    """The registered backend `name`, importing its module on first use. Raises OrchError for unknown names."""
    return BACKENDS.get(name)


def _check_checkpoint_space(cfg: DictConfig, folder: Path | None) -> None:
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


def writer_folder(cfg: DictConfig) -> Path | None:
    """The checkpoint folder `cfg` will write: `trainer.checkpoint_dir`, else `checkpoints/<mlflow.run_id>` for a
    named run; None for a new run (its folder is named by a run id nobody else has)."""
    infra = cfg.infra
    if infra.checkpoint_dir:
        return Path(infra.checkpoint_dir)
    return Path("checkpoints") / str(infra.mlflow.run_id) if infra.mlflow.run_id else None


def run_training(cfg: DictConfig, should_stop: Callable[[], bool] | None = None, wait_s: float = 0.0,
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
