"""Trainer backends: a registry from name to a `run(cfg, should_stop) -> TrainResult` callable.

A built-in backend is named here as `"module:run"`, imported on first use, so listing and validating names stays
light (no torch at import) and no backend module imports this one; `@register_backend("name")` adds one from
outside (the tests' backend).

    result = get_backend(cfg.backend)(cfg, should_stop=lambda: preempted)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchlib.registry import Registry
from recipes.runtime.result import TrainResult

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
