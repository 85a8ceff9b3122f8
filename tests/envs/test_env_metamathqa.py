"""MetaMathQA: answer extraction and matching, the data loader (JSON, JSONL, Parquet), the offline generator,
and the retry reward 1/2^attempt."""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction

import pytest

from envs import make_env
from envs.metamathqa.answers import answers_match, as_number, format_number, split_response
from envs.metamathqa.dataset import load_problems
from envs.metamathqa.wordproblems import SMALL_MAX, TEMPLATES, generate_problem
from orchlib.errors import OrchError

RECORDS = [
    {"query": "What is 2 + 3?", "response": "2 + 3 = 5.\nThe answer is: 5", "type": "GSM_Rephrased"},
    {"query": "Simplify 6/8.", "response": "Divide by 2.\nThe answer is: \\frac{3}{4}"},
    {"query": "Name the shape with 3 sides.", "response": "It has three sides. The answer is: Triangle."},
    {"query": "No final answer here.", "response": "I think it is 4."},
    {"query": 7, "response": "The answer is: 7"},
]


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("So x = 3.\nThe answer is: 3", ("So x = 3.", "3")),
        ("the answer is 12.", ("", "12")),
        ("The answer is: 1 The answer is: 2\n(check)", ("The answer is: 1", "2")),
        ("The answer is:   \n", None),
        ("no marker", None),
    ],
)
def test_split_response(response, expected):
    assert split_response(response) == expected


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ("2.0", "2"),
        ("2", "2.000"),
        ("1,000", "1000"),
        ("0.5", "1/2"),
        ("\\frac{1}{2}", "0.5"),
        ("-3", "-3.0"),
        (" Triangle ", "triangle"),
        ("x + 1", "X+1"),
        ("+7", "7"),
    ],
)
def test_equivalent_answers_match(predicted, gold):
    assert answers_match(predicted, gold)


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ("3", "2"),
        ("2.01", "2"),
        ("1/3", "0.33"),
        ("1,00", "100"),
        ("square", "triangle"),
        ("1/0", "0"),
        ("", "0"),
    ],
)
def test_different_answers_do_not_match(predicted, gold):
    assert not answers_match(predicted, gold)


def test_huge_numbers_are_compared_as_text_without_error():
    assert not answers_match("9" * 5000, "1")
    assert as_number("9" * 5000) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction(7), "7"),
        (Fraction(5, 2), "2.5"),
        (Fraction(-1, 8), "-0.125"),
        (Fraction(1, 3), "1/3"),
        (Fraction(3, 100), "0.03"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


def write_sample(tmp_path, suffix):
    path = tmp_path / f"sample{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(RECORDS))
    elif suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(record) for record in RECORDS) + "\n")
    else:
        import pandas as pd

        frame = pd.DataFrame([r for r in RECORDS if isinstance(r["query"], str)])
        frame.to_parquet(path)
    return str(path)


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet"])
def test_loader_keeps_records_with_an_extractable_answer(tmp_path, suffix):
    problems = load_problems(write_sample(tmp_path, suffix))
    assert [p.question for p in problems] == [
        "What is 2 + 3?",
        "Simplify 6/8.",
        "Name the shape with 3 sides.",
    ]
    assert [p.answer for p in problems] == ["5", "\\frac{3}{4}", "Triangle"]
    assert problems[0].solution == "2 + 3 = 5."


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(OrchError, match="valid choices: .json, .jsonl, .parquet"):
        load_problems(str(tmp_path / "data.csv"))
    with pytest.raises(OrchError, match="no such file"):
        load_problems(str(tmp_path / "missing.jsonl"))
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(OrchError, match="cannot read"):
        load_problems(str(broken))
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps([{"query": "q", "response": "no answer"}]))
    with pytest.raises(OrchError, match="no record"):
        load_problems(str(empty))


