"""The Countdown environment (the setup of RAGEN-2, arXiv 2604.06268): one turn, one arithmetic expression."""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field, model_validator

from envs.base import DataSource, Env, EnvConfig, reject_options
from envs.countdown.dataset import load_puzzles
from envs.countdown.puzzle import (
    CORRECT_REWARD,
    WRONG_VALUE_REWARD,
    Puzzle,
    generate_puzzle,
    score_answer,
    solve,
)
from envs.records import SUFFIXES as RECORD_SUFFIXES
from envs.registry import register_env
from envs.split import record_index


class CountdownConfig(EnvConfig):
    late_keys = ("data_path", "max_instances")  # the loader came after Countdown cells had run
    max_turns: int = Field(1, ge=1, description="Turns per episode (the first answer always ends it).")
    max_actions_per_turn: int = Field(1, ge=1, description="Answers read from one reply.")
    max_actions: int = Field(1, ge=1, description="Answers per episode.")
    min_count: int = Field(3, ge=2, le=6, description="Fewest numbers in a puzzle.")
    max_count: int = Field(4, ge=2, le=6, description="Most numbers in a puzzle.")
    min_number: int = Field(1, ge=1, description="Smallest number drawn.")
    max_number: int = Field(99, ge=1, le=999_999, description="Largest number drawn.")
    min_target: int = Field(1, ge=1, description="Smallest target.")
    max_target: int = Field(100, ge=1, le=999_999, description="Largest target.")
    data_path: str | None = Field(
        None,
        description="Countdown-Tasks-3to4 file (.json/.jsonl/.parquet: target, nums), selected as RAGEN does "
                    "(envs.countdown.dataset); a training record each; evaluation seeds play the held-out 10% "
                    "(envs.split). None: generated puzzles (the count, number and target ranges above).",
    )
    max_instances: int = Field(20_000, ge=1, description="Records of data_path read, from its start (RAGEN's "
                                                          "max_instances).")

    @model_validator(mode="after")
    def _ranges(self) -> CountdownConfig:
        for low, high in (
            ("min_count", "max_count"),
            ("min_number", "max_number"),
            ("min_target", "max_target"),
        ):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low}={getattr(self, low)} exceeds {high}={getattr(self, high)}")
        return self


def _listing(numbers: tuple[int, ...]) -> str:
    return ", ".join(map(str, numbers))


@register_env("countdown")
class CountdownEnv(Env):
    """Combine the given numbers with + - * / to reach the target, each number used exactly once."""

    data = DataSource("data_path", "Countdown-Tasks-3to4 JSON/JSONL/Parquet (Jiayi-Pan/Countdown-Tasks-3to4: target, "
                      "nums)", "puzzles orch draws in the data set's shape (3-4 numbers, targets up to 100)", RECORD_SUFFIXES)

    config_class = CountdownConfig
    valid_actions = None
    answer_format = "an arithmetic expression over the given numbers, e.g. (3 + 5) * 2"

    puzzle: Puzzle

    @property
    def instruction(self) -> str:
        return (
            "You are playing Countdown. Using each of the given numbers exactly once, and only the operations "
            "+, -, *, / and parentheses, write an expression equal to the target. "
            "Put only the expression in the answer, for example <answer> (3 + 5) * 2 </answer>. "
            f"Reward: {CORRECT_REWARD:g} if it equals the target, {WRONG_VALUE_REWARD:g} if it uses the numbers "
            "exactly but has another value, 0 otherwise."
        )

    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        reject_options(self, options, ())
        c = self.config
        if c.data_path is not None:
            puzzles = load_puzzles(c.data_path, c.max_instances)
            self.puzzle = puzzles[record_index(self.seed, len(puzzles))]
            return
        self.puzzle = generate_puzzle(
            rng, (c.min_count, c.max_count), (c.min_number, c.max_number), (c.min_target, c.max_target)
        )

    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        reward, verdict = score_answer(action, self.puzzle)
        info = {"success": verdict == "correct", "verdict": verdict, "action_valid": verdict != "invalid"}
        return reward, True, info

    def render_text(self) -> str:
        return f"Numbers: {_listing(self.puzzle.numbers)}\nTarget: {self.puzzle.target}"

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        solution = solve(self.puzzle)
        assert solution is not None, "generated puzzles and loaded ones (a signed sum reaches them) are solvable"
        numbers, target = _listing(self.puzzle.numbers), self.puzzle.target
        opening = rng.choice(
            [
                f"I must reach {target} using {numbers}.",
                f"Target {target}; available numbers {numbers}.",
                f"The numbers are {numbers} and the goal is {target}.",
            ]
        )
        closing = rng.choice(
            [
                "Each number is used exactly once.",
                "That uses every number once.",
                "All numbers are used once.",
            ]
        )
        steps = " ".join(f"{step}." for step in solution.steps)
        return f"{opening} {steps} {closing}", [solution.expression]
