"""Demonstrations: exact protocol, deterministic, successful, and reasoning that states this input's facts."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys

import pytest

from envs import demonstrations, make_env
from envs.countdown.puzzle import Puzzle, score_answer
from envs.frozenlake.lake import GOAL, HOLE, check_lake, move
from envs.protocol import parse_response
from envs.sokoban.room import Room

TASKS = ["sokoban", "sokoban_8x8", "frozenlake", "countdown", "metamathqa", "searchqa", "deepcoder"]


def replies(transcript):
    return [m["content"] for m in transcript if m["role"] == "assistant"]


@pytest.mark.parametrize("task", TASKS)
def test_deterministic_per_seed_and_varied_across_seeds(task):
    assert demonstrations(task, 4, seed=1) == demonstrations(task, 4, seed=1)
    assert demonstrations(task, 4, seed=1) != demonstrations(task, 4, seed=2)
    transcripts = demonstrations(task, 4, seed=1)
    assert len({t[1]["content"] for t in transcripts}) == 4  # different episodes


@pytest.mark.parametrize("task", TASKS)
def test_every_reply_is_in_the_protocol(task):
    env = make_env(task)
    for transcript in demonstrations(task, 6, seed=0):
        assert transcript[0] == {"role": "system", "content": env.system_prompt}
        assert [m["role"] for m in transcript[1:]] == ["user", "assistant"] * (len(transcript) // 2)
        for reply in replies(transcript):
            parsed = parse_response(reply, env.valid_actions, env.max_actions_per_turn)
            assert parsed.ok and parsed.extra_actions == 0 and parsed.reasoning


def _player(rows: list[str], symbols: str) -> tuple[int, int]:
    return next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in symbols)


def test_sokoban_demos_solve_the_room_and_cite_its_positions(state_of):
    for transcript in demonstrations("sokoban", 10, seed=3):
        room = Room.from_text(state_of(transcript[:2]))
        for index, reply in enumerate(replies(transcript)):
            state = state_of(transcript[: 2 + 2 * index])
            rows = state.split("\n")
            r, c = _player(rows, "PS")
            reasoning = parse_response(reply).reasoning
            assert f"({r}, {c})" in reasoning  # the player's position in THIS state
            for box in Room.from_text(state).boxes:
                assert f"({box[0]}, {box[1]})" in reasoning
            for action in parse_response(reply, ["Up", "Down", "Left", "Right"]).actions:
                room, _ = room.move(action)
        assert room.solved


def test_frozenlake_demos_reach_the_goal_and_name_every_hole(state_of):
    """The reasoning reads the map: the player's position and every hole's coordinates (the start and the goal
    alone are the same on every map), and the moves reach the goal."""
    hole_facts = 0
    for transcript in demonstrations("frozenlake", 10, seed=4):
        rows = state_of(transcript[:2]).split("\n")
        pos = _player(rows, "P")
        lake = check_lake([row.translate(str.maketrans("P_OG", "SFHG")) for row in rows])
        holes = [(r, c) for r, row in enumerate(lake) for c, cell in enumerate(row) if cell == HOLE]
        for reply in replies(transcript):
            reasoning = parse_response(reply).reasoning
            assert f"({pos[0]}, {pos[1]})" in reasoning
            for r, c in holes:
                assert f"({r}, {c})" in reasoning.split("Holes:")[1].split(".")[0]
            hole_facts += bool(holes)
            for action in parse_response(reply, ["Left", "Down", "Right", "Up"]).actions:
                pos = move(lake, pos, action)
        assert lake[pos[0]][pos[1]] == GOAL
    assert hole_facts >= 3


def test_countdown_demos_are_correct_and_show_the_arithmetic(state_of):
    for transcript in demonstrations("countdown", 15, seed=5):
        state = state_of(transcript[:2])
        numbers = tuple(int(n) for n in re.search(r"Numbers: (.*)", state).group(1).split(", "))
        target = int(re.search(r"Target: (\d+)", state).group(1))
        (reply,) = replies(transcript)
        parsed = parse_response(reply, None, 1)
        assert score_answer(parsed.actions[0], Puzzle(numbers, target)) == (1.0, "correct")
        assert f"= {target}" in parsed.reasoning
        assert all(str(n) in parsed.reasoning for n in numbers)


def test_math_demos_answer_correctly_first_time():
    for transcript in demonstrations("metamathqa", 10, seed=6):
        assert len(transcript) == 3  # a wrong answer would have produced another user turn


def test_phrasing_varies_between_demonstrations():
    openings = {
        parse_response(replies(t)[0]).reasoning.split(" (")[0] for t in demonstrations("sokoban", 20, 0)
    }
    assert len(openings) >= 2


def test_demonstrations_do_not_depend_on_the_hash_seed():
    code = (
        "import hashlib, json\n"
        "from envs import demonstrations\n"
        "tasks = ['sokoban', 'sokoban_8x8', 'frozenlake', 'countdown', 'metamathqa', 'searchqa', 'deepcoder']\n"
        "print(hashlib.sha256(json.dumps([demonstrations(t, 3, 9) for t in tasks]).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            check=True,
        ).stdout
        for hash_seed in ("1", "2")
    }
    assert len(digests) == 1


def test_stuck_sokoban_room_still_gets_an_answer():
    env = make_env("sokoban")
    env.reset(0, options={"room": "#####\n#X_P#\n#_O_#\n#####"})
    reasoning, actions = env.demonstrate(random.Random(0))
    assert "stuck" in reasoning and len(actions) == 1 and actions[0] in env.valid_actions
