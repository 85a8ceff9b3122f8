"""`orch sweep FILE --preflight`: every cell of a plan checked as its job would start it, on this host, before
anything is submitted or written.

Cells are grouped into classes by (model, nodes, GPUs per node, GPU memory): one class is one line of the report.
Within a class every distinct training config (cells differing only in seed share one) goes through
`recipes.verl.preflight.preflight_cell` (veRL's own validation, orch's start-up checks, memory) and
`recipes.verl.cost` (wall time, GPU-hours); a class reports the union of its cells' problems (with how many cells
each concerns), its largest memory estimate and smallest fitting micro-batch. The plan's own problems (data a paper
sweep must not generate, a torch cell asking for GPUs) come first. torch-backend cells are checked by the plan only
(the torch backend runs one process on one device).

What only the user can supply (a model folder or data file not on this host, a data path a `data: real` sweep has
not set, an architecture preflight does not know) is kept apart as `needs`: it is listed under "needs from you" and
does not make a preflight fail; `fit_gate` (what `orch sweep` runs before it submits a verl sweep's GPU cells)
refuses a plan with a problem or a need. One `recipes.verl.preflight.PreflightCache` serves every cell of a plan
(veRL's config composed once, each distinct config validated once).
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
    training: list[str] = field(default_factory=list)  # what the policy trains: full-parameter, or its LoRA adapters
    prompt_tokens: str = ""
    validation: str = "not run"  # veRL's validate_config: passed | failed | not run
    cost_basis: str = ""  # what the GPU-hours rest on (the anchor, or finished runs that calibrated it)
    problems: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)  # what only the user can supply (module docstring)
    fit_problems: list[str] = field(default_factory=list)  # the start-up (vLLM) and memory checks' problems

    def add_problem(self, line: str, fit: bool = False) -> None:
        if line not in self.counts:
            self.problems.append(line)
            if fit:
                self.fit_problems.append(line)
        self.counts[line] = self.counts.get(line, 0) + 1

    def add_need(self, line: str) -> None:
        if line not in self.needs:
            self.needs.append(line)

    def lines(self, only: list[str] | None = None) -> list[str]:
        """The problems (or those of `only`), each with how many of the class's checked configs it concerns when
        not all."""
        return [line if self.counts[line] >= self.configs else f"{line} [{self.counts[line]} of {self.configs}]"
                for line in (self.problems if only is None else only)]

    def title(self) -> str:
        """One line naming the class: its model, GPUs, backend and cells."""
        return f"{self.model} on {self.nodes}n x {self.gpus_per_node} GPU ({self.backend}, {self.cells} cells)"

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "backend": self.backend, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "cells": self.cells, "configs": self.configs, "est_gb_per_gpu": _round(self.est_gb_per_gpu),
                "rollout_gb": _round(self.rollout_gb), "update_gb": _round(self.update_gb),
                "gpu_mem_gb": self.gpu_mem_gb, "fits": self.fits, "max_micro_batch": self.max_micro_batch,
                "gpu_hours": round(self.gpu_hours, 1), "wall_h": round(self.wall_h, 2),
                "limit_h": round(self.limit_h, 2), "architecture": self.architecture, "training": list(self.training),
                "prompt_tokens": self.prompt_tokens, "validation": self.validation, "cost_basis": self.cost_basis,
                "problems": self.lines(), "needs": list(self.needs)}


@dataclass
class PreflightReport:
    """The plan's own problems and one `CellClass` per class, in order of first appearance."""

    sweep: str
    plan_problems: list[str]
    classes: list[CellClass]
    plan_needs: list[str] = field(default_factory=list)  # the data paths a `data: real` sweep has not set
    seconds: float = 0.0  # wall time of the checks
    composed: int = 0  # veRL configs composed (the others shared one)
    validated: int = 0  # veRL validations run

    @property
    def problem_count(self) -> int:
        return len(self.plan_problems) + sum(len(c.problems) for c in self.classes)

    def need_lines(self) -> list[str]:
        """Every distinct need once, with the classes (c1, c2, ... as printed) that have it."""
        owners: dict[str, list[str]] = {}
        for index, group in enumerate(self.classes, start=1):
            for line in group.needs:
                owners.setdefault(line, []).append(f"c{index}")
        return [*self.plan_needs, *(f"{line} [{', '.join(names)}]" for line, names in owners.items())]

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
                   tracking_uri: str | None = None, fit_only: bool = False,
                   select: Callable[[PlannedCell, Any], bool] | None = None,
                   cache: Any = None) -> PreflightReport:
    """Preflight every cell of `plan` (`config_of(cell)`: its resolved `TrainConfig`; `select(cell, cfg)`: only
    the cells it accepts); `on_config(done, total)` after each distinct config is checked. Finished GPU runs of a
    model in the store at `tracking_uri` calibrate its cost (`recipes.verl.cost.calibration`). `fit_only`: the
    memory and start-up checks without veRL's validation. `cache`: a `recipes.verl.preflight.PreflightCache` shared
    with other plans (default: one for this plan)."""
    import time

    from recipes.verl.preflight import PreflightCache

    started = time.perf_counter()
    if cache is None:
        with PreflightCache(fit_only=fit_only) as own:
            return preflight_plan(plan, config_of, model_config, on_config, tracking_uri, fit_only, select, own)
    composed, validated = cache.composed, cache.validated
    cells = [(cfg, cell.resources, cell.backend) for cell in plan.cells
             for cfg in [config_of(cell)] if select is None or select(cell, cfg)]
    needs = plan.data_needs()
    report = PreflightReport(sweep=plan.name, plan_problems=[line for line in plan.problems() if line not in needs],
                             classes=check_cells(cells, model_config, on_config, tracking_uri, cache),
                             plan_needs=needs)
    report.seconds = time.perf_counter() - started
    report.composed, report.validated = cache.composed - composed, cache.validated - validated
    return report


