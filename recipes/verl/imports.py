"""Run a callback right after a named module has been imported (or now, if it already is).

The plug-in is imported from inside `import verl`, where importing veRL's worker/engine modules eagerly would cost
~2-3 s per Ray process and risk circular imports. A tiny meta-path finder wraps the loader of the watched modules.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections import defaultdict
from collections.abc import Callable

_HOOKS: dict[str, list[Callable]] = defaultdict(list)
_LOCK = threading.Lock()


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader, fullname: str):
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        with _LOCK:
            callbacks = _HOOKS.pop(self._fullname, [])
        for fn in callbacks:
            fn(module)

    def __getattr__(self, name):  # get_source, get_code, is_package, ... for inspect/pickle
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _HookedLoader):
                    spec.loader = _HookedLoader(spec.loader, fullname)
                return spec
        return None


_FINDER = _PostImportFinder()


def after_import(module_name: str, fn: Callable) -> None:
    """Call `fn(module)` once `module_name` is imported (immediately if it already is)."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        fn(module)
        return
    with _LOCK:
        _HOOKS[module_name].append(fn)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
