"""Compose `conf/` with Hydra: the config groups, override parsing and the composed tree, with every problem of an
override reported as one `OrchError` line naming the override, the key and the valid choices.

This module knows Hydra and `conf/`'s layout only; what the values mean and which are valid is the typed config's
business (`recipes.config.schema.TrainConfig`). Every command resolves a config through `recipes.config.resolve` (the
one resolve: `orch train`'s overrides through `recipes.config.schema.compose_train_config`, a sweep's cells through
cached group subtrees), which composes through `compose_tree`; nothing outside the config room uses these helpers.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError, choices_error

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CONFIG_NAME = "train"


def config_groups() -> dict[str, list[str]]:
    """Config groups of `conf/` and their options (YAML stems; files starting with `_` are shared bases)."""
    return {
        group.name: sorted(path.stem for path in group.glob("*.yaml") if not path.stem.startswith("_"))
        for group in sorted(CONF_DIR.iterdir())
        if group.is_dir()
    }


def paired_groups() -> list[set[str]]:
    """The sets of config groups whose choices together pick a file of their own: every entry of `conf/train.yaml`'s
    defaults list that interpolates two or more group choices (`optional model/warm_start@model.warm_start:
    ${model}_${task}` picks conf/model/warm_start/<model>_<task>.yaml). A group's subtree composed alone is then not
    its subtree beside another choice of the other groups."""
    import yaml

    defaults = yaml.safe_load((CONF_DIR / f"{CONFIG_NAME}.yaml").read_text()).get("defaults", [])
    entries = [value for entry in defaults if isinstance(entry, dict) for value in entry.values()]
    found = [set(re.findall(r"\$\{(\w+)\}", value)) for value in entries if isinstance(value, str)]
    return [groups for groups in found if len(groups) > 1]


def compose_tree(overrides: list[str] | tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    """`conf/train.yaml` composed with Hydra-syntax `overrides`, unresolved, and the group options it was built
    from (`{"task": "sokoban", ...}`). No value is validated here.

    Raises:
        OrchError: bad override syntax, an unknown group option or key, an attempt to add or delete a key, or a
            sweep (`a=1,2`).
    """
    overrides = list(overrides)
    parsed = _parse_overrides(overrides)
    groups = config_groups()
    group_overrides = []
    for text, override in zip(overrides, parsed, strict=True):
        key = override.key_or_group
        if not key:
            raise OrchError(f"override {text!r}: no key; expected key=value")
        if override.is_add() or override.is_force_add() or override.is_delete():
            raise OrchError(f"override {text!r}: adding or deleting keys is not supported; set an existing key")
        if override.is_sweep_override():
            raise OrchError(f"override {text!r}: one value per key here; sweeps belong in a sweep file")
        if key in groups:
            option = override.value()
            if option not in groups[key]:
                raise choices_error(f"{key} option", option, groups[key], where=f"override {text!r}")
            group_overrides.append(text)
    try:
        return _compose(overrides)
    except OrchError:
        base, _ = _compose(group_overrides)
        _diagnose_keys(base, overrides, parsed, groups)
        raise


def missing_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose value is `???` (required, not set) in an unresolved tree."""
    missing = []
    for key, value in tree.items():
        if isinstance(value, dict):
            missing += missing_keys(value, f"{prefix}{key}.")
        elif value == "???":
            missing.append(f"{prefix}{key}")
    return missing


def resolve_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """`tree` with its interpolations (`${...}`) resolved (`tree` itself when it has none)."""
    if not has_interpolations(tree):
        return tree
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(tree), resolve=True, throw_on_missing=False)


def has_interpolations(tree: dict[str, Any]) -> bool:
    """Whether any value of `tree` holds an interpolation (`${...}`)."""
    return any(has_interpolations(value) if isinstance(value, dict) else isinstance(value, str) and "${" in value
               or isinstance(value, list) and any(isinstance(item, str) and "${" in item for item in value)
               for value in tree.values())


def apply_settings(tree: dict[str, Any], settings: dict[str, Any],
                   groups: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A copy of `tree` with the dotted keys of `settings` set (each must exist in `tree`; group choices, already
    composed into `tree`, are skipped), and the settings with their values converted to the types `tree` has for
    them (`1` -> `1.0` for a float key). The same settings as Hydra overrides (`hydra_overrides`) compose to the
    same config. Raises `OrchError` naming the key and the valid keys or the expected type."""
    tree = copy.deepcopy(tree)
    normalized = {}
    for key, value in settings.items():
        normalized[key] = value if key in groups else _set_existing(tree, key, value)
    return tree, normalized


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
            raise choices_error(f"config key {part!r} under", where, list(node), where=f"config key {dotted}",
                                typed=part)
        if depth == len(parts) - 1:
            if isinstance(node[part], dict):
                keys = ", ".join(sorted(node[part]))
                raise OrchError(f"config key {dotted}: is a section; set one of its keys ({keys})")
            node[part] = _coerce(dotted, node[part], value)
            return node[part]
        node = node[part]
    return value


def _coerce(key: str, current: Any, value: Any) -> Any:
    """Check `value` against the type of the `conf/` value `current`; ints become floats for float keys."""
    if current is None or value is None or isinstance(current, str) and "${" in current:
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


def _parse_overrides(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except HydraException as err:
            first = str(err).strip().splitlines()[0]
            raise OrchError(f"override {text!r}: cannot parse ({first}); expected key=value") from None
    return parsed


def _compose(overrides: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0]
        raise OrchError(f"conf/{CONFIG_NAME}.yaml with overrides {overrides}: {first}") from None
    finally:
        GlobalHydra.instance().clear()
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    tree = OmegaConf.to_container(cfg, resolve=False)
    tree.pop("hydra")
    return tree, choices


def _diagnose_keys(base: dict[str, Any], overrides: list[str], parsed: list[Any], groups: dict[str, list[str]]) -> None:
    """Raise the precise error for the first override whose key is not in `base` (no-op if all exist)."""
    for text, override in zip(overrides, parsed, strict=True):
        if override.key_or_group not in groups:
            _check_key_exists(base, override.key_or_group, text)


def _check_key_exists(tree: dict[str, Any], dotted: str, text: str) -> None:
    node: Any = tree
    walked = []
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            parent = ".".join(walked) or "(top level)"
            valid = list(node.keys()) if isinstance(node, dict) else []
            if not valid:
                raise OrchError(f"override {text!r}: {parent} is a value, not a section; it has no key {part!r}")
            raise choices_error(f"config key {part!r} under", parent, valid, where=f"override {text!r}", typed=part)
        walked.append(part)
        node = node[part]
