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


# --- real records (Countdown-Tasks-3to4's shape; the files below are written here, not the data set itself) -----


def write_countdown(path, records) -> str:
    """`records` as `path` (.jsonl, .json or .parquet), in the data set's columns."""
    import json

    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(records), path)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    else:
        path.write_text(json.dumps(records))
    return str(path)


RECORDS = [
    {"target": 10, "nums": [3, 5, 2]},       # 3 + 5 + 2
    {"target": 24, "nums": [4, 6, 1]},       # 4 * 6 * 1: no signed sum reaches it (RAGEN drops it)
    {"target": 7, "nums": [9, 4, 2]},        # 9 - 4 + 2
    {"target": 5, "nums": []},               # no numbers
    {"target": 1, "nums": [8, 3, 6, 2]},     # 8 - 3 - 6 + 2
    {"target": 50, "nums": [60, 9, 1]},      # 60 - 9 - 1
]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_records_are_selected_as_ragen_selects_them(tmp_path, suffix):
    """RAGEN's selection (ragen/env/countdown/env.py:46-50): the first max_instances records, then those a signed
    sum of the numbers reaches (has_solution, env.py:24-33); malformed records are skipped."""
    from envs.countdown.dataset import load_puzzles, signed_sum_reaches

    path = write_countdown(tmp_path / f"countdown{suffix}", RECORDS)
    assert [(p.numbers, p.target) for p in load_puzzles(path, 20_000)] == [
        ((3, 5, 2), 10), ((9, 4, 2), 7), ((8, 3, 6, 2), 1), ((60, 9, 1), 50)]
    assert [p.target for p in load_puzzles(path, 3)] == [10, 7]  # records 0-2 read, the 4x6x1 one dropped
    assert signed_sum_reaches((8, 3, 6, 2), 1) and not signed_sum_reaches((4, 6, 1), 24)


def test_an_episode_plays_a_loaded_record_and_evaluation_seeds_play_the_held_out_ones(tmp_path):
    from envs.split import EVAL_SEED_BASE, is_held_out

    records = [{"target": 10 + i, "nums": [10 + i - 3, 1, 2]} for i in range(30)]  # (10 + i - 3) + 1 + 2
    path = write_countdown(tmp_path / "countdown.jsonl", records)
    env = make_env("countdown", data_path=path)
    targets = {i + 10: i for i in range(30)}
    played = {"train": set(), "eval": set()}
    for seed in range(40):
        for split, base in (("train", 0), ("eval", EVAL_SEED_BASE)):
            env.reset(seed=base + seed)
            played[split].add(targets[env.puzzle.target])
    assert played["eval"] == {0, 10, 20} and all(is_held_out(i, 30) for i in played["eval"])
    assert played["train"] == set(range(30)) - {0, 10, 20}
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step(f"{env.puzzle.numbers[0]} + 1 + 2")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert solve(env.puzzle) is not None


def test_a_bad_countdown_file_is_one_line(tmp_path):
    from envs.countdown.dataset import load_puzzles
    from orchlib.errors import OrchError

    with pytest.raises(OrchError, match="no such file"):
        load_puzzles(str(tmp_path / "missing.parquet"), 10)
    with pytest.raises(OrchError, match="unknown data file suffix '.csv'"):
        load_puzzles(str(tmp_path / "c.csv"), 10)
    bad = write_countdown(tmp_path / "none.json", [{"target": 24, "nums": [4, 6, 1]}, {"target": "x", "nums": [1]},
                                                   {"target": 3, "nums": [True, 2]}, ["not a record"]])
    with pytest.raises(OrchError, match="no record among the first 10"):
        load_puzzles(bad, 10)
