"""The exception type for bad input, and the one place where errors become one line for the user.

Every layer raises `OrchError` (or a plain `ValueError` from pure functions) with a single-line message naming
the file, the key and the valid choices. Only the CLI and the job turn an error into exit code 2 and one line.
Pydantic errors are turned into that line by `validation_issues` / `validation_error`, nowhere else.
"""

from __future__ import annotations

import errno
import typing
from dataclasses import dataclass
from typing import Any


class OrchError(Exception):
    """Bad input or a failed precondition, with a one-line message meant for the user."""


ERROR_PREFIX = "orch: error: "


def error_line(message: object) -> str:
    """The one line a CLI prints for bad input or a fault, before exiting with code 2: ``orch: error: <message>``."""
    return f"{ERROR_PREFIX}{message}"


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # what a full disk or an exhausted quota raise


def fault_line(err: BaseException) -> str | None:
    """One line for a fault of the machine that the user can act on, or None for anything else. A full disk:
    ``disk full: No space left on device while writing ...: /path`` (`orch train` and the job print it instead of
    a traceback; the cell's reason in `orch status` is this line), also when a database (orch's store, MLflow's)
    found its disk full, wherever in the exception's chain (SQLAlchemy wraps SQLite's error)."""
    import sqlite3

    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            where = f": {exc.filename}" if exc.filename else ""
            return f"disk full: {exc.strerror or 'No space left on device'}{where}; free some space, then resume"
        if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
            return f"disk full: a database could not be written ({exc}); free some space, then resume"
        todo += [exc.__cause__, exc.__context__, getattr(exc, "orig", None)]
    return None


def choices_error(what: str, got: object, valid: list[str] | tuple[str, ...], where: str = "",
                  typed: object = None) -> OrchError:
    """The standard 'unknown X' error: ``[where: ]unknown what 'got'; valid choices: a, b, c``, followed by
    ``; did you mean 'b'?`` when one valid choice is close to what was typed (`typed`, default `got`; a typo:
    `total_step` -> `total_steps`)."""
    prefix = f"{where}: " if where else ""
    names = sorted(map(str, valid))
    return OrchError(f"{prefix}unknown {what} {got!r}; valid choices: {', '.join(names)}"
                     f"{did_you_mean(str(got if typed is None else typed), names)}")


def did_you_mean(typed: str, valid: typing.Iterable[str]) -> str:
    """``; did you mean 'b'?`` naming the one valid choice closest to `typed` when one is close (difflib's ratio at
    least `CLOSE_MATCH_CUTOFF`), else ''. The one suggestion orch makes, for a key, a choice, a command or an option."""
    import difflib

    near = difflib.get_close_matches(typed, sorted(map(str, valid)), n=1, cutoff=CLOSE_MATCH_CUTOFF)
    return f"; did you mean {near[0]!r}?" if near else ""


CLOSE_MATCH_CUTOFF = 0.7  # difflib's similarity ratio above which a valid choice is offered as the one meant


def hide_password(url: str) -> str:
    """`url` with the password of `scheme://user:password@host` replaced by `***` (URLs in messages)."""
    import re

    return re.sub(r"(//[^/:@]*:)[^/@]*@", r"\1***@", url)


def missing_driver(where: str, url: str, module: str | None) -> OrchError:
    """A database URL whose driver is not installed: name it and how to install it (PostgreSQL: orch's extra)."""
    install = "pip install 'orch[postgres]'" if str(module).startswith("psycopg") else f"pip install {module}"
    if url.startswith("postgres") and not str(module).startswith("psycopg"):
        install += " (or use postgresql+psycopg://... after pip install 'orch[postgres]')"
    return OrchError(f"{where}: the database driver {module!r} is not installed; install it with: {install}")


@dataclass(frozen=True)
class Issue:
    """One problem of a pydantic validation: where (`loc`, as pydantic gives it) and what (one line)."""

    loc: tuple[Any, ...]
    message: str

    def key(self, prefix: str = "") -> str:
        """The location as a dotted key (`filter.value`, `seeds[0]`), after `prefix`; '' for the whole value."""
        text = prefix
        for part in self.loc:
            text += f"[{part}]" if isinstance(part, int) else f"{'.' if text else ''}{part}"
        return text

    def line(self, prefix: str = "") -> str:
        """``key: message``, or the message alone when it is about the whole value."""
        key = self.key(prefix)
        return f"{key}: {self.message}" if key else self.message


def validation_issues(err: Any, model: Any = None) -> list[Issue]:
    """The problems of a pydantic `ValidationError`, each as one line: an unknown key lists the valid keys (when
    `model`, the validated pydantic class, is given), a missing key says so, any other problem gives pydantic's
    message and the value it got."""
    issues = []
    for item in err.errors():
        loc = tuple(item.get("loc", ()))
        kind = item.get("type", "")
        if kind == "extra_forbidden" and loc:
            parent = _model_at(model, loc[:-1]) if model is not None else None
            valid = sorted(parent.model_fields) if parent is not None else []
            message = str(choices_error("key", loc[-1], valid)) if valid else f"unknown key {loc[-1]!r}"
        elif kind == "missing":
            message = "required key missing"
        else:
            message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
            got = item.get("input")
            if "input" in item and not isinstance(got, dict | list) and repr(got) not in message:
                message += f" (got {got!r})"
        issues.append(Issue(loc, message))
    return issues


def validation_error(err: Any, where: str = "", key_prefix: str = "", model: Any = None) -> OrchError:
    """A pydantic `ValidationError` as one `OrchError` line: ``where: key: message; key2: message2``."""
    parts = [issue.line(key_prefix) for issue in validation_issues(err, model)]
    return OrchError((f"{where}: " if where else "") + "; ".join(parts))


def _model_at(model: Any, loc: tuple[Any, ...]) -> Any:
    """The pydantic model class found at `loc` inside `model` (through lists, dicts and optionals), or None."""
    current: Any = model
    parts = list(loc)
    while True:
        if _is_model(current):
            if not parts:
                return current
            name = parts.pop(0)
            if name not in current.model_fields:
                return None
            current = current.model_fields[name].annotation
            continue
        args = [arg for arg in typing.get_args(current) if arg is not type(None)]
        if not args:
            return None
        if typing.get_origin(current) in (list, dict) and parts:
            parts.pop(0)
            current = args[-1]
        else:
            current = args[0]


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and hasattr(value, "model_fields")

