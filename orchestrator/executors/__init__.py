"""Executors: where cells run. A registry from name to an `Executor` class, imported on first use.

    slurm  job arrays via submitit, one sbatch per resource group (split at the cluster's MaxArraySize)
    local  subprocesses on this machine (submitit's LocalExecutor), as many at once as the cores allow
    debug  in this process, one cell after another, for breakpoints

Listing names imports nothing heavy (the CLI shows them in `--help`); `get_executor` imports the module, which
registers its class with `@register_executor`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchlib.registry import Registry

if TYPE_CHECKING:
    from orchestrator.executors.base import Executor

EXECUTORS: Registry[type[Executor]] = Registry("cluster", where="--cluster", name_attr="name", lazy={
    "debug": "orchestrator.executors.debug",
    "local": "orchestrator.executors.local",
    "slurm": "orchestrator.executors.slurm",
})
register_executor = EXECUTORS.register  # class decorator: `@register_executor("slurm")` (sets `cls.name`)


def executor_names() -> list[str]:
    """Every executor name (registered or importable on demand)."""
    return EXECUTORS.names()


def get_executor(name: str) -> type[Executor]:
    """The executor class registered as `name`. Raises `OrchError` listing the valid names."""
    return EXECUTORS.get(name)
