"""The plan of a sweep: every cell resolved against `conf/`, hashed, given its resources; nothing written yet.

Each cell is resolved by one call into the config room (`recipes.config.resolve.ConfigResolver.resolve`: settings ->
validated `TrainConfig` and digest); the plan keeps that config, which the store keeps and the cell's job runs.

`build_plan(definition)` is the whole validation of a sweep file: if it returns, every cell composes to a valid
training config, no two cells are the same config, and every cell has resources. The store and the executors only
ever see a `Plan`.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envs.base import DataSource
from envs.registry import env_class
from orchestrator.expand import RawCell, describe_origin, expand
from orchestrator.resources import Resources
from orchestrator.rules import MISSING
from orchestrator.spec import SweepDefinition
from orchestrator.yamlsource import Loc
from recipes.config.resolve import ConfigResolver, ResolvedConfig, frozen

if TYPE_CHECKING:
    from recipes.config.schema import TrainConfig
from orchlib.errors import OrchError


@dataclass
class PlannedCell:
    """One cell ready to be stored: identity, settings, Hydra overrides, resources, and the resolved config its job
    runs (`recipes.config.resolve.ResolvedConfig`; stored with the cell)."""

    index: int
    digest: str
    axis: str | None
    settings: dict[str, Any]
    overrides: list[str]
    resources: Resources
    resolved: ResolvedConfig | None = field(default=None, repr=False, compare=False)

    @property
    def seed(self) -> int:
        """The cell's seed."""
        return int(self.settings.get("seed", 0))

    @property
    def backend(self) -> str:
        """The trainer backend that runs the cell."""
        return str(self.settings.get("backend"))


