"""The one resolve: settings -> the validated `TrainConfig` of a run and its identity, in one call, for every command.

    resolve_cell({"task": "sokoban", "filter.value": 0.95, "seed": 1})   # a sweep cell: its settings
    resolve_cell(overrides=["task=sokoban", "filter.value=0.95"])        # `orch train`: Hydra-syntax overrides
    resolver = ConfigResolver(); resolver.resolve(settings)              # many cells: the caches shared
    shared, own = resolved.stored(); load_config(shared, own, hosting={...})   # a cell's stored form, and back

A cell's *settings* are the keys a sweep file sets (its base, its grid or axis row, its profile's forced keys, merged
by the planner): config-group choices (`task: sokoban`) and dotted keys (`filter.value: 0.95`, `seed: 1`). Its
*identity* is `recipes.config.schema.TrainConfig.digest()` of the resolved config, so two spellings of the same config
are the same cell, and editing a comment in a sweep file changes nothing. The sweep planner, `orch tune`, `orch eval`
and `orch train` resolve through `resolve_cell` (or a `ConfigResolver`, its cached form); nothing above the config
room composes `conf/` itself.

Composing with Hydra costs ~0.2 s per call, far too slow for 10,000 cells, so the work is split:

* `ConfTrees` composes `conf/` once per config-group option used (`task=frozenlake`), keeping that group's subtree,
  and caches the subtrees on disk (`<cache root>/conf-trees/`, keyed by a fingerprint of every file in `conf/`).
  An option that reaches outside its group, or choices of two groups that together pick a file of their own
  (`recipes.config.compose.paired_groups`: a model and a task pick their warm-start file), makes it compose that whole
  combination instead (cached on disk too: a paper grid composes a few dozen combinations);
* `ConfigResolver` sets a cell's dotted keys on its combination's tree (`recipes.config.compose.apply_settings`, with the
  types `conf/` gives them) and validates the result once per distinct *shape* (settings except the seed) with
  `TrainConfig.from_tree`; per cell, only the seed is set on a copy of the shape's config, then hashed.

A planned cell's config is stored with it and its job runs that object (`load_config`, with the hosting keys that
are not part of the identity). The stored form is its `conf/` tree as JSON in two parts (`stored_form`): the tree
without the per-cell keys, the same text for every seed of a shape (stored once), and the per-cell keys
(`{"seed": 1}`); together they are the whole tree. The Hydra overrides of its settings (`ResolvedConfig.overrides`)
are kept beside it for a person to read, and for the cells of stores written before configs were stored, whose jobs
still compose them with Hydra.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError, choices_error
from recipes.config import compose
from recipes.config.compose import (
    apply_settings,
    compose_tree,
    config_groups,
    has_interpolations,
    hydra_overrides,
    paired_groups,
    resolve_tree,
)
from recipes.config.schema import VERL_TRAINER_BEFORE_THE_KEY, TrainConfig, compose_train_config

# Keys varied per cell without re-validating the config (the schema of the sweep file checks them).
PER_CELL_KEYS = ("seed",)


@dataclass(frozen=True)
class ResolvedConfig:
    """One cell: its typed config, its identity, its settings with values converted to the types `conf/` gives
    them (`1` -> `1.0` for a float key), and those settings as Hydra overrides (what a person reads)."""

    config: TrainConfig
    digest: str
    settings: dict[str, Any]
    overrides: list[str]
    shape: ResolvedConfig | None = field(default=None, repr=False, compare=False)  # the config it copies, if any

    @functools.cached_property
    def shared_json(self) -> str:
        """The stored form's shared part (`stored_form`): computed once per shape, whose cells differ only in their
        per-cell keys."""
        return self.shape.shared_json if self.shape is not None else stored_form(self.config)[0]

    def stored(self) -> tuple[str, str]:
        """The config's stored form (`stored_form`): (the tree without the per-cell keys, the per-cell keys)."""
        return self.shared_json, _own_json(self.config)


def resolve_cell(settings: Mapping[str, Any] | None = None, *, overrides: Sequence[str] | None = None,
                 hosting: Mapping[str, Any] | None = None, host: bool = False,
                 resolver: ConfigResolver | None = None) -> ResolvedConfig:
    """The validated config of `settings` (group choices and dotted keys, as a sweep cell has them) and its
    identity. Given Hydra-syntax `overrides` (`orch train`'s arguments, none included; a stored cell's overrides) the
    whole config is composed with Hydra, `settings` first; else through `resolver`'s caches (a new `ConfigResolver`
    if none).
    `hosting`: keys that are not part of the identity (`mlflow.run_id`, `trainer.checkpoint_dir`, ...,
    `TrainConfig.with_hosting`); `host`: also run the checks only the training host can make (`check_host`).

    Raises:
        OrchError: one line naming the key (or the override) and the valid choices.
    """
    settings = dict(settings or {})
    if overrides is not None:
        composed = [*hydra_overrides(settings, config_groups()), *overrides]
        if hosting:
            composed += hydra_overrides(dict(hosting), ())
        config = compose_train_config(composed, host=host)
        return ResolvedConfig(config, config.digest(), settings, composed)
    resolved = (resolver or ConfigResolver()).resolve(settings)
    if not hosting and not host:
        return resolved
    config = resolved.config.with_hosting(hosting) if hosting else resolved.config
    if host:
        config.check_host()
    return ResolvedConfig(config, resolved.digest, resolved.settings, resolved.overrides)


