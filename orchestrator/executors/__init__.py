"""Executors: where cells run. A registry from name to an `Executor` class, imported on first use.

    slurm  job arrays via submitit, one sbatch per resource group (split at the cluster's MaxArraySize)
    local  subprocesses on this machine (submitit's LocalExecutor), as many at once as the cores allow
    debug  in this process, one cell after another, for breakpoints

Listing names imports nothing heavy (the CLI shows them in `--help`); `get_executor` imports the module, which
registers its class with `@register_executor`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.errors import choices_error

if TYPE_CHECKING:
    from orchestrator.executors.base import Executor

EXECUTOR_MODULES: dict[str, str] = {
    "debug": "orchestrator.executors.debug",
    "local": "orchestrator.executors.local",
    "slurm": "orchestrator.executors.slurm",
}
_EXECUTORS: dict[str, type[Executor]] = {}


def register_executor(name: str) -> Callable[[type[Executor]], type[Executor]]:
    """Class decorator: make an `Executor` subclass available as `name`."""

    def decorate(cls: type[Executor]) -> type[Executor]:
        cls.name = name
        _EXECUTORS[name] = cls
        return cls

    return decorate


def executor_names() -> list[str]:
    """Every executor name (registered or importable on demand)."""
    return sorted(set(_EXECUTORS) | set(EXECUTOR_MODULES))


def get_executor(name: str) -> type[Executor]:
    """The executor class registered as `name`. Raises `OrchError` listing the valid names."""
    if name not in _EXECUTORS and name in EXECUTOR_MODULES:
        importlib.import_module(EXECUTOR_MODULES[name])
    if name not in _EXECUTORS:
        raise choices_error("cluster", name, executor_names(), where="--cluster")
    return _EXECUTORS[name]
