"""Countdown: the expression grammar (accepts and rejects), exact evaluation, rewards, generation and solver."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import make_env
from envs.countdown.expression import ExpressionError, evaluate, numbers_used, parse_expression
from envs.countdown.puzzle import Puzzle, generate_puzzle, score_answer, solve


@pytest.mark.parametrize(
    ("text", "value", "numbers"),
    [
        ("1 + 2 * 3", Fraction(7), [1, 2, 3]),
        ("(1 + 2) * 3", Fraction(9), [1, 2, 3]),
        ("8 / 3 / 2", Fraction(4, 3), [8, 3, 2]),  # left-associative
        ("10 - 4 - 3", Fraction(3), [10, 4, 3]),
        ("((7))", Fraction(7), [7]),
        ("\t6*7 ", Fraction(42), [6, 7]),
        ("5 - 9", Fraction(-4), [5, 9]),
    ],
)
def test_grammar_accepts_and_evaluates_exactly(text, value, numbers):
    tree = parse_expression(text)
    assert evaluate(tree) == value
    assert numbers_used(tree) == numbers


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "-3 + 5",  # unary minus
        "3 + -5",
        "2 ** 3",
        "2 ^ 3",
        "3.5 + 1",
        "(1 + 2",
        "1 + 2)",
        "1 2",
        "1 +",
        "()",
        "3 = 3",
        "(1 + 2) * 3 = 9",
        "x + 1",
        "abs(3)",
        "__import__('os')",
        "3 × 4",
        "3 ÷ 4",
        "١ + ٢",  # Arabic-Indic digits
        "1\n+ 2",
        "1234567 + 1",  # more than six digits
        "(" * 30 + "1" + ")" * 30,  # nested too deep
        "1+" * 150 + "1",  # too long
    ],
)
def test_grammar_rejects_everything_else(text):
    with pytest.raises(ExpressionError):
        parse_expression(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_parser_raises_only_expression_errors(text):
    try:
        tree = parse_expression(text)
    except ExpressionError:
        return
    evaluate(tree)  # anything accepted can be evaluated


def test_division_by_zero_has_no_value():
    assert evaluate(parse_expression("3 / (2 - 2)")) is None


PUZZLE = Puzzle(numbers=(3, 5, 3), target=24)


@pytest.mark.parametrize(
    ("answer", "reward", "verdict"),
    [
        ("(3 + 5) * 3", 1.0, "correct"),
        ("3 * (5 + 3)", 1.0, "correct"),
        ("3 + 5 + 3", 0.1, "wrong_value"),
        ("3 / (5 - 5) + 3", 0.0, "wrong_numbers"),
        ("(3 + 5) * 3 * 1", 0.0, "wrong_numbers"),  # extra number
        ("(3 + 5) * 5", 0.0, "wrong_numbers"),  # 5 twice, 3 once
        ("3 * 8", 0.0, "wrong_numbers"),
        ("3 / (3 - 3) * 5", 0.0, "wrong_numbers"),
        ("3 / (5 - 5)", 0.0, "wrong_numbers"),
        ("5 / (3 - 3)", 0.1, "wrong_value"),  # uses 5, 3, 3 exactly; no value
        ("24", 0.0, "wrong_numbers"),
        ("(3 + 5) × 3", 0.0, "invalid"),
    ],
)
def test_score_answer(answer, reward, verdict):
    assert score_answer(answer, PUZZLE) == (reward, verdict)


def test_env_rewards_and_format_penalty_through_step():
    env = make_env("countdown")
    env.reset(seed=5)
    solution = solve(env.puzzle)
    obs, reward, terminated, truncated, info = env.step(solution.expression)
    assert (reward, terminated, info["success"], info["action_valid"]) == (1.0, True, True, True)
    env.reset(seed=5)
    _, reward, terminated, _, info = env.step("1 + abc")
    assert (reward, terminated, info["action_valid"]) == (0.0, True, False)


def test_generated_puzzles_are_solvable_deterministic_and_in_range():
    counts = set()
    for seed in range(150):
        puzzle = generate_puzzle(random.Random(seed), (3, 4), (1, 99), (1, 100))
        assert puzzle == generate_puzzle(random.Random(seed), (3, 4), (1, 99), (1, 100))
        assert 3 <= len(puzzle.numbers) <= 4 and all(1 <= n <= 99 for n in puzzle.numbers)
        assert 1 <= puzzle.target <= 100
        solution = solve(puzzle)
        assert solution is not None
        assert score_answer(solution.expression, puzzle) == (1.0, "correct")
        counts.add(len(puzzle.numbers))
    assert counts == {3, 4}


def test_solver_steps_are_correct_arithmetic():
    solution = solve(Puzzle((2, 3, 7), 23))
    assert solution is not None
    for step in solution.steps:
        left, result = step.split(" = ")
        assert evaluate(parse_expression(left)) == Fraction(result)
    assert solution.steps[-1].endswith("= 23")


def test_solver_prefers_whole_intermediates_but_finds_fractional_ones():
    assert solve(Puzzle((1, 1), 5)) is None
    assert solve(Puzzle((4, 5), 20)).expression in ("4 * 5", "5 * 4")
    only_fractional = Puzzle((3, 3, 8, 8), 24)  # 8 / (3 - 8 / 3) is the only way
    solution = solve(only_fractional)
    assert solution is not None and score_answer(solution.expression, only_fractional)[0] == 1.0
    assert any("/" in step.split(" = ")[1] for step in solution.steps)
    for step in solution.steps:  # fractional operands are parenthesised, so each step reads correctly
        left, result = step.split(" = ")
        assert evaluate(parse_expression(left)) == Fraction(result)