def check_cells(cells: list[tuple[Any, Any, str]], model_config: dict[str, Any] | None,
                on_config: Callable[[int, int], None] | None, tracking_uri: str | None, cache: Any) -> list[CellClass]:
    """Preflight `cells`, each (its resolved `TrainConfig`, its `Resources`, its backend), grouped into classes
    (module docstring), through `cache` (a `recipes.verl.preflight.PreflightCache`)."""
    from recipes.verl.cost import BASIS, calibration, estimate_cost
    from recipes.verl.preflight import preflight_cell

    calibrations: dict[str, tuple[float, str] | None] = {}
    classes: dict[tuple[Any, ...], CellClass] = {}
    distinct: dict[tuple[Any, ...], int] = {}
    configs: dict[str, Any] = {}
    for cfg, res, backend in cells:
        key = (str(cfg.model.path or f"preset {cfg.model.name}"), res.nodes, res.gpus_per_node, res.gpu_mem_gb,
               backend)
        if key not in classes:
            classes[key] = CellClass(model=key[0], nodes=res.nodes, gpus_per_node=res.gpus_per_node,
                                     gpu_mem_gb=res.gpu_mem_gb, backend=backend, limit_h=res.time_min / 60)
        classes[key].cells += 1
        unseeded = cfg.model_copy(update={"seed": 0}).digest()
        configs[unseeded] = cfg
        distinct[(*key, unseeded)] = distinct.get((*key, unseeded), 0) + 1
    total, done = len(distinct), 0
    for (*key, unseeded), count in distinct.items():
        group = classes[tuple(key)]
        group.configs += 1
        cfg = configs[unseeded]
        if group.backend != "verl":
            done += 1
            if on_config:
                on_config(done, total)
            continue
        report = preflight_cell(cfg, group.nodes, group.gpus_per_node, group.gpu_mem_gb, model_config, cache)
        for line in report.problems:
            group.add_problem(line, fit=line in report.fit)
        for line in report.needs:
            group.add_need(line)
        if any(line.startswith("veRL's validate_config:") for line in report.problems):
            group.validation = "failed"
        elif cache.fit_only:
            group.validation = "not run (the fit check only)"
        elif not any(line.startswith("veRL's validate_config") for line in report.needs) \
                and group.validation != "failed":
            group.validation = "passed"
        if report.architecture is not None:
            group.architecture = f"{report.architecture.name} ({report.architecture_source}, " \
                                 f"{report.architecture.parameters() / 1e9:.2f}B)"
            training = _training(cfg, report.architecture)
            if training not in group.training:
                group.training.append(training)
            if cfg.trainer.device != "cpu":
                parameters = report.architecture.parameters()
                if tracking_uri and group.model not in calibrations:
                    calibrations[group.model] = calibration(tracking_uri, group.model, parameters)
                factor, basis = calibrations.get(group.model) or (1.0, BASIS)
                cost = estimate_cost(cfg, parameters, report.world, factor, basis)
                group.cost_basis = basis
                group.gpu_hours += cost.gpu_hours * count
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
    return list(classes.values())


