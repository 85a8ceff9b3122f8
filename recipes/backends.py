"""Trainer backends: a registry from name to a `run(cfg, should_stop) -> TrainResult` callable.

A backend module registers itself with `@register_backend("name")` when imported. `get_backend(name)` imports the
module registered lazily for that name first, so listing and validating names stays light (no torch at import).

    result = get_backend(cfg.backend)(cfg, should_stop=lambda: preempted)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from orchlib.registry import Registry

if TYPE_CHECKING:
    from omegaconf import DictConfig

Status = Literal["finished", "preempted", "stopped", "failed"]


@dataclass(frozen=True)
class TrainResult:
    """How a training run ended.

    status: finished (all steps done) | preempted (stop requested; checkpoint saved, resume later) |
        stopped (the run decided to stop early, e.g. too many empty filtered batches) | failed.
    steps_done: the last completed step (the checkpointed one when preempted).
    mlflow_run_id: the MLflow run that holds the metrics.
    reason: one human-readable line.
    """

    status: Status
    steps_done: int
    mlflow_run_id: str
    reason: str = ""


Backend = Callable[..., TrainResult]
# Backend name -> the module that registers it, imported on first use.
BACKENDS: Registry[Backend] = Registry("trainer backend", where="config key backend",
                                      lazy={"torch": "recipes.torch_backend", "verl": "recipes.verl.backend"})
# Decorator: register `run(cfg: TrainConfig, should_stop: Callable[[], bool] | None = None) -> TrainResult`.
register_backend = BACKENDS.register


def backend_names() -> list[str]:
    """Every backend name that can be requested (registered or importable on demand)."""
    return BACKENDS.names()


def get_backend(name: str) -> Backend:
    """The registered backend `name`, importing its module on first use. Raises OrchError for unknown names."""
    return BACKENDS.get(name)


def run_training(cfg: DictConfig, should_stop: Callable[[], bool] | None = None) -> TrainResult:
    """Run `cfg` on the backend it names (`cfg.backend`)."""
    return get_backend(str(cfg.backend))(cfg, should_stop=should_stop)
