"""A coding problem with its tests, how answers are extracted from a reply, and how outputs are compared."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MODES = ("call", "stdio")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class CodeProblem:
    """`mode` call: each test input is the argument list of `fn_name` (a function, or a method of a `Solution`
    class) and its output the expected return value (JSON values); stdio: each input is the program's stdin text
    and its output the expected stdout text."""

    prompt: str
    mode: str
    tests: tuple[tuple[Any, Any], ...]  # (input, expected output)
    fn_name: str | None = None
    starter_code: str = ""
    solution: str | None = None  # a reference solution (the demonstrations' answer), if known
    source: str = ""  # where it comes from: generated/<template>, or the data format of the file
    explanation: str = ""  # how the reference solution works (the demonstrations' reasoning)
    # True when the expected outputs were produced by running `solution` itself (the shipped set): that exact
    # code then passes by construction and is scored without running it (demonstrations cost nothing).
    solution_defines_outputs: bool = False

    def is_reference(self, code: str) -> bool:
        return self.solution_defines_outputs and self.solution is not None and code.strip() == self.solution.strip()


def extract_code(answer: str) -> str:
    """The code of an answer: the first ```python fenced block if there is one, else the whole text."""
    match = _FENCE.search(answer)
    return (match.group(1) if match else answer).strip("\n")


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _tokens_match(got: str, expected: str) -> bool:
    """Whitespace-separated tokens equal, numbers within 1e-6 (absolute or relative)."""
    left, right = got.split(), expected.split()
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        if a == b:
            continue
        try:
            if not math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6):
                return False
        except ValueError:
            return False
    return True


def _values_match(got: Any, expected: Any) -> bool:
    if isinstance(got, float) or isinstance(expected, float):
        return (isinstance(got, int | float) and isinstance(expected, int | float)
                and not isinstance(got, bool) and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6))
    if isinstance(got, list) and isinstance(expected, list):
        return len(got) == len(expected) and all(map(_values_match, got, expected))
    return got == expected and type(got) is type(expected)


def output_matches(mode: str, got: str | None, expected: Any) -> bool:
    """Whether a test's output is right. stdio: equal lines after trailing whitespace is dropped, else equal tokens
    (numbers within 1e-6). call: the returned JSON value equals the expected one (numbers within 1e-6; tuples are
    lists), or, as in APPS/TACO, equals the only element of an expected one-element list."""
    if got is None:
        return False
    if mode == "stdio":
        expected = str(expected)
        return _lines(got) == _lines(expected) or _tokens_match(got, expected)
    try:
        value = json.loads(got)
    except ValueError:
        return False
    return _values_match(value, expected) or (
        isinstance(expected, list) and len(expected) == 1 and _values_match(value, expected[0])
    )
