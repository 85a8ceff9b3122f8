"""The MetaMathQA environment (the setup of RAGEN-2, arXiv 2604.06268): answer a math question, retrying after "incorrect";
the reward of a correct answer halves with every earlier attempt (1, 1/2, 1/4, ...)."""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, field_validator, model_validator

from envs.base import DataSource, Env, EnvConfig, reject_options
from envs.metamathqa.answers import answers_match
from envs.metamathqa.dataset import load_problems
from envs.metamathqa.problem import MathProblem
from envs.metamathqa.wordproblems import PROBLEM_SETS
from envs.records import SUFFIXES as RECORD_SUFFIXES
from envs.registry import register_env
from envs.split import record_index


class MetaMathQAConfig(EnvConfig):
    late_keys = ("problems",)  # the small sums came after MetaMathQA cells had run
    max_turns: int = Field(3, ge=1, description="Turns per episode: one answer each.")
    max_actions_per_turn: int = Field(1, ge=1, description="Answers read from one reply.")
    max_actions: int = Field(3, ge=1, description="Attempts per episode.")
    data_path: str | None = Field(
        None,
        description="MetaMathQA file (.json/.jsonl/.parquet); problem: a training record; evaluation seeds play the held-out 10% (envs.split). None: generated.",
    )
    problems: str = Field(
        "word",
        description="The generated problems without data_path: word (arithmetic word problems, eight templates) or "
                    "small_sums (two numbers from 1 to 4 added: a set a micro model answers some of).",
    )

    @field_validator("problems")
    @classmethod
    def _known_problems(cls, problems: str) -> str:
        if problems not in PROBLEM_SETS:
            raise ValueError(f"{problems!r} is not a problem set; valid choices: {', '.join(PROBLEM_SETS)}")
        return problems

    @model_validator(mode="after")
    def _problems_generated(self) -> MetaMathQAConfig:
        if self.data_path is not None and self.problems != "word":
            raise ValueError(f"problems={self.problems} chooses generated problems, but data_path is set: the "
                             "problems are the file's (leave problems at word)")
        return self


@register_env("metamathqa")
class MetaMathQAEnv(Env):
    """Answer a math word problem; wrong answers are marked incorrect and may be retried for less reward."""

    data = DataSource("data_path", "MetaMathQA JSON/JSONL/Parquet (meta-math/MetaMathQA: query, response)",
                      "built-in generated word problems", RECORD_SUFFIXES)

    config_class = MetaMathQAConfig
    valid_actions = None
    answer_format = "the final answer only (a number or short expression)"

    problem: MathProblem
    last_correct: bool | None  # None before the first answer

    @property
    def instruction(self) -> str:
        return (
            "You are solving a math problem. Reason step by step, then give only the final answer inside the "
            f"answer tags. You have {self.config.max_actions} attempts; a wrong answer is marked incorrect and "
            "you may try again. Reward: 1 for a correct first attempt, halved for every earlier wrong attempt."
        )

    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        reject_options(self, options, ())
        if self.config.data_path is None:
            self.problem = PROBLEM_SETS[self.config.problems](rng)
        else:
            problems = load_problems(self.config.data_path)
            self.problem = problems[record_index(self.seed, len(problems))]
        self.last_correct = None

    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        correct = answers_match(action, self.problem.answer)
        self.last_correct = correct
        reward = 0.5**self.actions_taken if correct else 0.0
        return reward, correct, {"success": correct, "attempt": self.actions_taken + 1}

    def render_text(self) -> str:
        text = f"Question: {self.problem.question}"
        if self.last_correct is False:
            text += "\nYour previous answer was incorrect."
        return text

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        opening = rng.choice(["Let me work through it.", "Step by step:", "I will compute this carefully."])
        closing = rng.choice(["So the answer is", "Therefore the result is", "Final answer:"])
        answer = self.problem.answer
        return f"{opening} {self.problem.solution} {closing} {answer}.", [answer]
