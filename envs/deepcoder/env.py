"""The DeepCoder environment (the code task of RAGEN-2, arXiv 2604.06268, after Agentica's DeepCoder): one turn,
one program; reward = the fraction of its tests passed, each run in the sandbox (`envs/deepcoder/sandbox.py`)."""

from __future__ import annotations

import os
import random
from typing import Any, Literal

from pydantic import Field, field_validator

from envs.base import DataSource, Env, EnvConfig, reject_options
from envs.deepcoder.dataset import load_problems
from envs.deepcoder.generated import shipped_problems
from envs.deepcoder.problem import CodeProblem, extract_code, output_matches
from envs.deepcoder.sandbox import EXECUTIONS, Limits, Sandbox, open_sandbox
from envs.records import SUFFIXES as RECORD_SUFFIXES
from envs.registry import register_env
from envs.split import record_index
from orchlib.commands import command_words
from orchlib.errors import OrchError


class DeepCoderConfig(EnvConfig):
    max_turns: int = Field(1, ge=1, description="Turns per episode (the first program always ends it).")
    max_actions_per_turn: int = Field(1, ge=1, description="Programs read from one reply.")
    max_actions: int = Field(1, ge=1, description="Programs per episode.")
    data_path: str | None = Field(
        None, description="Problems file (.json/.jsonl/.parquet); problem: a training record; evaluation seeds play the held-out 10% (envs.split). None: the shipped set."
    )
    data_format: Literal["auto", "primeintellect", "taco", "livecodebench"] = Field(
        "auto", description="Schema of data_path's records; auto: from the first record's keys."
    )
    max_tests: int | None = Field(None, ge=1, description="Tests run per problem (the first N); None: all.")
    sandbox: Literal["bwrap", "none"] = Field(
        "bwrap",
        description="Isolation of the generated code: bwrap (bubblewrap), or none (DANGEROUS: the code runs "
        "unisolated with your rights; only for code you trust).",
    )
    python: str | None = Field(
        None, description="Interpreter run in the sandbox (an absolute path to an executable file); None: orch's "
        "own, else /usr/bin/python3."
    )

    @field_validator("python")
    @classmethod
    def _interpreter(cls, value: str | None) -> str | None:
        if value is None:
            return value
        words = command_words(value, "Python interpreter")
        if len(words) != 1 or not words[0].startswith("/"):
            raise ValueError(f"{value!r} must be one absolute path to a Python interpreter, e.g. /usr/bin/python3")
        if not (os.path.isfile(value) and os.stat(value).st_mode & 0o111):
            raise ValueError(f"{value!r} is not an executable file here")
        return value
    cpu_seconds: int = Field(2, ge=1, description="CPU-time limit per test (RLIMIT_CPU).")
    wall_seconds: float = Field(4.0, gt=0, description="Wall-clock limit per test.")
    memory_mb: int = Field(512, ge=64, description="Address-space limit per test (RLIMIT_AS), MiB.")


@register_env("deepcoder")
class DeepCoderEnv(Env):
    """Write a Python function or stdin/stdout program; reward = fraction of its tests passed (sandboxed)."""

    data = DataSource("data_path", "PrimeIntellect / TACO / LiveCodeBench JSON/JSONL/Parquet",
                      "the small problem set shipped with orch", RECORD_SUFFIXES)

    config_class = DeepCoderConfig
    valid_actions = None
    answer_format = "Python code (a function or a stdin/stdout program), optionally in a ```python block"

    problem: CodeProblem
    verdicts: list[bool] | None  # None before the answer

    def __init__(self, config: DeepCoderConfig) -> None:
        super().__init__(config)
        self.limits = Limits(config.cpu_seconds, config.wall_seconds, config.memory_mb)

    @property
    def sandbox(self) -> Sandbox:
        """The checked sandbox, opened on the first answer that must run (once per process): OrchError, before any
        code runs, where there is no isolation. Shipped-set demonstrations run nothing, so they need no sandbox
        (the tiny models' tokenizer is trained on every task's demonstrations, on any machine)."""
        return open_sandbox(self.config.sandbox, self.config.python)

    @property
    def instruction(self) -> str:
        return (
            "You are solving a programming problem in Python. Think it through, then put only the code inside the "
            "answer tags (a ```python block is fine); it is run on hidden tests. Reward: the fraction of tests "
            "passed. Do not write '||' in the code: it separates actions."
        )

    def _problems(self) -> tuple[CodeProblem, ...]:
        if self.config.data_path is None:
            return shipped_problems()
        return load_problems(self.config.data_path, self.config.data_format)

    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        reject_options(self, options, ())
        problems = self._problems()
        self.problem = problems[record_index(self.seed, len(problems))]
        self.verdicts = None

    def tests(self) -> tuple[tuple[Any, Any], ...]:
        return self.problem.tests[: self.config.max_tests]

    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        code, tests, problem = extract_code(action), self.tests(), self.problem
        if not code.strip():
            self.verdicts = [False] * len(tests)
            return 0.0, True, {"success": False, "action_valid": False, "passed": 0, "total": len(tests)}
        if problem.is_reference(code):
            self.verdicts = [True] * len(tests)
            return 1.0, True, {"success": True, "passed": len(tests), "total": len(tests), "executed": False}
        execution = EXECUTIONS.run(self.sandbox, code, problem.mode, problem.fn_name,
                                   [test_input for test_input, _ in tests], self.limits)
        if execution.compile_error is not None:
            self.verdicts = [False] * len(tests)
            return 0.0, True, {"success": False, "action_valid": False, "passed": 0, "total": len(tests),
                               "compile_error": execution.compile_error}
        self.verdicts = [run.status == "ok" and output_matches(problem.mode, run.output, expected)
                         for run, (_, expected) in zip(execution.runs, tests, strict=True)]
        passed = sum(self.verdicts)
        info = {"success": passed == len(tests), "passed": passed, "total": len(tests),
                "statuses": [run.status for run in execution.runs], "executed": True}
        return passed / len(tests), True, info

    def render_text(self) -> str:
        problem = self.problem
        lines = [f"Problem:\n{problem.prompt}"]
        if problem.mode == "call":
            lines.append(f"Answer with a Python function named `{problem.fn_name}` (it may be a method of a class "
                         "Solution); it is called with each test's arguments and its return value is checked.")
        else:
            lines.append("Answer with a Python program that reads standard input and prints to standard output.")
        if problem.starter_code.strip():
            lines.append(f"Starter code:\n{problem.starter_code.rstrip()}")
        if self.verdicts is not None:
            lines.append(f"Tests passed: {sum(self.verdicts)}/{len(self.verdicts)}")
        return "\n".join(lines)

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        problem = self.problem
        if problem.solution is None:
            raise OrchError(f"deepcoder: problem {self.seed} has no reference solution to demonstrate "
                            "(LiveCodeBench records carry none)")
        what = f"the function {problem.fn_name}" if problem.mode == "call" else "a stdin/stdout program"
        opening = rng.choice([f"I need {what}.", f"The task asks for {what}.", f"Plan for {what}:"])
        explanation = problem.explanation or "I follow the statement directly."
        closing = rng.choice(["That covers the edge cases.", "This handles every input described.",
                              "The example checks out."])
        return f"{opening} {explanation} {closing}", [f"```python\n{problem.solution.rstrip()}\n```"]