def gpu_verl_cell(cell: PlannedCell, cfg: Any) -> bool:
    """A cell the fit check concerns: the verl backend on GPUs (a torch or cpu cell has no GPU memory to fit)."""
    return _gpu_verl(cell.backend, cfg)


def _gpu_verl(backend: str, cfg: Any) -> bool:
    return backend == "verl" and cfg.trainer.device != "cpu"


def unfit_lines(cells: list[tuple[Any, Any, str]], cache: Any) -> list[str]:
    """`orch paper --check`'s fit check: one line per class of `cells` ((config, resources, backend) each; only verl
    GPU cells are looked at) whose memory or start-up (vLLM) checks fail on its declared hardware, through `cache`
    (a fit-only `recipes.verl.preflight.PreflightCache`). Model and data paths are not asked for."""
    gpu = [(cfg, res, backend) for cfg, res, backend in cells if _gpu_verl(backend, cfg)]
    groups = [group for group in check_cells(gpu, None, None, None, cache) if group.fit_problems]
    if not groups:
        return []
    from recipes.verl.memory_calibration import leave_one_out

    right, total = leave_one_out()  # the verdict's measured record, beside every refusal (docs/verl.md)
    record = (f"memory model: leave-one-out {right} of {total} on its calibration set, whose 'does not fit' cases "
              "are inferred, none seen to fail")
    return [f"{group.title()}: {'; '.join(group.lines(group.fit_problems))} ({record})" for group in groups]


def fit_gate(plan: Plan, model_config: dict[str, Any] | None = None) -> tuple[PreflightReport | None, str | None]:
    """What `orch sweep` runs before it submits (docs/verl.md#preflight): the checks of `--preflight` on the plan's
    verl GPU cells (memory, vLLM's start-up checks, veRL's validation; no cost) -> (the report, or None when the plan
    has no such cell; the refusal message, or None when every class can start: no problem and no need)."""
    if not any(gpu_verl_cell(cell, cell.resolved.config) for cell in plan.cells):
        return None, None
    report = preflight_plan(plan, lambda cell: cell.resolved.config, model_config, select=gpu_verl_cell)
    failing = [(index, group) for index, group in enumerate(report.classes, start=1) if group.problems]
    needs = [line for group in report.classes for line in group.needs]
    if not failing and not needs:
        return report, None
    what = [f"{len(failing)} of {len(report.classes)} verl GPU cell class(es) cannot start as planned"] if failing \
        else []
    what += ["it needs what only you can supply"] if needs else []
    lines = [f"{plan.definition.path}: {' and '.join(what)}; nothing submitted or written (orch sweep FILE "
             "--preflight: the full report; --submit-anyway: submit all the same)"]
    lines += [f"  c{index} {group.title()}: {'; '.join(group.lines())}" for index, group in failing]
    if any(group.fit_problems for _, group in failing):  # a memory or vLLM verdict: its measured record beside it
        from recipes.verl.memory_calibration import fit_record

        lines.append(f"  {fit_record()}")
    if needs:
        lines.append("needs from you (a job stops at its start without it):")
        lines += [f"  {line}" for line in report.need_lines()]
    return report, "\n".join(lines)


def _training(cfg: Any, architecture: Any) -> str:
    """What the cell's policy trains, in words: every parameter, or its LoRA adapters (model.lora) and their count."""
    from recipes.verl.memory import lora_parameters

    lora = cfg.model.lora
    if not lora.enabled:
        return "full-parameter"
    adapters = lora_parameters(architecture, lora.rank, lora.target_modules)
    share = adapters / architecture.parameters()
    return (f"LoRA rank {lora.rank}, alpha {lora.alpha} on {lora.targets_text}: {adapters / 1e6:.1f}M adapter "
            f"parameters ({share:.2%} of the model; the critic, if any, trains all of its own)")
