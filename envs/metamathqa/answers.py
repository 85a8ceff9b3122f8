"""Final-answer extraction and comparison for math QA: exact match after lowercasing and removing whitespace,
or equal numbers (2.0 = 2, 1,000 = 1000, 0.5 = 1/2 = \\frac{1}{2})."""

from __future__ import annotations

import re
from fractions import Fraction

ANSWER_MARKER = "the answer is"
MAX_NUMBER_LENGTH = 100  # characters; longer answers are compared as text only

_INTEGER = r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)"
_DECIMAL = re.compile(rf"({_INTEGER})(?:\.([0-9]+))?")
_FRACTION = re.compile(r"([-+]?[0-9]+)/([0-9]+)")
_LATEX_FRACTION = re.compile(r"\\d?frac\{([-+]?[0-9]+)\}\{([0-9]+)\}")


def split_response(response: str) -> tuple[str, str] | None:
    """Split a worked response at its last 'The answer is' (any case, optional colon) into (solution before the
    marker, answer up to the end of that line without a trailing period); None if there is no answer."""
    at = response.lower().rfind(ANSWER_MARKER)
    if at < 0:
        return None
    rest = response[at + len(ANSWER_MARKER) :].lstrip().removeprefix(":")
    answer = rest.strip().split("\n", 1)[0].strip().removesuffix(".").strip()
    return (response[:at].strip(), answer) if answer else None


def normalize(answer: str) -> str:
    """Lowercase and drop all whitespace."""
    return "".join(answer.lower().split())


def as_number(answer: str) -> Fraction | None:
    """The exact value of a normalized numeric answer (integer, decimal, a/b, \\frac{a}{b}), else None."""
    if len(answer) > MAX_NUMBER_LENGTH:
        return None
    for pattern in (_LATEX_FRACTION, _FRACTION):
        match = pattern.fullmatch(answer)
        if match:
            denominator = int(match.group(2))
            return Fraction(int(match.group(1)), denominator) if denominator else None
    match = _DECIMAL.fullmatch(answer)
    if match is None:
        return None
    whole, decimals = match.group(1).replace(",", ""), match.group(2) or ""
    return Fraction(whole + ("." + decimals if decimals else ""))


def answers_match(predicted: str, gold: str) -> bool:
    """True if the answers agree as normalized strings or as numbers."""
    left, right = normalize(predicted), normalize(gold)
    if left == right:
        return True
    left_value, right_value = as_number(left), as_number(right)
    return left_value is not None and left_value == right_value


def format_number(value: Fraction) -> str:
    """An exact value as text: integer, terminating decimal, or a/b."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    scaled = abs(value.numerator) * 10**digits // value.denominator
    text = str(scaled).rjust(digits + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{text[:-digits]}.{text[-digits:]}"
