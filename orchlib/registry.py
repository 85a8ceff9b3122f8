"""One registry helper for every open set of orch (environments, algorithms, filter strategies, trainer backends,
step hooks, executors): entries are registered by name with a decorator, the way veRL registers its advantage
estimators, or named as `"module:attribute"` strings imported on first lookup, so that listing names or validating
a config stays light.

    BACKENDS = Registry("trainer backend", where="config key backend",
                        lazy={"torch": "recipes.torch_trainer.backend:run"})
    BACKENDS.get("torch")     # imports recipes.torch_trainer.backend and registers its `run` on first use;
                              # OrchError listing the names otherwise

A lazy entry names its attribute, so the module that defines it need not import the registry: the edge from a
registry to its entries goes one way, and tests/test_layers.py reads these strings as imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from orchlib.errors import OrchError, choices_error

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry.

    Args:
        kind: what an entry is, for errors ("environment", "trainer backend").
        where: the key or option that names an entry, for errors ("config key backend").
        lazy: name -> `"module:attribute"`, the entry, imported and registered on first lookup (listed by
            `names()` before).
        modules: modules that register entries, all imported on the first lookup (built-in sets).
        name_attr: when set, the decorator also stores the registered name on the entry under this attribute.
    """

    def __init__(self, kind: str, where: str = "", lazy: Mapping[str, str] | None = None,
                 modules: Iterable[str] = (), name_attr: str | None = None) -> None:
        self.kind = kind
        self.where = where
        self.lazy = dict(lazy or {})
        self.modules = tuple(modules)
        self.name_attr = name_attr
        self.entries: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under each of `names` (one object may have several names).
        Registering another object under a taken name is an error."""

        def decorate(entry: T) -> T:
            for name in names:
                taken = self.entries.get(name)
                if taken is not None and taken is not entry:
                    label = getattr(taken, "__qualname__", repr(taken))
                    raise OrchError(f"{self.kind} {name!r} is already registered by {label}")
                self.entries[name] = entry
            if self.name_attr:
                setattr(entry, self.name_attr, names[0])
            return entry

        return decorate

    def names(self) -> list[str]:
        """Every name that can be looked up (registered, or registered by a lazy module), sorted."""
        self._load_modules()
        return sorted(set(self.entries) | set(self.lazy))

    def get(self, name: str) -> T:
        """The entry registered as `name`, importing its module first if needed. `OrchError` listing the valid
        names otherwise."""
        if name not in self.entries:
            self._load_modules()
            if name in self.lazy:
                module, attribute = self.lazy[name].split(":")
                self.register(name)(getattr(importlib.import_module(module), attribute))
        if name not in self.entries:
            raise choices_error(self.kind, name, self.names() or ["(none registered)"], where=self.where)
        return self.entries[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def _load_modules(self) -> None:
        for module in self.modules:
            importlib.import_module(module)

