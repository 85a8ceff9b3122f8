"""Resolve a cell's settings into its training config, validate it, and hash it into the cell's identity.

A cell's *settings* are the keys a sweep file sets: config-group choices (`task: sokoban`) and dotted keys
(`filter.value: 0.95`, `seed: 1`). Its *identity* is a stable hash of the resolved training config
(`conf/train.yaml` composed with those settings), infra keys excluded (`INFRA_KEYS`), so two spellings of the same
config are the same cell, and editing a comment in a sweep file changes nothing.

Composing with Hydra costs ~0.2 s per call here, far too slow for 10,000 cells, so `ConfigResolver` composes as
little as it can, and validates with the trainer's own `recipes.config.validate_train_config`:

* once per config-group option used (`task=frozenlake`), keeping only that group's subtree; a check that the rest
  of the config is untouched guards this (an option that reaches outside its group makes the resolver compose
  that whole combination instead). These subtrees are cached on disk under `$ORCH_CACHE_DIR` (default
  `~/.cache/orch`), keyed by a fingerprint of every file in `conf/`, so an unchanged `conf/` is never recomposed;
* once per distinct *shape* (settings except `PER_CELL_KEYS`, i.e. the seed), the assembled config is validated
  by `recipes.config.validate_train_config` and resolved;
* per cell, only the seed is written into a copy of the shape's config, then hashed. When `conf/` holds
  interpolations (`${...}`), each cell is resolved by OmegaConf instead, so a key derived from the seed stays right.

The job later composes the same settings with `recipes.config.compose_train_config` (`hydra_overrides`) and checks
it gets the same hash.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError, choices_error

# Keys the orchestrator sets per cell, or that change how a run is hosted but not what it computes.
INFRA_KEYS = ("mlflow", "trainer.checkpoint_dir", "trainer.progress", "trainer.resume", "trainer.threads")
# Keys the sweep file may not set because the orchestrator owns them.
ORCHESTRATOR_KEYS = ("mlflow", "trainer.checkpoint_dir")
# Keys varied per cell without re-validating the config (the schema of the sweep file checks them).
PER_CELL_KEYS = ("seed",)
# Backends named by the design but not implemented yet: cells are validated and can be dry-run, not submitted.
PLANNED_BACKENDS = {"verl": "the veRL backend is not implemented yet (a later issue); use --dry-run, or --profile cpu"}

_INTERPOLATION = re.compile(r"\$\{")
# The code behind recipes.config.validate_train_config: a cached validation is only reused while it is unchanged.
VALIDATOR_SOURCES = ("config.py", "filtering.py", "backends.py")


@dataclass(frozen=True)
class ResolvedConfig:
    """The resolved training config of one cell (infra keys included, as composed), its identity, its settings
    with values converted to the types `conf/` gives them (`1` -> `1.0` for a float key), and those settings as
    Hydra overrides (what the job composes)."""

    config: dict[str, Any]
    digest: str
    settings: dict[str, Any]
    overrides: list[str]


def config_digest(config: dict[str, Any]) -> str:
    """Stable 16-hex-digit hash of a resolved config, `INFRA_KEYS` excluded."""
    return hashlib.sha256(_canonical(strip_keys(config, INFRA_KEYS)).encode()).hexdigest()[:16]


def strip_keys(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """A copy of `config` without the dotted `keys` (copying only the dicts on the way)."""
    result = dict(config)
    for dotted in keys:
        *parents, leaf = dotted.split(".")
        node = result
        for part in parents:
            if not isinstance(node.get(part), dict):
                break
            node[part] = dict(node[part])
            node = node[part]
        else:
            node.pop(leaf, None)
    return result


def hydra_overrides(settings: dict[str, Any], groups: set[str] | dict[str, Any]) -> list[str]:
    """Hydra override strings for `settings`: group choices first, then dotted keys, values typed exactly."""
    ordered = sorted(settings.items(), key=lambda item: (item[0] not in groups, item[0]))
    return [f"{key}={value if key in groups else _hydra_value(value)}" for key, value in ordered]


def _hydra_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        # Hydra quoted strings: escape quotes, and double the backslashes that precede a quote or the end.
        escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
        return f"'{escaped}'"
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_hydra_value(item)}" for key, item in value.items()) + "}"
    raise OrchError(f"cannot express {value!r} ({type(value).__name__}) as a config value")


class ConfigResolver:
    """Resolve, validate and hash cell settings against `conf/`, with caches shared by all cells of a sweep."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        from recipes.config import CONF_DIR, config_groups

        self.groups: dict[str, list[str]] = config_groups()
        self._cache = _TreeCache(CONF_DIR, cache_dir)
        self._default_tree: dict[str, Any] | None = self._cache.data.get("default")
        self._group_trees: dict[tuple[str, str], Any] = {
            tuple(key.split("=", 1)): tree for key, tree in self._cache.data.get("groups", {}).items()
        }
        self._validated: set[str] = set(self._cache.data.get("validated", []))
        self._dirty = False
        self._combo_trees: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self._combo_configs: dict[tuple[tuple[str, str], ...], Any] = {}
        self._shapes: dict[tuple, _Shape] = {}

    # -- public -------------------------------------------------------------------------------------------------

    def resolve(self, settings: dict[str, Any]) -> ResolvedConfig:
        """The resolved config and identity of a cell. Raises `OrchError` naming the offending key."""
        per_cell = {key: settings[key] for key in PER_CELL_KEYS if key in settings}
        shape_settings = {key: value for key, value in settings.items() if key not in per_cell}
        shape_key = frozen(shape_settings)
        shape = self._shapes.get(shape_key)
        if shape is None:
            shape = self._shapes[shape_key] = self._resolve_shape(shape_settings)
        if not per_cell:
            return ResolvedConfig(shape.config, shape.digest, shape.normalized, shape.overrides)
        normalized = {**shape.normalized, **per_cell}
        overrides = shape.overrides + hydra_overrides(per_cell, ())
        if shape.has_interpolations:
            tree, _ = self._apply(self._tree_for(shape_settings), normalized)
            config = self._resolve_tree(tree)
            return ResolvedConfig(config, config_digest(config), normalized, overrides)
        config = dict(shape.config)
        text = shape.template
        for key, value in per_cell.items():
            _set_plain(config, key, value)
            text = text.replace(_sentinel_json(key), json.dumps(value, sort_keys=True, separators=(",", ":")))
        return ResolvedConfig(config, hashlib.sha256(text.encode()).hexdigest()[:16], normalized, overrides)

    def default_tree(self) -> dict[str, Any]:
        """`conf/train.yaml` composed with no overrides (unresolved)."""
        if self._default_tree is None:
            self._default_tree, choices = self._compose_with_choices([])
            for group, option in choices.items():
                if group in self.groups:
                    self._group_trees[(group, option)] = self._default_tree[group]
            self._dirty = True
        return self._default_tree

    def flush(self) -> None:
        """Write what was composed or validated to the on-disk cache (once per plan)."""
        if self._dirty:
            groups = {f"{group}={option}": tree for (group, option), tree in self._group_trees.items()}
            self._cache.save({"default": self._default_tree, "groups": groups, "validated": sorted(self._validated)})
            self._dirty = False

    # -- composition --------------------------------------------------------------------------------------------

    def _compose(self, overrides: list[str]) -> dict[str, Any]:
        """Compose `conf/` with group overrides, unvalidated (an option may leave `???` for a setting to fill;
        the assembled config is validated per shape)."""
        return self._compose_with_choices(overrides)[0]

    def _compose_with_choices(self, overrides: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The composed config (unresolved) and the group options it was built from."""
        from hydra import compose, initialize_config_dir
        from hydra.errors import HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        from recipes.config import CONF_DIR, CONFIG_NAME

        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
                cfg = compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as err:
            first = str(err).strip().splitlines()[0]
            raise OrchError(f"conf/{CONFIG_NAME}.yaml with {overrides}: {first}") from None
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        tree = OmegaConf.to_container(cfg, resolve=False)
        tree.pop("hydra")
        return tree, choices

    def _tree_for(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The unresolved config of the group choices in `settings` (before dotted keys are applied)."""
        for group in self.groups.keys() & settings.keys():
            if not isinstance(settings[group], str) or settings[group] not in self.groups[group]:
                raise choices_error(f"{group} option", settings[group], self.groups[group])
        combo = tuple(sorted((key, value) for key, value in settings.items() if key in self.groups))
        if combo in self._combo_trees:
            return self._combo_trees[combo]
        tree = dict(self.default_tree())
        coupled = False
        for group, option in combo:
            subtree = self._group_tree(group, option)
            if subtree is None:
                coupled = True
                break
            tree[group] = subtree
        if coupled:  # an option reaches outside its group: compose the whole combination
            tree = self._compose([f"{group}={option}" for group, option in combo])
        self._combo_trees[combo] = tree
        return tree

    def _group_tree(self, group: str, option: str) -> Any:
        """The subtree that `group=option` gives, or None when it also changes keys outside `group`."""
        if (group, option) not in self._group_trees:
            composed = self._compose([f"{group}={option}"])
            default = self.default_tree()
            outside_same = all(composed.get(key) == default.get(key) for key in set(composed) | set(default)
                               if key != group)
            self._group_trees[(group, option)] = composed[group] if outside_same else None
            self._dirty = True
        return self._group_trees[(group, option)]

    def _apply(self, tree: dict[str, Any], settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A copy of `tree` with the dotted keys of `settings` set (each must already exist), and the settings
        with their values converted to the types of `tree`."""
        tree = copy.deepcopy(tree)
        normalized = {}
        for key, value in settings.items():
            normalized[key] = value if key in self.groups else _set_existing(tree, key, value)
        return tree, normalized

    def _resolve_tree(self, tree: dict[str, Any]) -> dict[str, Any]:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)

    def _combo_config(self, settings: dict[str, Any]) -> Any:
        """The DictConfig of the group choices in `settings` (cached; shapes set their keys on it in turn)."""
        from omegaconf import OmegaConf

        combo = tuple(sorted((key, value) for key, value in settings.items() if key in self.groups))
        if combo not in self._combo_configs:
            self._combo_configs[combo] = OmegaConf.create(self._tree_for(settings))
        return self._combo_configs[combo]

    def _resolve_shape(self, shape: dict[str, Any]) -> _Shape:
        """Validate the config of `shape` (once per config: results are cached with the conf/ trees); return it
        resolved."""
        base = self._tree_for(shape)
        tree, normalized = self._apply(base, shape)
        has_interpolations = bool(_INTERPOLATION.search(json.dumps(tree, default=str)))
        updates = {key: value for key, value in normalized.items() if key not in self.groups}
        if str(tree.get("backend")) in PLANNED_BACKENDS:
            # Until the backend exists, check the shared keys with the torch backend's validator; the model path
            # is the planned backend's business (it may name a hub model, not a local folder).
            updates["backend"] = "torch"
            if isinstance(tree.get("model"), dict) and "path" in tree["model"]:
                updates["model.path"] = None
        validation_key = hashlib.sha256(_canonical({"tree": tree, "check": updates}).encode()).hexdigest()[:24]
        if validation_key in self._validated and not has_interpolations:
            resolved = tree
        else:
            resolved = self._validate(shape, base, updates, has_interpolations) or tree
            self._validated.add(validation_key)
            self._dirty = True
        template = None
        if not has_interpolations:
            marked = dict(tree)
            for key in PER_CELL_KEYS:
                _set_plain(marked, key, _sentinel(key))
            template = _canonical(strip_keys(marked, INFRA_KEYS))
        return _Shape(config=resolved, digest=config_digest(resolved), normalized=normalized,
                      overrides=hydra_overrides(normalized, self.groups), has_interpolations=has_interpolations,
                      template=template)

    def _validate(self, shape: dict[str, Any], base: dict[str, Any], updates: dict[str, Any],
                  has_interpolations: bool) -> dict[str, Any] | None:
        """Run the trainer's validator on the shape's config; return it resolved when it has interpolations.

        The shape's keys are set on the cached combination config and put back afterwards: creating a DictConfig
        per shape would cost more than the validation itself.
        """
        from omegaconf import OmegaConf

        from recipes.config import validate_train_config

        cfg = self._combo_config(shape)
        originals = {key: _get_plain(base, key) for key in updates}
        try:
            for key, value in updates.items():
                OmegaConf.update(cfg, key, value, merge=False)
            try:
                validate_train_config(cfg)
            except (ValueError, TypeError) as err:
                raise OrchError(f"invalid config value: {err}") from None
            return OmegaConf.to_container(cfg, resolve=True) if has_interpolations else None
        finally:
            for key, value in originals.items():
                OmegaConf.update(cfg, key, value, merge=False)


@dataclass(frozen=True)
class _Shape:
    """A validated shape: its resolved config and digest, normalized settings, and the canonical JSON of its
    config with a placeholder for each per-cell key (a cell's digest is then a string replacement away)."""

    config: dict[str, Any]
    digest: str
    normalized: dict[str, Any]
    overrides: list[str]
    has_interpolations: bool
    template: str | None


def frozen(settings: dict[str, Any]) -> tuple:
    """A hashable, order-free key of `settings` (`True` and `1` stay apart; lists and dicts as JSON)."""
    return tuple(sorted(
        (key, type(value).__name__, value if isinstance(value, str | int | float | bool | None) else
         json.dumps(value, sort_keys=True, default=repr))
        for key, value in settings.items()
    ))


def _canonical(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)


def _sentinel(key: str) -> str:
    return f"\x00orch-per-cell:{key}\x00"


def _sentinel_json(key: str) -> str:
    return json.dumps(_sentinel(key))


def _get_plain(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


class _TreeCache:
    """A JSON file of composed group subtrees and validated configs, named by a fingerprint of `conf/` and of the
    validator's sources (any edit makes a new file)."""

    def __init__(self, conf_dir: Path, cache_dir: Path | None) -> None:
        import hydra

        digest = hashlib.sha256(hydra.__version__.encode())
        validators = [conf_dir.parent / "recipes" / name for name in VALIDATOR_SOURCES]
        for path in [*sorted(conf_dir.rglob("*")), *validators]:
            if path.is_file():
                digest.update(str(path.relative_to(conf_dir.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
        root = cache_dir or Path(os.environ.get("ORCH_CACHE_DIR") or Path.home() / ".cache" / "orch")
        self.path = root / "conf-trees" / f"{digest.hexdigest()[:20]}.json"
        try:
            self.data: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.data = {}

    def save(self, data: dict[str, Any]) -> None:
        """Write atomically; a read-only cache directory only costs speed."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.path)
        except OSError:
            pass


def _set_existing(tree: dict[str, Any], dotted: str, value: Any) -> Any:
    """Set `dotted` in `tree` (every part must exist) to `value` converted to the type already there; return
    the converted value. Raises `OrchError` listing the valid keys."""
    node: Any = tree
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the top level"
        if not isinstance(node, dict):
            raise OrchError(f"config key {dotted}: {where} is a value, not a section")
        if part not in node:
            raise choices_error(f"config key {part!r} under", where, list(node), where=f"config key {dotted}")
        if depth == len(parts) - 1:
            if isinstance(node[part], dict):
                keys = ", ".join(sorted(node[part]))
                raise OrchError(f"config key {dotted}: is a section; set one of its keys ({keys})")
            node[part] = _coerce(dotted, node[part], value)
            return node[part]
        node = node[part]
    return value


def _set_plain(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` in a resolved config, copying the dicts on the way (they may be shared)."""
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
        node[part] = dict(node[part])
        node = node[part]
    node[leaf] = value


def _coerce(key: str, current: Any, value: Any) -> Any:
    """Check `value` against the type of the `conf/` value `current`; ints become floats for float keys."""
    if current is None or value is None or isinstance(current, str) and _INTERPOLATION.search(current):
        return value
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a section"}
    expected = next((kind for kind in kinds if type(current) is kind), None)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool)
        or isinstance(value, float) and value.is_integer(),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
        list: isinstance(value, list),
        dict: isinstance(value, dict),
    }.get(expected, True)
    if not ok:
        raise OrchError(f"config key {key}: expected {kinds[expected]} (conf/ has {current!r}), got {value!r}")
    if expected is float:
        return float(value)
    if expected is int:
        return int(value)
    return value