@dataclass
class Plan:
    """All cells of a sweep, the keys that vary between them, and notes for the user."""

    definition: SweepDefinition
    cells: list[PlannedCell]
    varied: list[str]
    notes: list[str] = field(default_factory=list)
    # task -> (its data source, cells of it that would train on the built-in or generated set)
    builtin_data: dict[str, tuple[DataSource, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The sweep name."""
        return self.definition.spec.name

    def drop_done(self, digests: set[str], where: str) -> None:
        """Leave out the cells whose digest is in ``digests`` (finished elsewhere, e.g. in an archive: ``where``)
        and say how many in a note."""
        kept = [cell for cell in self.cells if cell.digest not in digests]
        if len(kept) < len(self.cells):
            self.notes.append(f"{len(self.cells) - len(kept)} cell(s) finished in {where}: not submitted")
        self.cells = kept

    def resource_groups(self) -> dict[Resources, list[PlannedCell]]:
        """Cells grouped by identical resources (one job array each), in order of first appearance."""
        groups: dict[Resources, list[PlannedCell]] = defaultdict(list)
        for cell in self.cells:
            groups[cell.resources].append(cell)
        return dict(groups)

    def gpu_hours(self) -> float:
        """Sum of GPU-hours at each cell's time limit (an upper bound)."""
        return sum(cell.resources.gpu_hours() for cell in self.cells)

    def varied_values(self, cell: PlannedCell) -> dict[str, Any]:
        """The cell's values of the varied keys (`axis` included when the sweep has axes)."""
        values = {key: cell.settings.get(key) for key in self.varied if key != "axis"}
        if "axis" in self.varied:
            values = {"axis": cell.axis, **values}
        return values

    def problems(self) -> list[str]:
        """Every reason `orch sweep` refuses this plan, one line each (the dry run lists them all)."""
        found = []
        for cell in self.cells:
            resources = cell.resources
            if cell.backend == "torch" and (resources.nodes > 1 or resources.gpus_per_node > 1):
                found.append(
                    f"{self.definition.path}: cell {cell.digest} asks for {resources.nodes} node(s) x "
                    f"{resources.gpus_per_node} GPU(s), but the torch backend runs one process on one device; "
                    "set nodes: 1 and gpus_per_node <= 1 for it, or use backend: verl"
                )
        return found + self.data_needs()

    def data_needs(self) -> list[str]:
        """The data paths a `data: real` sweep has not set, one line per task (among `problems`; preflight lists
        them under "needs from you")."""
        if self.definition.spec.data != "real":
            return []
        where = self.definition.source.where(("data",))
        return [f"{where}: real, but {count} cell(s) of task {task} would train on {source.builtin}: set "
                f"task.env.{source.key} to {source.formats} (in the grid: {{task: {task}, "
                f"task.env.{source.key}: PATH}}), or rehearse with a profile that allows it (--profile cpu)"
                for task, (source, count) in self.builtin_data.items()]

    def check_submittable(self) -> None:
        """Refuse a plan with a problem (`problems`): `OrchError` with the first, saying how many more."""
        found = self.problems()
        if found:
            more = f" (and {len(found) - 1} more problem(s): --dry-run lists them)" if len(found) > 1 else ""
            raise OrchError(found[0] + more)


def build_plan(definition: SweepDefinition, resolver: ConfigResolver | None = None) -> Plan:
    """Expand, resolve, hash and size every cell of `definition`. Raises `OrchError` (file, line, key)."""
    if definition.spec.study is not None:
        raise definition.source.error(("study",), "this sweep file defines a study: run it with `orch tune FILE` "
                                                  "(`orch sweep` runs grids)")
    raw_cells = expand(definition)
    resolver = resolver or ConfigResolver()
    source = definition.source
    cells: list[PlannedCell] = []
    seen: dict[str, tuple[PlannedCell, RawCell]] = {}
    merged = 0
    builtin_data: dict[str, tuple[DataSource, int]] = {}
    for raw in raw_cells:
        try:
            resolved = resolver.resolve(raw.settings)
        except OrchError as err:
            raise OrchError(f"{_key_where(definition, raw, str(err))}: {err} [cell {describe_origin(raw, source)}]") from None
        if resolved.digest in seen:
            if definition.forced:
                merged += 1
                continue
            first = seen[resolved.digest][1]
            raise OrchError(
                f"{source.path}: duplicate cells: {describe_origin(raw, source)} resolves to the same config as "
                f"{describe_origin(first, source)} (cell {resolved.digest})"
            )
        lookup = _resource_lookup(resolved.settings, resolved.config, raw.axis)
        cell = PlannedCell(
            index=len(cells),
            digest=resolved.digest,
            axis=raw.axis,
            settings=resolved.settings,
            overrides=resolved.overrides,
            resources=definition.spec.resources.for_cell(lookup),
            resolved=resolved,
        )
        seen[resolved.digest] = (cell, raw)
        cells.append(cell)
        task = resolved.config.task
        data = env_class(task.name).data
        if data is not None and data.key is not None and data.uses_builtin(task.env):
            builtin_data[task.name] = (data, builtin_data.get(task.name, (data, 0))[1] + 1)
    resolver.flush()
    plan = Plan(definition=definition, cells=cells, varied=varied_keys(cells), builtin_data=builtin_data)
    if merged:
        forced = ", ".join(sorted(definition.forced))
        plan.notes.append(
            f"{merged} cell(s) merged: forced settings ({forced}) made them identical to other cells"
        )
    return plan


def varied_keys(cells: list[PlannedCell]) -> list[str]:
    """Keys whose value differs between cells, in first-seen order; `axis` first when there are several rows."""
    values: dict[str, set[tuple]] = {}
    counts: dict[str, int] = {}
    for cell in cells:
        for item in frozen(cell.settings):
            values.setdefault(item[0], set()).add(item)
            counts[item[0]] = counts.get(item[0], 0) + 1
    varied = [key for key, seen in values.items() if len(seen) > 1 or counts[key] < len(cells)]
    if len({cell.axis for cell in cells}) > 1:
        varied.insert(0, "axis")
    return varied


def _resource_lookup(settings: dict[str, Any], config: TrainConfig, axis: str | None):
    """Rules match a cell's settings first, then any key of its resolved config (as `conf/` names it), and
    `axis`."""
    tree = functools.cache(config.to_tree)

    def lookup(key: str) -> Any:
        if key == "axis":
            return axis if axis is not None else MISSING
        if key in settings:
            return settings[key]
        node: Any = tree()
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    return lookup


def _key_where(definition: SweepDefinition, raw: RawCell, message: str) -> str:
    """`file:line: key` of the setting an error message is about, else the file."""
    source = definition.source
    mentioned = [key for key in raw.settings if f"config key {key}" in message or f"{key} option" in message]
    for key in sorted(mentioned, key=len, reverse=True):
        if key in definition.forced:
            return definition.forced_where[key]
        loc = _setting_loc(definition, raw, key)
        if loc is not None:
            return source.where(loc)
    return str(source.path)


def _setting_loc(definition: SweepDefinition, raw: RawCell, key: str) -> Loc | None:
    """Where in the file the cell's value of `key` is set (its last writer wins, as in the settings)."""
    source = definition.source
    for loc in reversed(raw.origin):
        node: Any = source.data
        try:
            for part in loc:
                node = node[part]
        except (KeyError, IndexError, TypeError):  # a profile replaced this part of the file
            continue
        if isinstance(node, dict) and key in node:
            return (*loc, key)
        if loc[0] in ("grid", "axes") and len(loc) == 3 and loc[1] == key:
            return loc
    if key in definition.spec.base:
        return ("base", key)
    return None