def stored_form(config: TrainConfig) -> tuple[str, str]:
    """A config's stored form: its `conf/` tree (`TrainConfig.to_tree`) as JSON, in two parts: the tree without the
    per-cell keys (`PER_CELL_KEYS`), and those keys (`{"seed": 1}`). `load_config` reads them back."""
    tree = config.to_tree()
    for key in PER_CELL_KEYS:
        tree.pop(key, None)
    return json.dumps(tree), _own_json(config)


def _own_json(config: TrainConfig) -> str:
    return json.dumps({key: getattr(config, key) for key in PER_CELL_KEYS})


def load_config(shared: str, own: str = "{}", hosting: Mapping[str, Any] | None = None) -> TrainConfig:
    """A stored config (`stored_form`: its shared part and its per-cell keys) validated by this orch's
    `TrainConfig`, with `hosting` keys set (`TrainConfig.with_hosting`). A key the schema has gained since it was
    stored takes its default (a required one is refused), except `verl.trainer`: a config stored without it was
    planned when veRL's legacy trainer was the only one, and keeps it when the default changes (hosting, but a
    cell's checkpoints are its trainer's: recipes.verl.backend.keep_trainer). A key it has lost or renamed is
    refused. Raises `OrchError`, one line naming the key."""
    tree = {}
    for text in (shared, own):
        try:
            part = json.loads(text)
        except ValueError as err:
            raise OrchError(f"not a stored config: {err}") from None
        if not isinstance(part, dict):
            raise OrchError(f"not a stored config: a JSON {type(part).__name__}, not an object")
        tree.update(part)
    verl = tree.setdefault("verl", {})
    if isinstance(verl, dict):  # stored before `verl.trainer` existed: planned for (and run by) the legacy trainer
        verl.setdefault("trainer", VERL_TRAINER_BEFORE_THE_KEY)
    config = TrainConfig.from_tree(tree)
    return config.with_hosting(hosting) if hosting else config


def resolve_stored(shared: str, own: str, settings: Mapping[str, Any]) -> ResolvedConfig:
    """A stored config (`load_config`) with the dotted keys of `settings` set on its tree (typed as the tree has
    them, as `apply_settings` does for a cell), validated and hashed: a config derived from a planned one whatever
    `conf/` holds now (`orch eval --sweep`: a training cell's stored config plus `evaluation.*`). Raises `OrchError`
    naming the key."""
    tree, normalized = apply_settings(load_config(shared, own).to_tree(), dict(settings), {})
    config = TrainConfig.from_tree(tree)
    return ResolvedConfig(config, config.digest(), normalized, hydra_overrides(normalized, ()))


class ConfigResolver:
    """Resolve, validate and hash cell settings against `conf/`, with caches shared by all cells of a sweep."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.trees = ConfTrees(cache_dir)
        self.groups = self.trees.groups
        self._shapes: dict[tuple, tuple[ResolvedConfig, bool]] = {}  # shape -> (config, has interpolations)

    def resolve(self, settings: dict[str, Any]) -> ResolvedConfig:
        """The typed config and identity of a cell. Raises `OrchError` naming the offending key."""
        per_cell = {key: settings[key] for key in PER_CELL_KEYS if key in settings}
        shape_settings = {key: value for key, value in settings.items() if key not in per_cell}
        shape_key = frozen(shape_settings)
        if shape_key not in self._shapes:
            interpolated = has_interpolations(self.trees.tree_for(shape_settings))
            self._shapes[shape_key] = (self._resolve(shape_settings), interpolated)
        shape, interpolated = self._shapes[shape_key]
        if not per_cell:
            return shape
        normalized = {**shape.settings, **per_cell}
        overrides = shape.overrides + hydra_overrides(per_cell, ())
        if interpolated:
            config = self._resolve(normalized).config  # a key may derive from the seed
            return ResolvedConfig(config, config.digest(), normalized, overrides)
        config = shape.config.model_copy(update=per_cell)
        return ResolvedConfig(config, config.digest(), normalized, overrides, shape)

    def flush(self) -> None:
        """Write what was composed to the on-disk cache (once per plan)."""
        self.trees.flush()

    def _resolve(self, settings: dict[str, Any]) -> ResolvedConfig:
        """Apply `settings` to their combination's tree, resolve and validate it."""
        tree, normalized = apply_settings(self.trees.tree_for(settings), settings, self.groups)
        config = TrainConfig.from_tree(resolve_tree(tree))  # not `check_host`: the cells run on other hosts
        return ResolvedConfig(config, config.digest(), normalized, hydra_overrides(normalized, self.groups))


