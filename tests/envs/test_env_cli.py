"""`orch env list|show|play|demos` through the real `orch` app, and the light-import rule of the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from envs import make_env
from envs.sokoban.solver import solve
from orchestrator.cli import app

runner = CliRunner()


def orch(*args: str, stdin: str | None = None):
    return runner.invoke(app, list(args), input=stdin)


def test_list_names_every_task():
    result = orch("env", "list")
    assert result.exit_code == 0, result.output
    for task in ["sokoban", "sokoban_8x8", "frozenlake", "countdown", "metamathqa", "searchqa", "deepcoder"]:
        assert task in result.output
    assert "search[query]" in result.output  # brackets are not taken for markup


def test_show_prints_the_first_turn_and_writes_the_image(tmp_path):
    out = tmp_path / "room.png"
    result = orch("env", "show", "sokoban", "--seed", "3", "--image", str(out))
    assert result.exit_code == 0, result.output
    env = make_env("sokoban")
    assert env.reset(3)[0] in result.output
    assert "You're a helpful assistant." in result.output and "Turn 1:" in result.output
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_show_accepts_config_overrides():
    result = orch("env", "show", "frozenlake", "--seed", "1", "--set", "size=6", "--set", "slip=0.1")
    assert result.exit_code == 0, result.output
    state = result.output.split("State:\n")[1].split("\nYou have")[0]
    assert [len(row) for row in state.split("\n")] == [6] * 6
    assert "slippery" in result.output


def test_show_text_task_refuses_an_image_before_writing_anything(tmp_path):
    out = tmp_path / "x.png"
    result = orch("env", "show", "countdown", "--image", str(out))
    assert result.exit_code == 2
    assert "no image" in result.output and "sokoban" in result.output
    assert "Turn 1" not in result.output and not out.exists()


def test_bad_task_and_bad_key_exit_2_with_choices():
    result = orch("env", "show", "chess")
    assert result.exit_code == 2 and "valid choices" in result.output and "frozenlake" in result.output
    result = orch("env", "demos", "sokoban", "--set", "boxes=2")
    assert result.exit_code == 2 and "num_boxes" in result.output
    result = orch("env", "show", "sokoban", "--set", "size")
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def test_play_with_piped_moves_solves_the_room():
    env = make_env("sokoban")
    env.reset(8)
    plan = solve(env.room)
    lines = [" || ".join(plan[i : i + 2]) for i in range(0, len(plan), 2)]
    result = orch("env", "play", "sokoban", "--seed", "8", stdin="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    assert "success True" in result.output
    assert f"return {round(-0.1 * len(plan) + 11, 4):g}" in result.output


def test_play_reports_invalid_input_and_stops_at_end_of_input():
    result = orch(
        "env", "play", "frozenlake", "--seed", "0", stdin="Jump\n<think>x</think><answer>Up</answer>\n"
    )
    assert result.exit_code == 0, result.output
    assert "invalid: an action is not one of the valid actions" in result.output
    assert "(end of input)" in result.output and "success False" in result.output


def test_play_countdown_with_a_full_reply():
    from envs.countdown.puzzle import solve as solve_puzzle

    env = make_env("countdown")
    env.reset(2)
    expression = solve_puzzle(env.puzzle).expression
    result = orch(
        "env", "play", "countdown", "--seed", "2", stdin=f"<think>ok</think><answer>{expression}</answer>\n"
    )
    assert result.exit_code == 0 and "success True" in result.output


def test_demos_json_lines():
    result = orch("env", "demos", "frozenlake", "--n", "2", "--seed", "1", "--json")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().split("\n")
    assert len(lines) == 2
    for line in lines:
        messages = json.loads(line)["messages"]
        assert messages[0]["role"] == "system" and messages[-1]["role"] == "assistant"


def test_demos_text():
    result = orch("env", "demos", "countdown", "--n", "1")
    assert (
        result.exit_code == 0 and "=== demonstration 1/1 ===" in result.output and "<think>" in result.output
    )


def test_cli_module_imports_nothing_heavy():
    code = (
        "import sys, envs, envs.cli\n"
        "heavy = [m for m in ('numpy', 'pydantic', 'PIL', 'torch', 'rich', 'pandas') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
