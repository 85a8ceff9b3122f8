"""The step hooks by name (`hooks: [...]` in the config): the registry the config validates against and the
trainers build their hooks from. A built-in hook is named here as `"module:Class"`, imported on first use, so that
the trainer need not import every hook and no hook module imports this one; `@register_hook("name")` adds one
from outside (tests, a lab's own hook)."""

from __future__ import annotations

from typing import Any

from orchlib.registry import Registry
from recipes.diagnostics.hooks import StepHook

HOOKS: Registry[type[StepHook]] = Registry("step hook", where="config key hooks",
                                           lazy={"collapse": "recipes.diagnostics.collapse_hook:CollapseHook"})
register_hook = HOOKS.register  # class decorator: `@register_hook("name")`


def build_hooks(names: list[str], cfg: Any) -> dict[str, StepHook]:
    """One instance per enabled name, in order; OrchError for unknown names."""
    return {name: HOOKS.get(name)(cfg) for name in names}