class ConfTrees:
    """`conf/` composed per config-group option (and per combination that must be composed whole), cached in memory
    and on disk (see the module docstring)."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.groups: dict[str, list[str]] = config_groups()
        self.paired = paired_groups()
        self._file = _cache_file(cache_dir)
        try:
            data: dict[str, Any] = json.loads(self._file.read_text())
        except (OSError, ValueError):
            data = {}
        self._default: dict[str, Any] | None = data.get("default")
        self._group_trees: dict[tuple[str, str], Any] = {
            tuple(key.split("=", 1)): tree for key, tree in data.get("groups", {}).items()
        }
        self._combos: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self._whole: dict[str, dict[str, Any]] = data.get("combinations", {})  # "g=o,g=o" -> composed whole
        self._dirty = False

    def default(self) -> dict[str, Any]:
        """`conf/train.yaml` composed with no overrides (unresolved)."""
        if self._default is None:
            self._default, choices = compose_tree([])
            for group, option in choices.items():
                if group in self.groups:
                    self._group_trees[(group, option)] = self._default[group]
            self._dirty = True
        return self._default

    def tree_for(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The unresolved config of the group choices in `settings` (before dotted keys are applied)."""
        for group in self.groups.keys() & settings.keys():
            if not isinstance(settings[group], str) or settings[group] not in self.groups[group]:
                raise choices_error(f"{group} option", settings[group], self.groups[group])
        combo = tuple(sorted((key, value) for key, value in settings.items() if key in self.groups))
        if combo not in self._combos:
            tree = dict(self.default())
            subtrees = [(group, self._group_tree(group, option)) for group, option in combo]
            # an option that reaches outside its group, or a pair of choices that picks a file of its own
            chosen = dict(combo).keys()
            if any(subtree is None for _, subtree in subtrees) or any(len(pair & chosen) > 1 for pair in self.paired):
                overrides = [f"{group}={option}" for group, option in combo]
                key = ",".join(overrides)
                if key not in self._whole:
                    self._whole[key] = compose_tree(overrides)[0]
                    self._dirty = True
                tree = self._whole[key]
            else:
                tree.update(subtrees)
            self._combos[combo] = tree
        return self._combos[combo]

    def flush(self) -> None:
        """Write the composed subtrees atomically; a read-only cache directory only costs speed."""
        if not self._dirty:
            return
        groups = {f"{group}={option}": tree for (group, option), tree in self._group_trees.items()}
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            scratch = self._file.with_suffix(f".{os.getpid()}.tmp")
            scratch.write_text(json.dumps({"default": self._default, "groups": groups, "combinations": self._whole}))
            scratch.replace(self._file)
        except OSError:
            pass
        self._dirty = False

    def _group_tree(self, group: str, option: str) -> Any:
        """The subtree that `group=option` gives, or None when it also changes keys outside `group`."""
        if (group, option) not in self._group_trees:
            composed = compose_tree([f"{group}={option}"])[0]
            default = self.default()
            outside_same = all(composed.get(key) == default.get(key) for key in set(composed) | set(default)
                               if key != group)
            self._group_trees[(group, option)] = composed[group] if outside_same else None
            self._dirty = True
        return self._group_trees[(group, option)]


def _cache_file(cache_dir: Path | None) -> Path:
    """The cache file of this `conf/` (and Hydra version): any edit of `conf/` makes a new file."""
    import hydra

    from recipes.runtime.cache import cache_root

    conf = compose.CONF_DIR  # read when called: a test may point it elsewhere
    digest = hashlib.sha256(hydra.__version__.encode())
    for path in sorted(conf.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(conf)).encode() + b"\0" + path.read_bytes() + b"\0")
    return cache_root(str(cache_dir) if cache_dir else None) / "conf-trees" / f"{digest.hexdigest()[:20]}.json"


def frozen(settings: dict[str, Any]) -> tuple:
    """A hashable, order-free key of `settings` (`True` and `1` stay apart; lists and dicts as JSON)."""
    return tuple(sorted(
        (key, type(value).__name__, value if isinstance(value, str | int | float | bool | None) else
         json.dumps(value, sort_keys=True, default=repr))
        for key, value in settings.items()
    ))
