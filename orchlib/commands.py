"""Command values a user writes that become a process's argv (an interpreter, its options): validated as what they
must be before anything runs, so that no value can smuggle a second command into a job script or a sandbox."""

from __future__ import annotations

import re
import shlex

PROGRAM_NAME = re.compile(r"[A-Za-z0-9_.+-]+")  # a bare program name, looked up on PATH where it runs
ABSOLUTE_PATH = re.compile(r"/[A-Za-z0-9_.+/-]*")  # an absolute path, no shell metacharacters
PLAIN_WORD = re.compile(r"[A-Za-z0-9_.,:=+@%/-]+")  # an option or argument after the program


def command_words(value: str, what: str = "command") -> list[str]:
    """The words of `value` (split like a shell would): the first an absolute path or a bare program name, the rest
    plain words (options, arguments); ValueError naming the offending word otherwise. Shell metacharacters (`;`,
    `&`, `|`, `$`, backquotes, redirections, globs, quotes inside a word) are refused, not quoted away."""
    try:
        words = shlex.split(value)
    except ValueError as err:
        raise ValueError(f"cannot split {value!r} into words ({err})") from None
    if not words:
        raise ValueError(f"empty {what}")
    program, *rest = words
    if not (ABSOLUTE_PATH.fullmatch(program) or PROGRAM_NAME.fullmatch(program)):
        raise ValueError(f"{program!r} is not an absolute path or a program name (a {what} such as "
                         f"/opt/conda/bin/python or python3; no shell syntax)")
    for word in rest:
        if not PLAIN_WORD.fullmatch(word):
            raise ValueError(f"{word!r} in {value!r} is not a plain word (letters, digits and -_.,:=+@%/; no "
                             f"shell syntax)")
    return words
