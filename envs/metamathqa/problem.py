"""A math question with its exact final answer and a worked solution."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MathProblem:
    question: str
    answer: str
    solution: str  # worked reasoning that ends at `answer` (without the final 'The answer is' line)
