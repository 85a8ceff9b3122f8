"""Countdown puzzles: solvable instance generation, an exhaustive solver, and the answer verifier."""

from __future__ import annotations

import operator
import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations

from envs.countdown.expression import ExpressionError, evaluate, numbers_used, parse_expression
from orchlib.errors import OrchError

CORRECT_REWARD = 1.0
WRONG_VALUE_REWARD = 0.1
WRONG_NUMBERS_REWARD = 0.0
MAX_ATTEMPTS = 10_000

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}

# A partial result of the solver: (value, expression text, arithmetic steps so far).
Partial = tuple[Fraction, str, tuple[str, ...]]


@dataclass(frozen=True)
class Puzzle:
    numbers: tuple[int, ...]
    target: int


@dataclass(frozen=True)
class Solution:
    """An expression reaching the target, and its steps as 'a op b = c' lines in evaluation order."""

    expression: str
    steps: tuple[str, ...]


def _fmt(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _operand(value: Fraction) -> str:
    """A value inside a step: fractions and negatives in parentheses, so the step reads unambiguously."""
    return _fmt(value) if value.denominator == 1 and value >= 0 else f"({_fmt(value)})"


def generate_puzzle(
    rng: random.Random,
    count_range: tuple[int, int],
    number_range: tuple[int, int],
    target_range: tuple[int, int],
) -> Puzzle:
    """Draw numbers, combine them all in a random order with random operations (every intermediate a positive
    integer), and keep the result as the target if it lies in `target_range`. Solvable by construction."""
    for _ in range(MAX_ATTEMPTS):
        numbers = [rng.randint(*number_range) for _ in range(rng.randint(*count_range))]
        pool = list(numbers)
        while len(pool) > 1:
            a, b = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
            options = [a + b, a * b]
            if a > b:
                options.append(a - b)
            if b and a % b == 0:
                options.append(a // b)
            pool.append(rng.choice(options))
        if target_range[0] <= pool[0] <= target_range[1]:
            return Puzzle(tuple(numbers), pool[0])
    raise OrchError(f"countdown: no target in {target_range} after {MAX_ATTEMPTS} draws; widen target range")


def solve(puzzle: Puzzle) -> Solution | None:
    """An expression that uses every number exactly once and equals the target, or None if none exists.
    Solutions whose intermediate results are all non-negative integers are preferred."""
    items = [(Fraction(n), str(n), ()) for n in puzzle.numbers]
    target = Fraction(puzzle.target)
    return _search(items, target, whole=True) or _search(items, target, whole=False)


def _search(items: list[Partial], target: Fraction, whole: bool) -> Solution | None:
    """Depth-first search over pairwise combinations; `whole` keeps only non-negative integer intermediates."""
    if len(items) == 1:
        value, expression, steps = items[0]
        return Solution(expression, steps) if value == target else None
    for i, j in combinations(range(len(items)), 2):
        rest = [item for k, item in enumerate(items) if k not in (i, j)]
        for value, expression, steps in _combine(items[i], items[j]):
            if whole and (value < 0 or value.denominator != 1):
                continue
            found = _search([*rest, (value, expression, steps)], target, whole)
            if found is not None:
                return found
    return None


def _wrap(expression: str) -> str:
    return expression if expression.isdigit() else f"({expression})"


def _combine(x: Partial, y: Partial) -> list[Partial]:
    """Every way of joining two partial results with one operation (both orders for - and /)."""
    joined = []
    for (a, ea, sa), (b, eb, sb), swapped in ((x, y, False), (y, x, True)):
        for op, apply in _OPS.items():
            if (swapped and op in "+*") or (op == "/" and b == 0):
                continue
            value = apply(a, b)
            step = f"{_operand(a)} {op} {_operand(b)} = {_fmt(value)}"
            joined.append((value, f"{_wrap(ea)} {op} {_wrap(eb)}", (*sa, *sb, step)))
    return joined


def score_answer(answer: str, puzzle: Puzzle) -> tuple[float, str]:
    """Reward and verdict of an answer: 'invalid' (not in the grammar, reward 0), 'wrong_numbers' (0),
    'wrong_value' (0.1, also for division by zero), 'correct' (1)."""
    try:
        tree = parse_expression(answer)
    except ExpressionError:
        return WRONG_NUMBERS_REWARD, "invalid"
    if Counter(numbers_used(tree)) != Counter(puzzle.numbers):
        return WRONG_NUMBERS_REWARD, "wrong_numbers"
    if evaluate(tree) != puzzle.target:
        return WRONG_VALUE_REWARD, "wrong_value"
    return CORRECT_REWARD, "correct"
