"""The one exception type that user-facing code raises for bad input.

Its message is a single line naming the file, the key and the valid choices; the CLI prints it and exits 2.
"""

from __future__ import annotations


class OrchError(Exception):
    """Bad input or a failed precondition, with a message meant for the user."""


def choices_error(what: str, got: object, valid: list[str] | tuple[str, ...], where: str = "") -> OrchError:
    """Build the standard 'unknown X' error: ``[where: ]unknown what 'got'; valid choices: a, b, c``."""
    prefix = f"{where}: " if where else ""
    return OrchError(f"{prefix}unknown {what} {got!r}; valid choices: {', '.join(sorted(map(str, valid)))}")


def validation_error_line(err: Exception, where: str = "") -> OrchError:
    """Turn a pydantic ``ValidationError`` into one line: ``where: key.path: message; key2: message2``."""
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return OrchError(f"{where}: {err}" if where else str(err))
    parts = []
    for item in errors():
        location = ".".join(str(part) for part in item.get("loc", ())) or "(root)"
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{location}: {message}")
    prefix = f"{where}: " if where else ""
    return OrchError(prefix + "; ".join(parts))
