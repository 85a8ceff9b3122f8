"""The `study:` section of a sweep file: an Optuna search run as cells of the sweep engine (`orch tune`).

    study:
      space:                                   # any conf/ key: float / int (log, step) or categorical
        filter.value: {type: float, low: 0.6, high: 1.0}
        filter.prob_mode: {type: categorical, choices: [linear, softmax]}
      objectives:                              # one or more; several make a multi-objective study
        - {metric: val/success_rate, reduce: max, direction: maximize}
      sampler: {name: tpe, seed: 0}            # tpe | random | grid
      pruner: {name: median, metric: val/success_rate, warmup_steps: 2}   # median | successive_halving | none
      trials: 16                               # trials in all
      parallel: 2                              # trials at once
      seeds_per_trial: 1                       # the first N of the sweep's seeds; the objective is their mean

A trial is the sweep's `base` with the trial's values on top, once per seed: each of its cells is an ordinary cell
(its identity the hash of its resolved config), planned by `orchestrator.plan.build_plan`, so a trial whose config
already ran reuses that cell. This module holds the section's schema and its translation into Optuna objects;
`orchestrator.tune` runs the study.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

REDUCTIONS = ("max", "min", "last", "mean")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Param(_Strict):
    """One dimension of the search space."""

    type: Literal["float", "int", "categorical"] = Field(description="float / int (a range) or categorical.")
    low: float | None = Field(None, description="Lower bound (float, int).")
    high: float | None = Field(None, description="Upper bound, included (float, int).")
    log: bool = Field(False, description="Sample on a log scale (float, int; low > 0).")
    step: float | None = Field(None, gt=0, description="Sample on a grid of this step (float, int).")
    choices: list[Any] | None = Field(None, min_length=1, description="The values (categorical).")

    @model_validator(mode="after")
    def _consistent(self) -> Param:
        if self.type == "categorical":
            if self.choices is None:
                raise ValueError("a categorical parameter needs `choices`")
            if self.low is not None or self.high is not None or self.log or self.step is not None:
                raise ValueError("a categorical parameter takes only `choices`")
            return self
        if self.choices is not None:
            raise ValueError(f"a {self.type} parameter takes `low` and `high`, not `choices`")
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"a {self.type} parameter needs `low` < `high`")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("`log: true` needs `low` > 0 and no `step`")
        if self.type == "int" and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError("an int parameter needs whole-number `low` and `high`")
        return self

    def distribution(self) -> Any:
        """The Optuna distribution."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.type == "categorical":
            return CategoricalDistribution(self.choices)
        if self.type == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def values(self) -> list[Any]:
        """Every value (the grid sampler's axis; the plan's probe values): the choices, or the range's grid."""
        if self.type == "categorical":
            return list(self.choices)
        if self.step is None:
            return [self.low, self.high] if self.type == "float" else list(range(int(self.low), int(self.high) + 1))
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        values = [self.low + index * self.step for index in range(count)]
        return [int(v) for v in values] if self.type == "int" else [round(v, 12) for v in values]


class Objective(_Strict):
    """What a trial is worth: a metric of its cells' MLflow runs, reduced over each run's steps, averaged over the
    trial's seeds."""

    metric: str = Field(min_length=1, description="An MLflow metric the trainer logs, e.g. val/success_rate.")
    reduce: Literal["max", "min", "last", "mean"] = Field("last", description="Over the run's steps.")
    direction: Literal["maximize", "minimize"] = "maximize"


class Sampler(_Strict):
    name: Literal["tpe", "random", "grid"] = "tpe"
    seed: int | None = Field(0, ge=0, description="Sampler seed (a study resumed continues the same sequence).")


class Pruner(_Strict):
    """Stops trials whose intermediate values are among the worst (single-objective studies only)."""

    name: Literal["median", "successive_halving", "none"] = "none"
    metric: str | None = Field(None, description="The intermediate value, read at every step it is logged "
                                                 "(default: the objective's metric).")
    direction: Literal["maximize", "minimize"] | None = Field(
        None, description="Whether a higher intermediate value is better (default: the objective's direction).")
    startup_trials: int = Field(2, ge=0, description="median: trials that complete before any is pruned.")
    warmup_steps: int = Field(0, ge=0, description="median: training steps a trial runs that are never pruned; "
                                                   "the first step that may be pruned is warmup_steps + 1.")
    min_resource: int = Field(1, ge=1, description="successive_halving: steps before the first rung.")
    reduction_factor: int = Field(2, ge=2, description="successive_halving: 1/factor of trials go on per rung.")


