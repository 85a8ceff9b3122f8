"""The `observation` key: grid tasks can show their state as an image (a marker in the text, the image on the
turn); text observations are the default and stay exactly as before."""

from __future__ import annotations

import numpy as np
import pytest

from envs import make_env, run_episodes
from envs.protocol import IMAGE_PLACEHOLDER, format_response
from orchlib.errors import OrchError

GRID_TASKS = [("sokoban", 6), ("sokoban_8x8", 8), ("frozenlake", 4)]


def fixed_policy(histories):
    """Ignores the state, so text and image episodes of one seed take the same actions."""
    return [format_response("probing", ["Right", "Down"]) for _ in histories]


def play(task: str, observation: str | None, seed: int = 5):
    config = {} if observation is None else {"observation": observation}
    (trajectory,) = run_episodes(task, config, [seed], fixed_policy)
    return trajectory


@pytest.mark.parametrize(("task", "side"), GRID_TASKS)
def test_image_observation_puts_the_image_on_the_turn(task, side):
    trajectory = play(task, "image")
    users = [m["content"] for m in trajectory.messages if m["role"] == "user"]
    assert len(users) == trajectory.num_turns == len(trajectory.images)
    assert all(f"State:\n{IMAGE_PLACEHOLDER}\nYou have" in text for text in users)
    assert all(text.count(IMAGE_PLACEHOLDER) == 1 for text in users)
    for image in trajectory.images:
        assert image.shape == (side * 32, side * 32, 3) and image.dtype == np.uint8
    env = make_env(task)
    env.reset(5)
    assert np.array_equal(trajectory.turns[0].image, env.render_image())  # the state the first reply saw


@pytest.mark.parametrize(("task", "_"), GRID_TASKS)
def test_image_and_text_transcripts_differ_only_in_the_state(task, _):
    text, image = play(task, "text"), play(task, "image")
    assert [t.reward for t in text.turns] == [t.reward for t in image.turns]
    env = make_env(task)
    env.reset(5)
    states = [env.render_text()]
    for turn in text.turns[:-1]:
        for action in turn.actions:
            env.step(action)
        states.append(env.render_text())
    users = [(m["content"], n["content"]) for m, n in zip(text.messages, image.messages, strict=True)
             if m["role"] == "user"]
    for (text_user, image_user), state in zip(users, states, strict=True):
        assert f"State:\n{state}\nYou have" in text_user
        assert text_user.replace(f"State:\n{state}\n", f"State:\n{IMAGE_PLACEHOLDER}\n") == image_user


@pytest.mark.parametrize("task", ["sokoban", "frozenlake", "countdown", "metamathqa", "searchqa"])
def test_text_observation_is_the_default_and_carries_no_image(task):
    default, explicit = play(task, None), play(task, "text")
    assert default.messages == explicit.messages
    assert default.images == [] and all(turn.image is None for turn in default.turns)
    assert IMAGE_PLACEHOLDER not in "".join(m["content"] for m in default.messages)


def test_the_environment_validates_the_observation_key():
    with pytest.raises(OrchError, match=r"observation: 'image'.*valid choices: text$"):
        make_env("countdown", observation="image")
    with pytest.raises(OrchError, match="valid choices: text, image"):
        make_env("sokoban", observation="video")


def test_train_refuses_image_observations_without_a_vision_language_model(tmp_path, monkeypatch):
    from recipes.config.schema import compose_train_config

    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(OrchError, match=r"task.env.observation: image observations need a vision-language model: "
                                        r"model=tiny_vl \(built in code\), or model=hf model.path=<Qwen2.5-VL folder>"):
        compose_train_config(["task.env.observation=image"])
    (tmp_path / "config.json").write_text("{}")  # a text checkpoint
    with pytest.raises(OrchError, match="task.env.observation: image observations need a vision-language checkpoint; "
                                        ".* has no vision_config"):
        compose_train_config(["model=hf", f"model.path={tmp_path}", "task=frozenlake", "task.env.observation=image"])
