"""The registry of environments by name, and validated construction from a config dict."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from envs.base import Env, EnvConfig
from orchlib.errors import choices_error, validation_error
from orchlib.registry import Registry

# Modules whose import registers the built-in tasks (imported on first lookup, so that `import envs` stays light).
BUILTIN_MODULES = (
    "envs.sokoban", "envs.frozenlake", "envs.countdown", "envs.metamathqa", "envs.searchqa", "envs.webshop",
    "envs.deepcoder",
)

ENVS: Registry[type[Env]] = Registry("environment", modules=BUILTIN_MODULES, name_attr="name")
register_env = ENVS.register  # class decorator: `@register_env("sokoban")` (the name becomes `cls.name`)


def list_envs() -> list[str]:
    """Names of all registered environments, sorted."""
    return ENVS.names()


def env_class(name: str) -> type[Env]:
    """The `Env` subclass registered under `name`; OrchError listing the valid names otherwise."""
    return ENVS.get(name)


def env_config_class(name: str) -> type[EnvConfig]:
    """The pydantic config model of environment `name` (unknown keys are rejected by `build_config`)."""
    return env_class(name).config_class


def build_config(name: str, values: dict[str, Any]) -> EnvConfig:
    """Validate `values` against `name`'s config; one-line OrchError naming the bad key otherwise."""
    config_class = env_config_class(name)
    fields = list(config_class.model_fields)
    for key in values:
        if key not in config_class.model_fields:
            raise choices_error("config key", key, fields, where=f"env {name}")
    try:
        return config_class(**values)
    except ValidationError as err:
        raise validation_error(err, f"env {name}", model=config_class) from None


def make_env(name: str, **config: Any) -> Env:
    """Build environment `name` with config overrides, e.g. `make_env("sokoban", size=8, num_boxes=2)`."""
    return env_class(name)(build_config(name, config))
