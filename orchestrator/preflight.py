"""`orch sweep FILE --preflight`: every cell of a plan checked as its job would start it, on this host, before
anything is submitted or written.

Cells are grouped into classes by (model, nodes, GPUs per node, GPU memory): one class is one line of the report.
Within a class every distinct training config (cells differing only in seed share one) goes through
`recipes.verl.preflight.preflight_cell` (veRL's own validation, orch's start-up checks, memory) and
`recipes.verl.cost` (wall time, GPU-hours); a class reports the union of its cells' problems (with how many cells
each concerns), its largest memory estimate and smallest fitting micro-batch. The plan's own problems (data a paper
sweep must not generate, a torch cell asking for GPUs) come first. torch-backend cells are checked by the plan only
(the torch backend runs one process on one device).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.plan import Plan, PlannedCell
from orchlib.errors import OrchError


@dataclass
class CellClass:
    """One (model, nodes, GPUs per node, GPU memory) class of a plan and what preflight found for it."""

    model: str
    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    backend: str
    cells: int = 0
    configs: int = 0  # distinct training configs checked (seeds share one)
    est_gb_per_gpu: float | None = None
    rollout_gb: float | None = None
    update_gb: float | None = None
    fits: bool | None = None  # None: no estimate (no architecture, a cpu or torch cell)
    max_micro_batch: int | None = None
    gpu_hours: float = 0.0
    wall_h: float = 0.0  # the longest cell's
    limit_h: float = 0.0  # the cells' time limit (a longer run checkpoints and requeues)
    architecture: str = ""
    prompt_tokens: str = ""
    validation: str = "not run"  # veRL's validate_config: passed | failed | not run
    cost_basis: str = ""  # what the GPU-hours rest on (the anchor, or finished runs that calibrated it)
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add_problem(self, line: str) -> None:
        if line not in self.counts:
            self.problems.append(line)
        self.counts[line] = self.counts.get(line, 0) + 1

    def lines(self) -> list[str]:
        """The problems, each with how many of the class's checked configs it concerns when not all."""
        return [line if self.counts[line] >= self.configs else f"{line} [{self.counts[line]} of {self.configs}]"
                for line in self.problems]

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "backend": self.backend, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "cells": self.cells, "configs": self.configs, "est_gb_per_gpu": _round(self.est_gb_per_gpu),
                "rollout_gb": _round(self.rollout_gb), "update_gb": _round(self.update_gb),
                "gpu_mem_gb": self.gpu_mem_gb, "fits": self.fits, "max_micro_batch": self.max_micro_batch,
                "gpu_hours": round(self.gpu_hours, 1), "wall_h": round(self.wall_h, 2),
                "limit_h": round(self.limit_h, 2), "architecture": self.architecture,
                "prompt_tokens": self.prompt_tokens, "validation": self.validation, "cost_basis": self.cost_basis,
                "problems": self.lines()}


@dataclass
class PreflightReport:
    """The plan's own problems and one `CellClass` per class, in order of first appearance."""

    sweep: str
    plan_problems: list[str]
    classes: list[CellClass]

    @property
    def problem_count(self) -> int:
        return len(self.plan_problems) + sum(len(c.problems) for c in self.classes)

    @property
    def gpu_hours(self) -> float:
        return sum(c.gpu_hours for c in self.classes)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def load_model_config(path: Path | None) -> dict[str, Any] | None:
    """`--model-config FILE`: a config.json standing in for checkpoints this host does not have."""
    if path is None:
        return None
    try:
        loaded = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise OrchError(f"--model-config {path}: not a readable JSON file ({err})") from None
    if not isinstance(loaded, dict):
        raise OrchError(f"--model-config {path}: not a JSON object (a Hugging Face config.json is expected)")
    return loaded


def preflight_plan(plan: Plan, config_of: Callable[[PlannedCell], Any], model_config: dict[str, Any] | None = None,
                   on_config: Callable[[int, int], None] | None = None,
                   tracking_uri: str | None = None) -> PreflightReport:
    """Preflight every cell of `plan` (`config_of(cell)`: its resolved `TrainConfig`); `on_config(done, total)`
    after each distinct config is checked. Finished GPU runs of a model in the store at `tracking_uri` calibrate
    its cost (`recipes.verl.cost.calibration`)."""
    from recipes.verl.cost import BASIS, calibration, estimate_cost

    calibrations: dict[str, tuple[float, str] | None] = {}
    from recipes.verl.preflight import preflight_cell

    classes: dict[tuple[Any, ...], CellClass] = {}
    distinct: dict[tuple[Any, ...], list[PlannedCell]] = {}
    configs: dict[str, Any] = {}
    for cell in plan.cells:
        cfg = config_of(cell)
        res = cell.resources
        key = (str(cfg.model.path or f"preset {cfg.model.name}"), res.nodes, res.gpus_per_node, res.gpu_mem_gb,
               cell.backend)
        if key not in classes:
            classes[key] = CellClass(model=key[0], nodes=res.nodes, gpus_per_node=res.gpus_per_node,
                                     gpu_mem_gb=res.gpu_mem_gb, backend=cell.backend, limit_h=res.time_min / 60)
        classes[key].cells += 1
        unseeded = cfg.model_copy(update={"seed": 0}).digest()
        configs[unseeded] = cfg
        distinct.setdefault((*key, unseeded), []).append(cell)
    total, done = len(distinct), 0
    for (*key, unseeded), cells in distinct.items():
        group = classes[tuple(key)]
        group.configs += 1
        cfg = configs[unseeded]
        if group.backend != "verl":
            done += 1
            if on_config:
                on_config(done, total)
            continue
        report = preflight_cell(cfg, group.nodes, group.gpus_per_node, group.gpu_mem_gb, model_config)
        for line in report.problems:
            group.add_problem(line)
        if any(line.startswith("veRL's validate_config:") for line in report.problems):
            group.validation = "failed"
        elif not any(line.startswith("veRL's validate_config not run") for line in report.problems) \
                and group.validation != "failed":
            group.validation = "passed"
        if report.architecture is not None:
            group.architecture = f"{report.architecture.name} ({report.architecture_source}, " \
                                 f"{report.architecture.parameters() / 1e9:.2f}B)"
            if cfg.trainer.device != "cpu":
                parameters = report.architecture.parameters()
                if tracking_uri and group.model not in calibrations:
                    calibrations[group.model] = calibration(tracking_uri, group.model, parameters)
                factor, basis = calibrations.get(group.model) or (1.0, BASIS)
                cost = estimate_cost(cfg, parameters, report.world, factor, basis)
                group.cost_basis = basis
                group.gpu_hours += cost.gpu_hours * len(cells)
                group.wall_h = max(group.wall_h, cost.wall_h)
        group.prompt_tokens = f"{report.prompt_tokens} ({report.prompt_source})"
        memory = report.memory
        if memory is not None:
            group.est_gb_per_gpu = max(group.est_gb_per_gpu or 0.0, memory.peak_gb)
            group.rollout_gb = max(group.rollout_gb or 0.0, memory.rollout_gb)
            group.update_gb = max(group.update_gb or 0.0, memory.update_gb)
            group.fits = memory.fits and group.fits is not False
            group.max_micro_batch = memory.max_micro_batch if group.max_micro_batch is None else min(
                group.max_micro_batch, memory.max_micro_batch)
        done += 1
        if on_config:
            on_config(done, total)
    return PreflightReport(sweep=plan.name, plan_problems=plan.problems(), classes=list(classes.values()))
