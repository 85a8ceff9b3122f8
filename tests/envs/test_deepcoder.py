"""DeepCoder: answers parsed from the protocol, outputs compared, hostile programs contained by the bubblewrap
sandbox (each scored 0 for its test, the others kept, the machine unharmed), the refusal without isolation and the
explicit opt-out, the three public loaders on files written here, the shipped set's solver, and `orch train`."""

from __future__ import annotations

import base64
import json
import os
import pickle
import random
import socket
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envs import demonstrations, make_env
from envs.deepcoder.dataset import load_problems
from envs.deepcoder.generated import SHIPPED_SIZE, TEMPLATES, generate_problem, shipped_problems
from envs.deepcoder.problem import CodeProblem, extract_code, output_matches
from envs.deepcoder.sandbox import open_sandbox
from envs.protocol import format_response, parse_response
from envs.split import record_index
from orchestrator.cli import app
from orchlib.errors import OrchError

FAST = {"cpu_seconds": 1, "wall_seconds": 1.5}
TRIPLE = CodeProblem(prompt="Return x * 2.", mode="call", fn_name="double", tests=(([1], 2), ([2], 4), ([3], 6)))


def sandbox_processes() -> list[int]:
    """Processes on this machine still running the sandbox harness (the marker is in their command line)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"orch-deepcoder-harness" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def play(code: str, problem: CodeProblem = TRIPLE, **config) -> tuple[float, dict]:
    env = make_env("deepcoder", **{**FAST, **config})
    env.reset(0)
    env.problem = problem
    _, reward, terminated, _, info = env.step(code)
    assert terminated
    return reward, info


def test_reply_in_the_protocol_gives_the_fenced_code():
    code = "def double(x):\n    return x * 2\n"
    reply = format_response("double it", [f"```python\n{code}```"])
    parsed = parse_response(reply, None, 1)
    assert parsed.ok and extract_code(parsed.actions[0]) == code.rstrip("\n")
    assert extract_code("print(1)") == "print(1)"
    assert extract_code("Here:\n```py\nprint(2)\n```\ntrailing") == "print(2)"
    assert parse_response(f"<think> t </think> <answer> {code} || x </answer>", None, 1).extra_actions == 1


@pytest.mark.parametrize(
    ("mode", "got", "expected", "ok"),
    [
        ("stdio", "1 2\n3  \n\n", "1 2\n3", True),
        ("stdio", "0.1000000001\n", "0.1", True),
        ("stdio", "1 2", "1 3", False),
        ("call", "[1, 2]", [1, 2], True),
        ("call", "7", [7], True),  # APPS/TACO wrap call outputs in a list
        ("call", "true", 1, False),
        ("call", "0.30000000000000004", 0.3, True),
        ("call", None, 1, False),
        ("call", "not json", 1, False),
    ],
)
def test_output_comparison(mode, got, expected, ok):
    assert output_matches(mode, got, expected) is ok


def test_reward_is_the_fraction_of_tests_passed():
    reward, info = play("def double(x):\n    return x * 2\n")
    assert (reward, info["passed"], info["total"], info["success"], info["executed"]) == (1.0, 3, 3, True, True)
    reward, info = play("def double(x):\n    return 4 if x == 2 else 0\n")
    assert reward == pytest.approx(1 / 3) and info["passed"] == 1 and not info["success"]
    stdio = CodeProblem(prompt="Square n.", mode="stdio", tests=(("3\n", "9\n"), ("4\n", "16\n")))
    assert play("n = int(input())\nprint(n * n if n == 3 else 0)\n", stdio)[0] == 0.5
    assert play("import sys\nprint(int(sys.stdin.readline()) ** 2)\nsys.exit(0)\n", stdio)[0] == 1.0
    big = CodeProblem(prompt="Count the characters.", mode="stdio", tests=(("a" * 3_000_000, "3000000"),))
    assert play("import sys\nprint(len(sys.stdin.read()))", big)[0] == 1.0  # inputs are not capped like outputs


def test_unparsable_code_is_an_invalid_action_scored_zero():
    reward, info = play("def double(x:\n")
    assert (reward, info["action_valid"]) == (0.0, False) and "SyntaxError" in info["compile_error"]
    assert play("```python\n```")[1]["action_valid"] is False


HOSTILE = {
    "timeout": ("import time\ntime.sleep(60)", {"timeout"}),
    "infinite_loop": ("while True:\n        pass", {"timeout"}),
    "crash": ("import ctypes\nctypes.string_at(0)", {"crash"}),
    "exception": ("raise RuntimeError('boom')", {"error"}),
    "flood_output": ("while True:\n        print('x' * 4096)", {"error", "crash"}),  # EFBIG: Python ignores SIGXFSZ
    # a fork bomb ends by the process limit (error), the timeout, or a forked copy leaving without a result (crash:
    # seen once in CI on a loaded 2-core machine); whichever, the test scores zero and the others are kept
    "fork_bomb": ("import os\nwhile True:\n        os.fork()", {"error", "timeout", "crash"}),
    "read_passwd": ("open('/etc/passwd').read()\nreturn 4", {"error"}),
    "allocate_10gb": ("bytearray(10 * 1024 ** 3)\nreturn 4", {"error", "crash"}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_test_scores_zero_and_the_others_are_kept(name):
    body, statuses = HOSTILE[name]
    body = body.replace("\n", "\n        ")
    code = f"def double(x):\n    if x == 2:\n        {body}\n    return x * 2\n"
    reward, info = play(code)
    assert reward == pytest.approx(2 / 3), info
    assert info["statuses"][0] == info["statuses"][2] == "ok" and info["statuses"][1] in statuses
    assert sandbox_processes() == []


def test_writes_outside_the_sandbox_fail_and_leave_nothing(tmp_path):
    targets = [tmp_path / "escaped.txt", Path.cwd() / "escaped.txt", Path.home() / "escaped.txt"]
    for target in targets:
        code = f"def double(x):\n    open({str(target)!r}, 'w').write('x')\n    return x * 2\n"
        assert play(code)[0] == 0.0
        assert not target.exists()
    scratch = "def double(x):\n    open('scratch', 'w').write('ok')\n    return x * 2\n"
    assert play(scratch)[0] == 1.0  # its own working directory is writable


def test_no_network_even_to_this_machine():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (f"def double(x):\n    import socket\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "    return x * 2\n")
        assert play(code)[0] == 0.0
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_refuses_without_bwrap_and_runs_only_with_the_explicit_opt_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    open_sandbox.cache_clear()
    try:
        env = make_env("deepcoder")
        env.reset(0)
        env.step(env.problem.solution)  # the shipped reference is scored without running: no sandbox needed
        env.reset(0)
        with pytest.raises(OrchError, match="refusing to run generated code: no bwrap on PATH.*sandbox: none") as err:
            env.step("print(1)")
        assert "\n" not in str(err.value)
        fake = tmp_path / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
        fake.chmod(0o755)
        with pytest.raises(OrchError, match="bwrap cannot isolate code here.*sandbox: none") as err:
            play("def double(x):\n    return x * 2\n")
        assert "\n" not in str(err.value)
        assert play("def double(x):\n    return x * 2\n", sandbox="none")[0] == 1.0
    finally:
        open_sandbox.cache_clear()


def test_bad_sandbox_setting_names_the_choices():
    with pytest.raises(OrchError, match="sandbox.*'bwrap' or 'none'"):
        make_env("deepcoder", sandbox="docker")


def _write(path: Path, records: list[dict]) -> str:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif path.suffix == ".json":
        path.write_text(json.dumps(records))
    else:
        import pandas as pd

        pd.DataFrame(records).to_parquet(path)
    return str(path)


def _solve_all(path: str, answers: list[str] | None = None) -> list[float]:
    env = make_env("deepcoder", data_path=path, **FAST)
    rewards = []
    for seed in range(len(load_problems(path))):
        env.reset(seed)
        answer = answers[seed] if answers else env.demonstrate(random.Random(0))[1][0]
        rewards.append(env.step(answer)[1])
    return rewards


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_primeintellect_records_round_trip(tmp_path, suffix):
    records = [
        {"problem_id": "vfc_1", "task_type": "verifiable_code", "source": "apps",
         "prompt": "Read n, print n + 1.", "gold_standard_solution": "```python\nprint(int(input()) + 1)\n```",
         "verification_info": json.dumps({"language": "python", "test_cases": [
             {"type": "stdin_stdout", "input": "1\n", "output": "2\n"},
             {"type": "stdin_stdout", "input": "41\n", "output": "42\n"}]}),
         "metadata": "{}"},
        {"problem_id": "vfc_2", "task_type": "verifiable_code", "source": "codewars",
         "prompt": "Write add(a, b).", "gold_standard_solution": "def add(a, b):\n    return a + b\n",
         "verification_info": json.dumps({"language": "python", "test_cases": [
             {"type": "function_call", "fn_name": "add", "input": [1, 2], "output": [3]},
             {"type": "function_call", "fn_name": "add", "input": [5, 5], "output": [10]}]}),
         "metadata": "{}"},
        {"problem_id": "vfc_3", "prompt": "Rust only.", "gold_standard_solution": "fn main() {}",
         "verification_info": json.dumps({"language": "rust", "test_cases": [{"input": "", "output": ""}]})},
    ]
    path = _write(tmp_path / f"pi{suffix}", records)
    first, second = load_problems(path)
    assert (first.mode, first.tests, first.solution) == ("stdio", (("1\n", "2\n"), ("41\n", "42\n")),
                                                         "print(int(input()) + 1)")
    assert (second.mode, second.fn_name, second.tests) == ("call", "add", (([1, 2], [3]), ([5, 5], [10])))
    assert _solve_all(path) == [1.0, 1.0]


def test_taco_records_round_trip(tmp_path):
    records = [
        {"question": "Print the sum of two integers on one line.", "starter_code": "", "difficulty": "EASY",
         "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)"]),
         "input_output": json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", ["7"]]})},
        {"question": "Return the largest element.", "starter_code": "def largest(xs):\n\t",
         "solutions": json.dumps(["def largest(xs):\n    return max(xs)"]),
         "input_output": json.dumps({"fn_name": "largest", "inputs": [[[1, 5, 2]], [[-3]]], "outputs": [[5], [-3]]})},
        {"question": "No tests.", "solutions": "[]", "input_output": json.dumps({"inputs": [], "outputs": []})},
    ]
    path = _write(tmp_path / "taco.json", records)
    stdio, call = load_problems(path)
    assert stdio.tests == (("1 2\n", "3\n"), ("3 4\n", "7"))
    assert (call.fn_name, call.starter_code, call.tests[0]) == ("largest", "def largest(xs):\n\t", ([[1, 5, 2]], [5]))
    assert _solve_all(path) == [1.0, 1.0]
    env = make_env("deepcoder", data_path=path)
    assert "Starter code:\ndef largest(xs):" in env.reset(1)[0]


def test_livecodebench_records_round_trip_with_compressed_private_tests(tmp_path):
    private = json.dumps([{"input": "[4, 2]\n2", "output": "1", "testtype": "functional"}])
    packed = base64.b64encode(zlib.compress(pickle.dumps(private))).decode()
    records = [
        {"question_title": "Count", "question_content": "Count occurrences of target in nums.",
         "platform": "leetcode", "question_id": "1", "contest_id": "w1", "contest_date": "2024-01-01T00:00:00",
         "starter_code": "class Solution:\n    def countIt(self, nums: List[int], target: int) -> int:\n        ",
         "difficulty": "easy", "metadata": json.dumps({"func_name": "countIt"}),
         "public_test_cases": json.dumps([{"input": "[1, 2, 2]\n2", "output": "2", "testtype": "functional"}]),
         "private_test_cases": packed},
        {"question_title": "Echo", "question_content": "Print the input line reversed.", "platform": "atcoder",
         "starter_code": "", "metadata": "{}", "private_test_cases": "",
         "public_test_cases": json.dumps([{"input": "abc\n", "output": "cba\n", "testtype": "stdin"}])},
    ]
    path = _write(tmp_path / "lcb.jsonl", records)
    call, stdio = load_problems(path)
    assert (call.mode, call.fn_name, call.tests) == ("call", "countIt", (([[1, 2, 2], 2], 2), ([[4, 2], 2], 1)))
    assert call.solution is None and stdio.tests == (("abc\n", "cba\n"),)
    answers = ["from typing import List\nclass Solution:\n    def countIt(self, nums: List[int], target: int) -> int:"
               "\n        return nums.count(target)\n", "print(input()[::-1])"]
    assert _solve_all(path, answers) == [1.0, 1.0]
    with pytest.raises(OrchError, match="no reference solution"):
        _demo(path)


def _demo(path: str) -> None:
    env = make_env("deepcoder", data_path=path)
    env.reset(0)
    env.demonstrate(random.Random(0))


def test_loader_refuses_pickled_objects_and_names_bad_files(tmp_path):
    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/")))).decode()
    path = _write(tmp_path / "evil.jsonl", [{"question_content": "q", "public_test_cases": "[]",
                                              "private_test_cases": evil}])
    with pytest.raises(OrchError, match="refusing to unpickle"):
        load_problems(path)
    with pytest.raises(OrchError, match="valid choices: .json, .jsonl, .parquet"):
        load_problems(str(tmp_path / "data.csv"))
    with pytest.raises(OrchError, match="no such file"):
        load_problems(str(tmp_path / "missing.json"))
    unknown = _write(tmp_path / "unknown.json", [{"title": "x"}])
    with pytest.raises(OrchError, match="cannot tell the data format.*primeintellect, taco, livecodebench"):
        load_problems(unknown)


def test_shipped_set_is_deterministic_and_covers_every_template():
    problems = shipped_problems()
    assert len(problems) == SHIPPED_SIZE and generate_problem(7) == problems[7]
    assert len({p.prompt for p in problems}) > 0.9 * SHIPPED_SIZE
    assert {p.mode for p in problems} == {"call", "stdio"}
    assert {p.source for p in problems} == {f"generated/{t.__name__}" for t in TEMPLATES}


def test_reference_solutions_pass_in_the_sandbox():
    """The shipped references run through the sandbox (a trailing comment defeats the known-answer shortcut):
    the first problem of every template."""
    env, firsts = make_env("deepcoder"), {}
    for seed, problem in enumerate(shipped_problems()):
        firsts.setdefault(problem.source, seed)
    assert len(firsts) == len(TEMPLATES)
    for seed in firsts.values():
        env.reset(seed)
        _, reward, _, _, info = env.step(env.problem.solution + "# run it\n")
        assert (reward, info["executed"]) == (1.0, True), (seed, info)


def test_demonstrations_succeed_in_the_protocol():
    for transcript in demonstrations("deepcoder", 8, seed=2):
        assert len(transcript) == 3
        reply = parse_response(transcript[2]["content"], None, 1)
        assert reply.ok and reply.actions[0].startswith("```python")
    env = make_env("deepcoder")
    for seed in range(20):
        env.reset(seed)
        assert env.step(env.demonstrate(random.Random(seed))[1][0])[1] == 1.0


def test_cli_show_and_the_refusal_in_play(tmp_path, monkeypatch):
    runner = CliRunner()
    shown = runner.invoke(app, ["env", "show", "deepcoder", "--seed", "4"])
    assert shown.exit_code == 0 and shown_problem(4) in shown.output
    monkeypatch.setenv("PATH", str(tmp_path))
    open_sandbox.cache_clear()
    try:
        refused = runner.invoke(app, ["env", "play", "deepcoder"], input="print(1)\n")
    finally:
        open_sandbox.cache_clear()
    assert refused.exit_code == 2 and "orch: error: deepcoder: refusing to run generated code: no bwrap" in refused.output


def shown_problem(seed: int) -> str:
    return shipped_problems()[record_index(seed, len(shipped_problems()))].prompt.split("\n")[0]


@pytest.mark.parametrize(("python", "message"), [
    ("python3; touch PWNED", "is not an absolute path or a program name"),
    ("/usr/bin/python3 -X utf8", "must be one absolute path"),
    ("python3", "must be one absolute path"),
    ("/nonexistent/bin/python3", "is not an executable file here"),
])
def test_the_sandbox_interpreter_must_be_one_absolute_executable_path(python: str, message: str) -> None:
    from envs.registry import make_env

    with pytest.raises(OrchError, match="python") as caught:
        make_env("deepcoder", python=python)
    assert message in str(caught.value) and len(str(caught.value).splitlines()) == 1


def test_command_words_refuse_shell_syntax_and_keep_plain_commands() -> None:
    from orchlib.commands import command_words

    assert command_words("/opt/conda/bin/python -X utf8 -u") == ["/opt/conda/bin/python", "-X", "utf8", "-u"]
    assert command_words("python3") == ["python3"]
    for bad in ("python3; id", "python3 | id", "python3 $(id)", "python3 `id`", "python3 > /tmp/x", "./python",
                "python3 'a b'", "~/python", "python*", ""):
        with pytest.raises(ValueError):
            command_words(bad)
