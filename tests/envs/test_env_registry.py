"""Registry lookups, config validation errors and the gymnasium-style API contract shared by all tasks."""

from __future__ import annotations

import random

import pytest

import envs.registry as registry
from envs import Env, EnvConfig, env_config_class, list_envs, make_env, register_env
from orchlib.errors import OrchError

TASKS = ["sokoban", "sokoban_8x8", "frozenlake", "countdown", "metamathqa", "searchqa", "deepcoder"]


def test_all_paper_tasks_are_registered():
    assert set(TASKS) <= set(list_envs())


def test_unknown_environment_lists_the_valid_ones():
    with pytest.raises(OrchError) as err:
        make_env("sokobann")
    message = str(err.value)
    assert "sokobann" in message and "valid choices" in message
    assert all(task in message for task in TASKS)
    assert "\n" not in message


def test_unknown_config_key_lists_the_valid_keys():
    with pytest.raises(OrchError) as err:
        make_env("sokoban", boxes=2)
    message = str(err.value)
    assert "'boxes'" in message and "num_boxes" in message and "search_depth" in message


@pytest.mark.parametrize(
    ("task", "config", "key"),
    [
        ("sokoban", {"size": 2}, "size"),
        ("sokoban", {"size": 4, "num_boxes": 4}, "num_boxes"),
        ("frozenlake", {"slip": 1.5}, "slip"),
        ("frozenlake", {"p_frozen": 0.0}, "p_frozen"),
        ("countdown", {"min_count": 5, "max_count": 3}, "min_count"),
        ("metamathqa", {"max_turns": 0}, "max_turns"),
    ],
)
def test_bad_config_values_name_the_key(task, config, key):
    with pytest.raises(OrchError) as err:
        make_env(task, **config)
    assert key in str(err.value)
    assert "\n" not in str(err.value)


def test_config_class_gives_defaults_of_the_paper():
    sokoban = env_config_class("sokoban")()
    assert (sokoban.size, sokoban.num_boxes, sokoban.max_actions, sokoban.max_turns) == (6, 1, 10, 5)
    assert sokoban.max_actions_per_turn == 2 and sokoban.format_penalty == -0.1
    large = env_config_class("sokoban_8x8")()
    assert (large.size, large.num_boxes) == (8, 2)
    lake = env_config_class("frozenlake")()
    assert (lake.size, lake.p_frozen, lake.slip) == (4, 0.9, 0.0)
    assert env_config_class("countdown")().max_turns == 1


@pytest.mark.parametrize("task", TASKS)
def test_reset_is_deterministic_and_seeds_differ(task):
    env = make_env(task)
    first = env.reset(seed=11)[0]
    assert env.reset(seed=11)[0] == first
    assert len({make_env(task).reset(seed=s)[0] for s in range(8)}) > 1


@pytest.mark.parametrize("task", TASKS)
def test_protocol_attributes(task):
    env = make_env(task)
    assert env.name == task
    assert env.system_prompt.startswith("You're a helpful assistant. ")
    assert env.instruction in env.system_prompt
    assert env.max_turns >= 1 and env.max_actions_per_turn >= 1
    assert env.answer_format
    assert env.valid_actions is None or len(env.valid_actions) == 4


@pytest.mark.parametrize("task", TASKS)
def test_step_after_the_end_is_refused(task):
    env = make_env(task, max_actions=1, max_turns=1)
    env.reset(seed=0)
    action = env.valid_actions[0] if env.valid_actions else "1"
    *_, terminated, truncated, _ = env.step(action)
    assert terminated or truncated
    with pytest.raises(OrchError):
        env.step(action)


def test_seed_must_be_an_integer():
    with pytest.raises(OrchError):
        make_env("sokoban").reset(seed="3")  # type: ignore[arg-type]


def test_unknown_reset_option_is_rejected():
    with pytest.raises(OrchError, match="room"):
        make_env("sokoban").reset(seed=0, options={"rooom": "#"})


def test_register_env_adds_a_custom_task(monkeypatch):
    monkeypatch.setattr(registry.ENVS, "entries", dict(registry.ENVS.entries))  # keep the test task out of the others

    class CoinConfig(EnvConfig):
        max_turns: int = 1

    @register_env("test_coin")
    class CoinEnv(Env):
        config_class = CoinConfig
        valid_actions = ["Heads", "Tails"]
        answer_format = "Heads or Tails"
        instruction = "Guess the coin."

        def _reset(self, rng: random.Random, options: dict) -> None:
            self.coin = rng.choice(self.valid_actions)

        def _step(self, action: str) -> tuple[float, bool, dict]:
            return float(action == self.coin), True, {"success": action == self.coin}

        def render_text(self) -> str:
            return "a coin is in the air"

    assert "test_coin" in list_envs()
    env = make_env("test_coin")
    env.reset(seed=1)
    _, reward, terminated, _, info = env.step(env.coin)
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    with pytest.raises(OrchError, match="already registered"):
        register_env("test_coin")(type("Other", (CoinEnv,), {}))
