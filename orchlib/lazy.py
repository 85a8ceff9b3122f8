"""A module imported on first use: `np = lazy_module("numpy")` binds a name now and imports numpy the first time an
attribute is read. For modules that the light CLI paths import for their declarations only (e.g. `orch filter
--help` builds its options from `recipes.stats.filtering.FilterConfig`, whose selection code needs numpy)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _LazyModule:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)


def lazy_module(name: str) -> Any:
    """A stand-in for module `name` that imports it when one of its attributes is first read."""
    return _LazyModule(name)
