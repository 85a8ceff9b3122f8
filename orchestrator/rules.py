"""Match rules: `{key: value}` or `{key: [any, of, these]}`, all keys required to match.

Used by include/exclude rules and by resource rules of a sweep file. A rule is checked against a *lookup*, a
function from a key to the cell's value for it (`MISSING` when the cell has no such key).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

MISSING = object()

Lookup = Callable[[str], Any]


def matches(rule: Mapping[str, Any], lookup: Lookup) -> bool:
    """True when every key of `rule` matches: equal to the value, or to one item of a list value."""
    for key, wanted in rule.items():
        value = lookup(key)
        if value is MISSING:
            return False
        options = wanted if isinstance(wanted, list) else [wanted]
        if not any(_same(value, option) for option in options):
            return False
    return True


def _same(value: Any, option: Any) -> bool:
    """Equality that keeps `True` apart from `1` (YAML gives both) but lets `1` equal `1.0`."""
    if isinstance(value, bool) or isinstance(option, bool):
        return type(value) is type(option) and value == option
    return value == option
