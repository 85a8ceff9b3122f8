"""Executors: where cells run. A registry from name to an `Executor` class, imported on first use.

    slurm  job arrays via submitit, one sbatch per resource group (split at the cluster's MaxArraySize)
    local  subprocesses on this machine (submitit's LocalExecutor), as many at once as the cores allow
    debug  in this process, one cell after another, for breakpoints

Listing names imports nothing heavy (the CLI shows them in `--help`); `get_executor` imports the module that
defines the class named here. The executor modules never import this one (the edge goes one way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchlib.registry import Registry

if TYPE_CHECKING:
    from orchestrator.executors.base import Executor

EXECUTORS: Registry[type[Executor]] = Registry("cluster", where="--cluster", lazy={
    "debug": "orchestrator.executors.debug:DebugExecutor",
    "local": "orchestrator.executors.local:LocalExecutor",
    "slurm": "orchestrator.executors.slurm:SlurmExecutor",
})


def executor_names() -> list[str]:
    """Every executor name (registered or importable on demand)."""
    return EXECUTORS.names()


def get_executor(name: str) -> type[Executor]:
    """The executor class registered as `name`. Raises `OrchError` listing the valid names."""
    return EXECUTORS.get(name)