def test_env_on_real_records_picks_record_seed_mod_n(tmp_path):
    env = make_env("metamathqa", data_path=write_sample(tmp_path, ".jsonl"))
    assert "Simplify 6/8." in env.reset(seed=1)[0]
    assert "Simplify 6/8." in env.reset(seed=4)[0]  # 3 usable records
    _, reward, terminated, _, info = env.step("0.75")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_retries_halve_the_reward_and_say_incorrect(tmp_path):
    env = make_env("metamathqa", data_path=write_sample(tmp_path, ".json"))
    env.reset(seed=0)  # 2 + 3
    obs, reward, terminated, truncated, _ = env.step("6")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "incorrect" in obs
    assert env.step("4")[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step("5.0")
    assert (reward, terminated, info["attempt"]) == (0.25, True, 3)
    env.reset(seed=0)
    assert env.step("6")[1] == 0.0
    assert env.step("5")[1] == 0.5


def test_attempts_run_out_with_truncation(tmp_path):
    env = make_env("metamathqa", data_path=write_sample(tmp_path, ".json"), max_actions=2)
    env.reset(seed=2)
    assert env.step("square")[2:4] == (False, False)
    assert env.step("circle")[2:4] == (False, True)


def _last_number(text: str) -> str:
    return re.findall(r"-?\d+(?:\.\d+)?(?:/\d+)?", text)[-1]


def test_generated_problems_are_deterministic_varied_and_self_consistent():
    for seed in range(300):
        problem = generate_problem(random.Random(seed))
        assert problem == generate_problem(random.Random(seed))
        assert as_number(problem.answer) is not None
        assert answers_match(_last_number(problem.solution), problem.answer)  # the worked solution ends there
    assert len({generate_problem(random.Random(s)).question for s in range(50)}) == 50
    assert len(TEMPLATES) >= 6


def test_generated_answers_recomputed_from_the_question_text():
    """Recompute three templates' answers from the numbers in their questions."""
    checked = 0
    for seed in range(400):
        q = generate_problem(random.Random(seed))
        numbers = [int(n) for n in re.findall(r"\d+", q.question)]
        if q.question.startswith("A train travels"):
            speed, hours, extra = numbers
            expected = Fraction(speed * hours + extra)
        elif q.question.startswith("A jacket costs"):
            price, percent = numbers
            expected = Fraction(price) * (100 - percent) / 100
        elif "scored" in q.question:
            scores = numbers[:-1]
            expected = Fraction(sum(scores), len(scores))
        else:
            continue
        assert as_number(q.answer) == expected, q
        checked += 1
    assert checked >= 50


def test_generated_env_accepts_its_answer_first_time():
    env = make_env("metamathqa")
    for seed in range(20):
        env.reset(seed)
        assert env.step(env.problem.answer)[1] == 1.0


def test_small_sums_add_two_numbers_from_the_question():
    env = make_env("metamathqa", problems="small_sums")
    answers = set()
    for seed in range(200):
        obs = env.reset(seed)[0]
        first, second = (int(n) for n in re.findall(r"\d+", env.problem.question))
        assert 1 <= first <= SMALL_MAX and 1 <= second <= SMALL_MAX and env.problem.question in obs
        assert env.problem.answer == str(first + second) == _last_number(env.problem.solution)
        answers.add(env.problem.answer)
        assert env.step(env.problem.answer)[1] == 1.0
    assert answers == {str(n) for n in range(2, 2 * SMALL_MAX + 1)}


def test_problem_set_choices_and_defaults():
    assert make_env("metamathqa").config.problems == "word"
    with pytest.raises(OrchError, match="valid choices: word, small_sums"):
        make_env("metamathqa", problems="hard")
    with pytest.raises(OrchError, match="data_path is set"):
        make_env("metamathqa", problems="small_sums", data_path="x.jsonl")


def test_problems_at_its_default_leaves_a_cell_identity_unchanged():
    from recipes.config.schema import compose_train_config

    base = ["task=metamathqa", "model=tiny"]
    default = compose_train_config(base, host=False)
    assert "problems" in default.task.env  # conf/task/metamathqa.yaml writes it
    before = default.model_copy(update={"task": default.task.model_copy(
        update={"env": {k: v for k, v in default.task.env.items() if k != "problems"}})})
    assert default.digest() == before.digest()
    assert compose_train_config([*base, "task.env.problems=small_sums"], host=False).digest() != default.digest()
