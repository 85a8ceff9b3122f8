"""The registry of environments by name, and validated construction from a config dict."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from envs.base import Env, EnvConfig
from orchestrator.errors import OrchError, choices_error

# Modules whose import registers the built-in tasks (imported on first lookup, so that `import envs` stays light).
BUILTIN_MODULES = ("envs.sokoban", "envs.frozenlake", "envs.countdown", "envs.metamathqa")

_REGISTRY: dict[str, type[Env]] = {}


def register_env(name: str) -> Callable[[type[Env]], type[Env]]:
    """Class decorator: register an `Env` subclass under `name` (which also becomes its `name` attribute)."""

    def decorate(cls: type[Env]) -> type[Env]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise OrchError(f"environment {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def _load_builtins() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def list_envs() -> list[str]:
    """Names of all registered environments, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def env_class(name: str) -> type[Env]:
    """The `Env` subclass registered under `name`; OrchError listing the valid names otherwise."""
    _load_builtins()
    if name not in _REGISTRY:
        raise choices_error("environment", name, list(_REGISTRY))
    return _REGISTRY[name]


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
        first = err.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "config"
        raise OrchError(f"env {name}: {key}={first.get('input')!r}: {first['msg']}") from None


def make_env(name: str, **config: Any) -> Env:
    """Build environment `name` with config overrides, e.g. `make_env("sokoban", size=8, num_boxes=2)`."""
    return env_class(name)(build_config(name, config))
