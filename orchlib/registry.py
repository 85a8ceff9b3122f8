"""One registry helper for every open set of orch (environments, algorithms, filter strategies, trainer backends,
step hooks, executors): entries are registered by name with a decorator, the way veRL registers its advantage
estimators, and modules that register entries can be imported lazily on first lookup, so that listing names or
validating a config stays light.

    BACKENDS = Registry("trainer backend", where="config key backend", lazy={"torch": "recipes.torch_trainer.backend"})

    @BACKENDS.register("torch")
    def run(cfg, should_stop=None): ...

    BACKENDS.get("torch")     # imports recipes.torch_trainer.backend on first use; OrchError listing the names otherwise
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
        lazy: name -> `"module:attribute"`, the entry, imported on first lookup (listed by `names()` before), or
            name -> `"module"` that registers the name itself when imported.
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
                module, _, attribute = self.lazy[name].partition(":")
                loaded = importlib.import_module(module)
                if attribute and name not in self.entries:
                    self.register(name)(getattr(loaded, attribute))
        if name not in self.entries:
            raise choices_error(self.kind, name, self.names() or ["(none registered)"], where=self.where)
        return self.entries[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def _load_modules(self) -> None:
        for module in self.modules:
            importlib.import_module(module)

