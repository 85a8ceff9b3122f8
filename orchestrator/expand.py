"""Expand a sweep definition into the settings of each cell (before resolution against `conf/`).

    rows  = [base row] + one row per value of each axis       (one factor at a time; just [base] without axes)
    cells = rows x product(grid dimensions) x seeds  - exclude rules  + include entries x seeds
    every cell = base, then its row, then its grid values, then its seed, then forced keys (profile, --set)

A dimension given as a list of values varies the key it is named after; given as a list of mappings it is *linked*:
each mapping sets several keys together. Refused here: empty lists, mixed lists, dimensions that set the same key
(conflicting linked settings), an axis setting a key the grid varies, duplicate values, exclude rules that match
no cell, and an empty result.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from orchestrator.rules import MISSING, matches
from orchestrator.spec import SweepDefinition, check_key, describe_loc
from orchestrator.yamlsource import Loc, YamlSource
from orchlib.errors import OrchError
from recipes.config.resolve import frozen

BASE_AXIS = "base"
INCLUDE_AXIS = "include"


@dataclass(frozen=True)
class Choice:
    """One value of a dimension: the keys it sets and where it is written."""

    settings: dict[str, Any]
    loc: Loc


@dataclass(frozen=True)
class Dimension:
    """A grid dimension or an axis: its name, its choices and every key they set."""

    name: str
    choices: list[Choice]
    keys: frozenset[str]
    loc: Loc


@dataclass
class RawCell:
    """The settings of one cell, where they come from, and the axis row it belongs to."""

    settings: dict[str, Any]
    axis: str | None
    origin: tuple[Loc, ...]


def parse_dimension(name: Any, values: list[Any], source: YamlSource, loc: Loc) -> Dimension:
    """A dimension from its YAML list: scalars vary key `name`; mappings are linked settings."""
    if not values:
        raise source.error(loc, "empty list: a dimension needs at least one value (an empty grid has no cells)")
    linked = [isinstance(value, dict) for value in values]
    if any(linked) and not all(linked):
        raise source.error(loc, "mix of values and mappings: use values (one key) or mappings (linked keys)")
    choices = []
    if all(linked):
        for index, value in enumerate(values):
            if not value:
                raise source.error((*loc, index), "empty mapping: a linked row sets at least one key")
            for key in value:
                check_key(key, source, (*loc, index, key))
            choices.append(Choice(dict(value), (*loc, index)))
    else:
        check_key(name, source, loc)
        choices = [Choice({name: value}, (*loc, index)) for index, value in enumerate(values)]
    seen: dict[str, int] = {}
    for index, choice in enumerate(choices):
        text = json.dumps(choice.settings, sort_keys=True, default=repr)
        if text in seen:
            raise source.error(choice.loc, f"duplicate value (same as item {seen[text]})")
        seen[text] = index
    keys = frozenset(key for choice in choices for key in choice.settings)
    return Dimension(name=str(name), choices=choices, keys=keys, loc=loc)


def expand(definition: SweepDefinition) -> list[RawCell]:
    """Every cell of the sweep, in a stable order. Raises `OrchError` on structural problems."""
    spec, source = definition.spec, definition.source
    grid = [parse_dimension(name, values, source, ("grid", name)) for name, values in spec.grid.items()]
    axes = [parse_dimension(name, values, source, ("axes", name)) for name, values in spec.axes.items()]
    _check_conflicts(grid, axes, source)
    _check_rules(definition)

    rows: list[tuple[str | None, Choice | None]] = []
    if axes:
        if spec.include_base:
            rows.append((BASE_AXIS, None))
        rows += [(axis.name, choice) for axis in axes for choice in axis.choices]
    else:
        rows.append((None, None))

    base = {"backend": spec.backend, **spec.base}
    cells: list[RawCell] = []
    exclude_hits = [0] * len(spec.exclude)
    profile_hits = [0] * len(definition.profile_exclude)
    for axis, row in rows:
        for combo in itertools.product(*(dimension.choices for dimension in grid)):
            settings = dict(base)
            origin: list[Loc] = []
            for choice in (row, *combo):
                if choice is not None:
                    settings.update(choice.settings)
                    origin.append(choice.loc)
            for index, seed in enumerate(spec.seeds):
                cell_settings = {**settings, "seed": seed}
                excluded = False
                for rule_index, rule in enumerate(spec.exclude):
                    if matches(rule, _lookup(cell_settings, axis)):
                        exclude_hits[rule_index] += 1
                        excluded = True
                for rule_index, (rule, _, _) in enumerate(definition.profile_exclude):
                    if matches(rule, _lookup(cell_settings, axis)):
                        profile_hits[rule_index] += 1
                        excluded = True
                if not excluded:
                    cells.append(RawCell(cell_settings, axis, (*origin, ("seeds", index))))
    for rule_index, hits in enumerate(exclude_hits):
        if hits == 0:
            raise source.error(("exclude", rule_index), "this exclude rule matches no cell (a typo in a key or value?)")
    for (_, profile_source, where), hits in zip(definition.profile_exclude, profile_hits, strict=True):
        if hits == 0:
            raise profile_source.error(where, "this exclude rule matches no cell of the sweep (a typo in a key or "
                                              "value?)")

    for entry_index, entry in enumerate(spec.include):
        for index, seed in enumerate(spec.seeds):
            cells.append(RawCell({**base, **entry, "seed": seed}, INCLUDE_AXIS,
                                 (("include", entry_index), ("seeds", index))))

    if not cells:
        raise source.error((), "the sweep has no cells (every cell is excluded, or a dimension is empty)")
    if definition.forced:
        for cell in cells:
            matched = [rule.set for rule in definition.forced_rules
                       if matches(rule.when, lambda key, cell=cell: cell.settings.get(key, MISSING))]
            cell.settings.update(definition.forced)
            for forced in matched:
                cell.settings.update(forced)
    else:
        _refuse_identical_settings(cells, source)
    return cells


def _check_rules(definition: SweepDefinition) -> None:
    """Exclude rules match on config keys, `axis` and `seed`; none may be empty."""
    source = definition.source
    for index, rule in enumerate(definition.spec.exclude):
        if not rule:
            raise source.error(("exclude", index), "empty rule: it would exclude every cell")
        for key in rule:
            if key not in ("axis", "seed", "backend"):
                check_key(key, source, ("exclude", index, key))


def _lookup(settings: dict[str, Any], axis: str | None):
    def lookup(key: str) -> Any:
        if key == "axis":
            return axis if axis is not None else MISSING
        return settings.get(key, MISSING)

    return lookup


def _check_conflicts(grid: list[Dimension], axes: list[Dimension], source: YamlSource) -> None:
    """Grid dimensions must set disjoint keys; an axis must not set a key the grid varies."""
    owner: dict[str, Dimension] = {}
    for dimension in grid:
        for key in sorted(dimension.keys):
            if key in owner:
                raise source.error(
                    dimension.loc,
                    f"conflicting linked settings: {key} is also set by grid dimension "
                    f"{owner[key].name!r} (line {source.line(owner[key].loc)}); merge them into one linked dimension",
                )
            owner[key] = dimension
    for axis in axes:
        for key in sorted(axis.keys & owner.keys()):
            raise source.error(
                axis.loc,
                f"conflicting settings: axis {axis.name!r} sets {key}, which grid dimension {owner[key].name!r} "
                f"varies (line {source.line(owner[key].loc)}); use an exclude rule to restrict the grid instead",
            )


def _refuse_identical_settings(cells: list[RawCell], source: YamlSource) -> None:
    seen: dict[tuple, RawCell] = {}
    for cell in cells:
        text = frozen(cell.settings)
        if text in seen:
            raise OrchError(
                f"{source.path}: duplicate cells: {describe_origin(cell, source)} repeats "
                f"{describe_origin(seen[text], source)}"
            )
        seen[text] = cell


def describe_origin(cell: RawCell, source: YamlSource) -> str:
    """Where a cell comes from, e.g. `axes.size[1] (line 20) x grid.task[0] (line 9) x seed 3`."""
    parts = [describe_loc(source, loc) for loc in cell.origin if loc[0] != "seeds"]
    return " x ".join([*parts, f"seed {cell.settings.get('seed')}"])
