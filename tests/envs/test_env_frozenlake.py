"""FrozenLake: transition probabilities against gymnasium itself, map generation, solver, rewards."""

from __future__ import annotations

import itertools
import math
import random

import gymnasium
import numpy as np
import pytest

from envs import make_env
from envs.frozenlake.lake import ACTIONS, GOAL, HOLE, generate_lake, move, shortest_path, transition_probs
from orchlib.errors import OrchError

LAKE = ("SFFF", "FHFH", "FFFH", "HFFG")  # gymnasium's classic 4x4 map


def gym_table(lake, slip):
    """gymnasium's P[s][a] as {(state, action): {next_state: (prob, reward, terminated)}}, probs summed."""
    if slip == 0:
        env = gymnasium.make("FrozenLake-v1", desc=list(lake), is_slippery=False)
    else:
        env = gymnasium.make("FrozenLake-v1", desc=list(lake), is_slippery=True, success_rate=1 - slip)
    table = {}
    for state, actions in env.unwrapped.P.items():
        for action, outcomes in actions.items():
            merged = {}
            for prob, nxt, reward, terminated in outcomes:
                if prob == 0:
                    continue
                total = merged.get(nxt, (0.0, reward, terminated))[0] + prob
                merged[nxt] = (total, float(reward), bool(terminated))
            table[state, action] = merged
    return table


def our_table(lake, slip):
    width = len(lake[0])
    table = {}
    for row, col in itertools.product(range(len(lake)), range(width)):
        for index, action in enumerate(ACTIONS):
            merged = {}
            for (r, c), prob in transition_probs(lake, (row, col), action, slip).items():
                letter = lake[r][c]
                absorbing = lake[row][col] in (HOLE, GOAL)
                reward = 1.0 if letter == GOAL and not absorbing else 0.0
                merged[r * width + c] = (prob, reward, letter in (HOLE, GOAL))
            table[row * width + col, index] = merged
    return table


def assert_tables_equal(ours, theirs):
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key].keys() == theirs[key].keys(), key
        for nxt, (prob, reward, terminated) in ours[key].items():
            their_prob, their_reward, their_terminated = theirs[key][nxt]
            assert prob == pytest.approx(their_prob, abs=1e-12), (key, nxt)
            assert (reward, terminated) == (their_reward, their_terminated), (key, nxt)


@pytest.mark.parametrize("slip", [0.0, 2 / 3, 0.2, 0.5, 1.0])
def test_transitions_equal_gymnasium_on_the_classic_map(slip):
    assert_tables_equal(our_table(LAKE, slip), gym_table(LAKE, slip))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slip", [0.0, 2 / 3])
def test_transitions_equal_gymnasium_on_generated_maps(seed, slip):
    env = make_env("frozenlake", slip=slip, size=5 if seed % 2 else 4)
    env.reset(seed)
    assert_tables_equal(our_table(env.lake, slip), gym_table(env.lake, slip))


def test_env_samples_slips_with_the_table_probabilities():
    slip, trials = 0.5, 6000
    env = make_env("frozenlake", slip=slip)
    lake = ("FFF", "FSF", "FFG")
    counts = {}
    for seed in range(trials):
        env.reset(seed, options={"lake": lake})
        env.step("Up")
        counts[env.pos] = counts.get(env.pos, 0) + 1
    expected = {(0, 1): 0.5, (1, 0): 0.25, (1, 2): 0.25}  # intended Up, or Left / Right
    assert counts.keys() == expected.keys()
    for pos, p in expected.items():
        sigma = math.sqrt(trials * p * (1 - p))
        assert abs(counts[pos] - trials * p) < 4 * sigma


def test_no_slip_moves_exactly_as_told_and_walls_hold():
    env = make_env("frozenlake")
    env.reset(0, options={"lake": LAKE})
    for action, pos in [
        ("Left", (0, 0)),
        ("Up", (0, 0)),
        ("Right", (0, 1)),
        ("Right", (0, 2)),
        ("Down", (1, 2)),
    ]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.pos == pos and reward == 0.0 and not terminated and not info["slipped"]
    assert obs.split("\n")[1] == "_OPO"


def test_hole_ends_the_episode_without_reward():
    env = make_env("frozenlake")
    env.reset(0, options={"lake": LAKE})
    env.step("Right")
    obs, reward, terminated, truncated, info = env.step("Down")  # (1, 1) is a hole
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert obs.split("\n")[1] == "_X_O"


def test_goal_pays_one_and_ends_the_episode():
    env = make_env("frozenlake")
    env.reset(0, options={"lake": LAKE})
    rewards = [env.step(action)[1] for action in ["Down", "Down", "Right", "Down", "Right"]]
    obs, reward, terminated, truncated, info = env.step("Right")
    assert rewards == [0.0] * 5
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert obs.split("\n")[3] == "O__√"


def test_maps_are_deterministic_solvable_and_follow_p_frozen():
    holes = cells = 0
    for seed in range(300):
        lake = generate_lake(random.Random(seed), 4, 0.9)
        assert lake == generate_lake(random.Random(seed), 4, 0.9)
        assert lake[0][0] == "S" and lake[3][3] == "G"
        assert shortest_path(lake, (0, 0)) is not None
        holes += sum(row.count("H") for row in lake)
        cells += 14
    # about 10% holes among the 14 free cells (slightly fewer, since unsolvable maps are redrawn)
    assert 0.05 < holes / cells < 0.12


def _brute_force_length(lake, limit):
    for length in range(limit + 1):
        for sequence in itertools.product(ACTIONS, repeat=length):
            pos = (0, 0)
            for action in sequence:
                if lake[pos[0]][pos[1]] in (HOLE, GOAL):
                    break
                pos = move(lake, pos, action)
            if lake[pos[0]][pos[1]] == GOAL:
                return length
    return None


def test_shortest_path_is_optimal_against_brute_force():
    env = make_env("frozenlake", size=3, p_frozen=0.6)
    for seed in range(25):
        env.reset(seed)
        path = shortest_path(env.lake, (0, 0))
        assert len(path) == _brute_force_length(env.lake, 6)


def test_bad_maps_are_rejected():
    env = make_env("frozenlake")
    for lake in [("SFX", "FFG"), ("SF", "FFF"), ("FF", "FG"), ("SS", "FG")]:
        with pytest.raises(OrchError, match="frozenlake map"):
            env.reset(0, options={"lake": lake})


def test_image_shape_and_png(tmp_path):
    image_module = pytest.importorskip("PIL.Image")
    env = make_env("frozenlake")
    env.reset(2)
    image = env.render_image()
    assert image.shape == (128, 128, 3)
    decoded = np.asarray(image_module.open(env.save_png(tmp_path / "lake.png")).convert("RGB"))
    assert (decoded == image).all()


def test_dynamics_seed_decorrelates_samples_of_one_prompt_but_keeps_the_map():
    env = make_env("frozenlake", slip=0.5)
    lakes, endings = set(), set()
    for dynamics_seed in range(40):
        env.reset(3, options={"dynamics_seed": dynamics_seed})
        lakes.add(tuple(env.lake))
        env.step("Down")
        endings.add(env.pos)
    assert len(lakes) == 1  # the prompt (map) is fixed by the seed
    assert len(endings) > 1  # the slips are not
    env.reset(3, options={"dynamics_seed": 5})
    env.step("Down")
    first = env.pos
    env.reset(3, options={"dynamics_seed": 5})
    env.step("Down")
    assert env.pos == first  # and still reproducible