class StudySpec(_Strict):
    """The `study:` section (see the module docstring)."""

    space: dict[str, Param] = Field(min_length=1, description="conf/ key -> its range or choices.")
    objectives: list[Objective] = Field(min_length=1)
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)
    trials: int = Field(ge=1, description="Trials in all.")
    parallel: int = Field(1, ge=1, description="Trials at once.")
    seeds_per_trial: int = Field(1, ge=1, description="Cells per trial: the first N seeds of the sweep.")

    @model_validator(mode="after")
    def _consistent(self) -> StudySpec:
        if self.pruner.name != "none" and len(self.objectives) > 1:
            raise ValueError("pruning needs a single objective (Optuna prunes single-objective studies only)")
        if self.sampler.name == "grid":
            ranges = [key for key, param in self.space.items() if param.type == "float" and param.step is None]
            if ranges:
                raise ValueError(f"the grid sampler needs a finite space: give {ranges[0]} a `step` or `choices`")
        return self

    def directions(self) -> list[str]:
        return [objective.direction for objective in self.objectives]

    def pruner_metric(self) -> str:
        return self.pruner.metric or self.objectives[0].metric

    def pruner_sign(self) -> float:
        """+1, or -1 when the intermediate value is better the other way than the objective (reported negated)."""
        wanted = self.pruner.direction or self.objectives[0].direction
        return 1.0 if wanted == self.objectives[0].direction else -1.0

    def make_sampler(self) -> Any:
        import optuna

        seed = self.sampler.seed
        if self.sampler.name == "grid":
            return optuna.samplers.GridSampler({key: param.values() for key, param in self.space.items()}, seed=seed)
        if self.sampler.name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, multivariate=len(self.space) > 1)

    def make_pruner(self) -> Any:
        import optuna

        pruner = self.pruner
        if pruner.name == "median":
            # Optuna counts steps from 0 and protects steps < n_warmup_steps (its first N steps); training steps
            # are logged from 1, so the first `warmup_steps` of them are protected by n_warmup_steps + 1.
            return optuna.pruners.MedianPruner(n_startup_trials=pruner.startup_trials,
                                               n_warmup_steps=pruner.warmup_steps + 1)
        if pruner.name == "successive_halving":
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=pruner.min_resource,
                                                          reduction_factor=pruner.reduction_factor)
        return optuna.pruners.NopPruner()

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The trial's values, asked from Optuna in the space's order."""
        values = {key: trial._suggest(key, param.distribution()) for key, param in self.space.items()}
        return {key: round(value, 12) if isinstance(value, float) else value for key, value in values.items()}


def trial_definition(definition: Any, params: dict[str, Any]) -> Any:
    """The sweep (an `orchestrator.spec.SweepDefinition`) of one trial: the base with the trial's values on top (forced settings still win), once per seed
    of the trial; no grid, axes or include."""
    spec = definition.spec
    study = spec.study
    trial_spec = spec.model_copy(update={
        "base": {**spec.base, **params}, "grid": {}, "axes": {}, "include": [], "exclude": [],
        "seeds": spec.seeds[: study.seeds_per_trial], "study": None})
    return dataclasses.replace(definition, spec=trial_spec)


def probe_points(spec: StudySpec) -> list[dict[str, Any]]:
    """Values that visit every end of every range and every choice (planned by `orch tune --dry-run` and before
    a study starts, so that a key or value `conf/` refuses is found before anything runs)."""
    first = {key: param.values()[0] for key, param in spec.space.items()}
    points = [first]
    for key, param in spec.space.items():
        points += [{**first, key: value} for value in param.values()[1:] if param.type != "int" or value in
                   (int(param.low), int(param.high))]
    return points


def objective_value(histories: list[list[tuple[int, float]]], objective: Objective) -> float | None:
    """The objective of a trial from its cells' histories of the metric ((step, value) pairs): reduced per run,
    averaged over runs; None when a run never logged it."""
    per_run = []
    for history in histories:
        values = [value for _, value in sorted(history) if math.isfinite(value)]
        if not values:
            return None
        per_run.append({"max": max(values), "min": min(values), "last": values[-1],
                        "mean": sum(values) / len(values)}[objective.reduce])
    return sum(per_run) / len(per_run) if per_run else None
