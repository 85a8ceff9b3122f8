"""Checks for the fields of orch's pydantic configs, each failing with one readable line (the config's error then
names the key: ``config key diagnostics.mi_every: must be an integer >= 0 (...), got -1``).

    mi_every: Annotated[int, integer(0, "steps between MI computations; 0 disables")] = 5

Values are checked as written (no silent coercion: `true` is not an integer, `2.5` is not a count), before
pydantic's own type check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BeforeValidator

from orchlib.errors import choices_error


def integer(minimum: int, meaning: str = "") -> BeforeValidator:
    """An integer >= `minimum` (`meaning` says what it counts)."""

    def check(value: Any) -> Any:
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if meaning and (not is_int or value < minimum):
            raise ValueError(f"must be an integer >= {minimum} ({meaning}), got {value!r}")
        if not is_int:
            raise ValueError(f"must be an integer >= {minimum}, got {value!r}")
        if value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value!r}")
        return value

    return BeforeValidator(check)


def number(valid: Callable[[float], bool], expected: str) -> BeforeValidator:
    """A number for which `valid` holds (`expected` describes the range, e.g. "in (0, 1)")."""

    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not valid(value):
            raise ValueError(f"must be a number {expected}, got {value!r}")
        return value

    return BeforeValidator(check)


def boolean() -> BeforeValidator:
    """`true` or `false` exactly (not 1, "yes" or "maybe")."""

    def check(value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value

    return BeforeValidator(check)


def one_of(valid: Iterable[str] | Callable[[], Iterable[str]], what: str = "value") -> BeforeValidator:
    """One of `valid` (or of what the callable returns when checked: an open registry's names)."""

    def check(value: Any) -> Any:
        choices = list(valid() if callable(valid) else valid)
        if value not in choices:
            raise ValueError(str(choices_error(what, value, choices)))
        return value

    return BeforeValidator(check)
