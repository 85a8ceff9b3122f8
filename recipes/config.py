"""Compose and validate a training config from `conf/` (Hydra compose API, no working-directory change).

`compose_train_config(["task=frozenlake", "filter.value=0.95"])` returns the resolved `DictConfig` of one run.
Every problem is reported as an `OrchError` naming the override, the key and the valid choices, before any work:
an unknown group option (`task=foo`), an unknown key (`trainer.bogus=1`), an attempt to add a key (`+x=1`), a
sweep (`a=1,2`) or a bad value (`filter.strategy=top_q`, `algorithm.loss_agg_mode=mean`).

Imports here stay light (hydra, omegaconf, pydantic): the sweep engine composes one config per cell.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchlib.errors import OrchError, choices_error

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "train"

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl", "full")
DTYPES = ("float32", "bfloat16")
RESUME_MODES = ("auto", "never")


def config_groups() -> dict[str, list[str]]:
    """Config groups of `conf/` and their options (YAML stems; files starting with `_` are shared bases)."""
    return {
        group.name: sorted(path.stem for path in group.glob("*.yaml") if not path.stem.startswith("_"))
        for group in sorted(CONF_DIR.iterdir())
        if group.is_dir()
    }


def compose_train_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The resolved training config of `conf/train.yaml` with Hydra-syntax `overrides` applied.

    Raises:
        OrchError: bad override syntax, unknown group option or key, or an invalid value.
    """
    overrides = list(overrides)
    parsed = _parse_overrides(overrides)
    groups = config_groups()
    group_overrides = []
    for text, override in zip(overrides, parsed, strict=True):
        key = override.key_or_group
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
        cfg = _compose(overrides)
    except OrchError:
        _diagnose_keys(_compose(group_overrides), overrides, parsed, groups)
        raise
    validate_train_config(cfg)
    return cfg


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


def _compose(overrides: list[str]) -> DictConfig:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            return compose(config_name=CONFIG_NAME, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0]
        raise OrchError(f"conf/{CONFIG_NAME}.yaml with overrides {overrides}: {first}") from None
    finally:
        GlobalHydra.instance().clear()


def _diagnose_keys(base: DictConfig, overrides: list[str], parsed: list[Any], groups: dict[str, list[str]]) -> None:
    """Raise the precise error for the first override whose key is not in `base` (no-op if all exist)."""
    for text, override in zip(overrides, parsed, strict=True):
        if override.key_or_group not in groups:
            _check_key_exists(base, override.key_or_group, text)


def _check_key_exists(cfg: DictConfig, dotted: str, text: str) -> None:
    node: Any = cfg
    walked = []
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            parent = ".".join(walked) or "(top level)"
            valid = list(node.keys()) if isinstance(node, DictConfig) else []
            if not valid:
                raise OrchError(f"override {text!r}: {parent} is a value, not a section; it has no key {part!r}")
            raise choices_error(f"config key {part!r} under", parent, valid, where=f"override {text!r}")
        walked.append(part)
        node = node[part]


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise OrchError(f"config key {key}: {message}")


def _check_choice(cfg: DictConfig, key: str, valid: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in valid:
        raise choices_error("value", value, valid, where=f"config key {key}")


def validate_train_config(cfg: DictConfig) -> None:
    """Check the values of a composed config (cheap: no torch, no model; the environment validates `task.env`).
    Raises OrchError."""
    from pydantic import ValidationError

    from recipes.backends import backend_names

    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise OrchError(f"config key {missing[0]}: required value not set (??? in conf/); set {missing[0]}=...")
    _check_choice(cfg, "backend", tuple(backend_names()))
    _check_choice(cfg, "algorithm.loss_agg_mode", LOSS_AGG_MODES)
    _check_choice(cfg, "algorithm.kl_penalty", KL_PENALTIES)
    _check_choice(cfg, "model.dtype", DTYPES)
    _check_choice(cfg, "trainer.resume", RESUME_MODES)
    _require(
        re.fullmatch(r"cpu|cuda(:\d+)?", str(cfg.trainer.device)) is not None,
        "trainer.device",
        f"{cfg.trainer.device!r} is not a device; valid choices: cpu, cuda, cuda:N",
    )
    for key in ("total_steps", "prompts_per_step", "samples_per_prompt", "max_response_tokens", "mini_batch_size",
                "micro_batch_size", "ppo_epochs", "max_empty_steps", "max_context_tokens"):
        _require(int(cfg.trainer[key]) >= 1, f"trainer.{key}", f"must be >= 1, got {cfg.trainer[key]}")
    for key in ("val_every", "save_every", "dump_every", "val_size"):
        _require(int(cfg.trainer[key]) >= 0, f"trainer.{key}", f"must be >= 0, got {cfg.trainer[key]}")
    _require(cfg.trainer.temperature > 0 and cfg.trainer.val_temperature > 0, "trainer.temperature",
             "sampling temperatures must be > 0")
    try:
        filter_config = filter_config_from(cfg)
    except ValidationError as err:
        detail = err.errors()[0]
        where = ".".join(map(str, detail["loc"])) or "value"
        raise OrchError(f"config key filter.{where}: {detail['msg']}") from None
    _require(
        cfg.trainer.samples_per_prompt >= 2 or filter_config.strategy == "none",
        "trainer.samples_per_prompt",
        "filtering ranks prompts by their reward spread and needs >= 2 samples per prompt; use filter=none",
    )
    _validate_diagnostics(cfg)
    from envs.registry import build_config

    env = build_config(str(cfg.task.name), OmegaConf.to_container(cfg.task.env, resolve=True))  # OrchError naming the key
    # The torch backend's models are text-only. (The sweep validates cells of the planned verl backend as torch with
    # model.path=null, so a Hugging Face model without a path passes here.)
    _require(
        env.observation == "text" or (cfg.model.name == "hf" and (cfg.backend != "torch" or cfg.model.path is None)),
        "task.env.observation",
        "image observations need a vision-language model checkpoint (model=hf model.path=<Qwen2.5-VL folder>) on "
        "the verl backend (backend=verl); the torch backend and its tiny/small models are text-only: "
        "use task.env.observation=text",
    )
    _require(cfg.model.path is None or Path(str(cfg.model.path)).is_dir(), "model.path",
             f"{cfg.model.path!r} is not a local Hugging Face checkpoint folder")


def _validate_diagnostics(cfg: DictConfig) -> None:
    """The `diagnostics` section (read by the `collapse` step hook): one OrchError naming the bad key."""
    from recipes.collapse import SettingError
    from recipes.diagnostics import DiagnosticsConfig

    try:
        diagnostics = DiagnosticsConfig.from_section(OmegaConf.to_container(cfg.diagnostics, resolve=True))
    except SettingError as err:
        raise OrchError(f"config key diagnostics.{err.key}: {err.message}") from None
    _require(diagnostics.grad_every == 0 or cfg.trainer.samples_per_prompt >= 2, "diagnostics.grad_every",
             "the gradient split buckets prompts by their reward spread and needs trainer.samples_per_prompt >= 2")


def filter_config_from(cfg: DictConfig) -> Any:
    """The `recipes.filtering.FilterConfig` of a composed config (every `filter.*` key except `name`)."""
    from recipes.filtering import FilterConfig

    fields = {key: value for key, value in OmegaConf.to_container(cfg.filter, resolve=True).items() if key != "name"}
    return FilterConfig(**fields)


def flatten_config(cfg: DictConfig) -> dict[str, str]:
    """The resolved config as `{"dotted.key": "value"}` (MLflow params; lists and dicts as their repr)."""
    flat: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = str(node)

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat
