"""Loader for real MetaMathQA records: JSON (a list), JSONL or Parquet with `query` and `response` fields."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from envs.metamathqa.answers import split_response
from envs.metamathqa.problem import MathProblem
from envs.records import read_data_file
from orchlib.errors import OrchError


def _to_problem(record: Any) -> MathProblem | None:
    if not isinstance(record, dict):
        return None
    query, response = record.get("query"), record.get("response")
    if not isinstance(query, str) or not isinstance(response, str):
        return None
    parts = split_response(response)
    if parts is None:
        return None
    solution, answer = parts
    return MathProblem(question=query.strip(), answer=answer, solution=solution)


@lru_cache(maxsize=4)
def load_problems(path: str) -> tuple[MathProblem, ...]:
    """The records of `path` that have a `query`, a `response` and an extractable final answer, in file order.
    Raises OrchError for a missing or unreadable file, an unknown suffix, or a file with no usable record."""
    records = read_data_file(path, "metamathqa", ["query", "response"])
    problems = tuple(p for p in map(_to_problem, records) if p is not None)
    if not problems:
        raise OrchError(
            f"metamathqa data_path {path}: no record has 'query', 'response' and 'The answer is: X'"
        )
    return problems
