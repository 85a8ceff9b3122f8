"""Scripted policies for the environment tests. They see only the chat text, as a language model would: each
parses the state out of the last user message and answers with a solver's move."""

from __future__ import annotations

import re

import pytest

from envs.countdown.puzzle import Puzzle, solve
from envs.frozenlake.lake import check_lake, shortest_path
from envs.protocol import format_response
from envs.sokoban.room import Room
from envs.sokoban.solver import solve as solve_room


def state_of(messages: list[dict[str, str]]) -> str:
    """The state block of the last user message."""
    text = messages[-1]["content"]
    return re.search(r"State:\n(.*?)\nYou have", text, re.DOTALL).group(1)


def sokoban_reply(messages):
    plan = solve_room(Room.from_text(state_of(messages)))
    return format_response("replaying the solver", plan[:2])


def frozenlake_reply(messages):
    rows = state_of(messages).split("\n")
    start = next((r, row.index("P")) for r, row in enumerate(rows) if "P" in row)
    letters = str.maketrans({"P": "S", "_": "F", "O": "H", "G": "G"})
    lake = check_lake([row.translate(letters) for row in rows])
    return format_response("shortest path", shortest_path(lake, start)[:2])


def countdown_reply(messages):
    state = state_of(messages)
    numbers = tuple(int(n) for n in re.search(r"Numbers: (.*)", state).group(1).split(", "))
    target = int(re.search(r"Target: (\d+)", state).group(1))
    return format_response("search", [solve(Puzzle(numbers, target)).expression])


REPLIES = {
    "sokoban": sokoban_reply,
    "sokoban_8x8": sokoban_reply,
    "frozenlake": frozenlake_reply,
    "countdown": countdown_reply,
}


@pytest.fixture(name="state_of")
def state_of_fixture():
    """`state_of(messages)` -> the state block of the last user message."""
    return state_of


@pytest.fixture
def solver_policy():
    """`solver_policy(task)` -> a batched policy that plays the solver's moves read from the chat."""

    def make(task: str):
        reply = REPLIES[task]
        return lambda histories: [reply(messages) for messages in histories]

    return make
