"""Sokoban: dynamics, rewards step by step, generation (solvable, deterministic) and solver optimality."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from envs import make_env
from envs.sokoban.room import Room
from envs.sokoban.solver import solve
from orchlib.errors import OrchError

MOVES = ("Up", "Down", "Left", "Right")

# Player, floor, box, floor, target in one corridor.
CORRIDOR = """
#######
#P_X_O#
#######
"""


def reset_to(text: str, **config):
    env = make_env("sokoban", **config)
    env.reset(seed=0, options={"room": text})
    return env


def rewards_of(env, actions):
    return [round(env.step(action)[1], 6) for action in actions]


def test_room_text_round_trips():
    text = "#####\n#PXO#\n#_√_#\n#####"
    room = Room.from_text(text)
    assert room.to_text() == text
    assert room.player == (1, 1) and room.boxes == {(1, 2), (2, 2)} and room.targets == {(1, 3), (2, 2)}


@pytest.mark.parametrize(
    "text",
    [
        "###\n#P#\n###",
        "####\n#PXX#\n#O_#\n####",
        "####\n#PP#\n#XO#\n####",
        "#####\n#PXX#\n#_O_#\n#####",
        "#Q##\n#PXO",
    ],
)
def test_bad_rooms_are_rejected(text):
    with pytest.raises(OrchError, match="sokoban room"):
        Room.from_text(text)


def test_walking_costs_the_step_penalty_and_walls_block():
    env = reset_to(CORRIDOR)
    assert rewards_of(env, ["Up", "Left"]) == [-0.1, -0.1]  # both blocked by walls
    assert env.room.player == (1, 1)


def test_pushing_a_box_onto_its_target_solves_with_bonus():
    env = reset_to(CORRIDOR)
    obs, reward, terminated, truncated, info = env.step("Right")  # walk next to the box
    assert (round(reward, 6), terminated, info["pushed"]) == (-0.1, False, False)
    obs, reward, terminated, truncated, info = env.step("Right")  # push box to (1, 4)
    assert (round(reward, 6), info["pushed"]) == (-0.1, True)
    assert obs.split("\n")[1] == "#__PXO#"
    obs, reward, terminated, truncated, info = env.step("Right")  # push onto the target
    assert round(reward, 6) == round(-0.1 + 1 + 10, 6)
    assert terminated and not truncated and info["success"]
    assert obs.split("\n")[1] == "#___P√#"


def test_box_off_target_costs_one_and_back_on_solves():
    env = reset_to("######\n#____#\n#P√__#\n#____#\n######")
    # push the box off its target, walk around it, push it back
    assert rewards_of(env, ["Right"]) == [round(-0.1 - 1, 6)]
    assert env.room.boxes == {(2, 3)}
    assert rewards_of(env, ["Up", "Right", "Right", "Down"]) == [-0.1] * 4
    _, reward, terminated, _, info = env.step("Left")
    assert round(reward, 6) == round(-0.1 + 1 + 10, 6)
    assert terminated and info["success"]


def test_two_boxes_in_a_row_cannot_be_pushed():
    env = reset_to("#######\n#PXX_O#\n#____O#\n#######")
    _, reward, *_ = env.step("Right")
    assert round(reward, 6) == -0.1
    assert env.room.player == (1, 1) and env.room.boxes == {(1, 2), (1, 3)}


def test_each_box_on_target_pays_one_and_only_the_last_solves():
    env = reset_to("#######\n#PX_O_#\n#_X_O_#\n#######")
    assert rewards_of(env, ["Right", "Right"]) == [-0.1, round(-0.1 + 1, 6)]
    assert not env.room.solved
    assert rewards_of(env, ["Left", "Left", "Down", "Right"]) == [-0.1] * 4
    _, reward, terminated, _, _ = env.step("Right")
    assert round(reward, 6) == round(-0.1 + 1 + 10, 6) and terminated


def test_action_budget_truncates_the_episode():
    env = reset_to(CORRIDOR, max_actions=3)
    outcomes = [env.step("Left")[2:4] for _ in range(3)]
    assert outcomes == [(False, False), (False, False), (False, True)]


def test_generation_is_deterministic_per_seed():
    env_a, env_b = make_env("sokoban"), make_env("sokoban")
    for seed in range(20):
        assert env_a.reset(seed)[0] == env_b.reset(seed)[0]


@pytest.mark.parametrize(
    ("task", "seeds", "size", "boxes"), [("sokoban", 200, 6, 1), ("sokoban_8x8", 60, 8, 2)]
)
def test_generated_rooms_are_valid_and_solvable_within_the_budget(task, seeds, size, boxes):
    env = make_env(task)
    lengths = set()
    for seed in range(seeds):
        env.reset(seed)
        room = env.room
        assert (room.height, room.width) == (size, size)
        assert len(room.boxes) == len(room.targets) == boxes
        assert room.player in room.floor and room.player not in room.boxes
        assert all(0 < r < size - 1 and 0 < c < size - 1 for r, c in room.floor)  # closed by the border wall
        assert not room.solved
        plan = solve(room)
        assert plan is not None and 1 <= len(plan) <= 10
        lengths.add(len(plan))
    assert len(lengths) >= 5  # a spread of difficulties, not one trivial puzzle shape


def test_rooms_beyond_the_budget_are_allowed_when_asked():
    env = make_env("sokoban", solvable_within_budget=False, search_depth=200)
    lengths = []
    for seed in range(100):
        env.reset(seed)
        lengths.append(len(solve(env.room)))
    assert max(lengths) > 10


def _brute_force_length(room: Room, limit: int) -> int | None:
    """Fewest moves that solve `room`, by trying every move sequence of each length in turn."""
    for length in range(limit + 1):
        for sequence in itertools.product(MOVES, repeat=length):
            state = room
            for move in sequence:
                state, _ = state.move(move)
            if state.solved:
                return length
    return None


def test_solver_is_optimal_against_brute_force():
    env = make_env("sokoban")
    checked = 0
    for seed in range(60):
        env.reset(seed)
        plan = solve(env.room)
        if len(plan) > 5:
            continue
        assert _brute_force_length(env.room, 5) == len(plan)
        state = env.room
        for move in plan:
            state, _ = state.move(move)
        assert state.solved
        checked += 1
    assert checked >= 20


def test_solver_reports_unsolvable_rooms():
    assert solve(Room.from_text("#####\n#X_P#\n#_O_#\n#####")) is None  # box in a corner
    assert solve(Room.from_text("######\n#P_XO#\n######"), max_moves=1) is None
    assert solve(Room.from_text("######\n#P_XO#\n######"), max_moves=2) == ["Right", "Right"]


def test_optimal_play_earns_the_expected_return():
    env = make_env("sokoban")
    env.reset(seed=4)
    plan = solve(env.room)
    rewards = [env.step(move)[1] for move in plan]
    # every move pays -0.1; the one push onto the target also pays +1 and the +10 bonus
    assert sum(rewards) == pytest.approx(-0.1 * len(plan) + 1 + 10)


def test_image_has_one_tile_per_cell_and_distinct_symbols():
    env = reset_to(CORRIDOR)
    image = env.render_image()
    assert image.shape == (3 * 32, 7 * 32, 3) and image.dtype.name == "uint8"
    tiles = {(r, c): image[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32] for r in range(3) for c in range(7)}
    wall, floor, player, box, target = (
        tiles[(0, 0)],
        tiles[(1, 2)],
        tiles[(1, 1)],
        tiles[(1, 3)],
        tiles[(1, 5)],
    )
    pairs = [(wall, floor), (floor, player), (floor, box), (floor, target), (player, box), (box, target)]
    assert all((a != b).any() for a, b in pairs)
    assert (tiles[(0, 0)] == tiles[(2, 6)]).all()  # same symbol, same pixels


def test_png_decodes_to_the_same_pixels(tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    env = make_env("sokoban_8x8")
    env.reset(seed=3)
    path = env.save_png(tmp_path / "room.png")
    decoded = np.asarray(image_module.open(path).convert("RGB"))
    assert (decoded == env.render_image()).all()
