"""What one cell asks of the cluster, decided by rules of the sweep file.

    resources:
      default: {gpus_per_node: 1, cpus_per_task: 8, mem_gb: 64, time_min: 720}
      rules:                                   # applied in order; later rules win
        - when: {model.path: [models/Qwen2.5-7B]}
          set: {gpus_per_node: 4, time_min: 1440}

Cells with equal `Resources` form one *resource group*: one SLURM job array per group.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.rules import Lookup, matches


class Resources(BaseModel):
    """Resources of one cell (one SLURM array task)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(1, ge=1, description="Nodes per cell.")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node.")
    cpus_per_task: int = Field(1, ge=1, description="CPU cores per cell.")
    mem_gb: float = Field(4.0, gt=0, description="Memory per node, GiB.")
    time_min: int = Field(60, ge=1, description="Time limit in minutes (the job checkpoints and requeues at it).")
    gpu_mem_gb: float = Field(80.0, gt=0, description="Memory of each GPU, GiB (what `--preflight` checks a cell's "
                                                      "estimated peak against; 80: an A100/H100 80GB).")

    def key(self) -> str:
        """A stable text key: cells with the same key share a job array."""
        return json.dumps(self.model_dump(), sort_keys=True)

    def gpu_hours(self) -> float:
        """GPU-hours if the cell ran to its time limit (an upper bound)."""
        return self.nodes * self.gpus_per_node * self.time_min / 60.0

    def label(self) -> str:
        """Short human form, e.g. `1n x 4gpu, 8cpu, 64G, 12h00`."""
        hours, minutes = divmod(self.time_min, 60)
        return (
            f"{self.nodes}n x {self.gpus_per_node}gpu, {self.cpus_per_task}cpu, {self.mem_gb:g}G, "
            f"{hours}h{minutes:02d}"
        )


class ResourcePatch(BaseModel):
    """The fields a rule changes (unset fields keep their value)."""

    model_config = ConfigDict(extra="forbid")

    nodes: int | None = Field(None, ge=1)
    gpus_per_node: int | None = Field(None, ge=0)
    cpus_per_task: int | None = Field(None, ge=1)
    mem_gb: float | None = Field(None, gt=0)
    time_min: int | None = Field(None, ge=1)
    gpu_mem_gb: float | None = Field(None, gt=0)


class ResourceRule(BaseModel):
    """`when` the cell matches (see `orchestrator.rules`), `set` these fields."""

    model_config = ConfigDict(extra="forbid")

    when: dict[str, Any] = Field(min_length=1)
    set: ResourcePatch


class ResourcesSpec(BaseModel):
    """Default resources and the rules that adjust them per cell."""

    model_config = ConfigDict(extra="forbid")

    default: Resources = Resources()
    rules: list[ResourceRule] = []

    def for_cell(self, lookup: Lookup) -> Resources:
        """The resources of the cell described by `lookup`."""
        fields: dict[str, Any] = {}
        for rule in self.rules:
            if matches(rule.when, lookup):
                fields.update(rule.set.model_dump(exclude_none=True))
        return self.default.model_copy(update=fields) if fields else self.default
