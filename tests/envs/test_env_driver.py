"""The batch driver end to end: scripted policies through the chat protocol, rewards, records, batching."""

from __future__ import annotations

import math
import random

import pytest

from envs import Trajectory, make_env, run_episodes
from envs.protocol import format_response
from envs.sokoban.solver import solve
from orchlib.errors import OrchError

SEEDS = list(range(12))


def test_solver_policy_solves_every_sokoban_episode(solver_policy):
    trajectories = run_episodes("sokoban", {}, SEEDS, solver_policy("sokoban"))
    env = make_env("sokoban")
    for seed, trajectory in zip(SEEDS, trajectories, strict=True):
        env.reset(seed)
        optimal = len(solve(env.room))  # moves needed, from a fresh env of the same seed
        assert isinstance(trajectory, Trajectory)
        assert trajectory.seed == seed and trajectory.task == "sokoban"
        assert trajectory.success
        assert trajectory.num_turns == math.ceil(optimal / 2)
        assert trajectory.episode_return == pytest.approx(-0.1 * optimal + 1 + 10)
        assert all(turn.format_valid for turn in trajectory.turns)
        assert sum(len(turn.actions) for turn in trajectory.turns) == optimal


def test_chat_structure_and_turn_prompts(solver_policy):
    (trajectory,) = run_episodes("sokoban", {}, [7], solver_policy("sokoban"))
    roles = [message["role"] for message in trajectory.messages]
    assert roles[0] == "system" and roles[-1] == "assistant"
    assert roles[1:] == ["user", "assistant"] * trajectory.num_turns
    for index, turn in enumerate(trajectory.turns):
        assert turn.prompt_messages == trajectory.messages[: 2 + 2 * index]
        assert trajectory.messages[2 + 2 * index]["content"] == turn.response
        assert turn.reasoning == "replaying the solver"
    if trajectory.num_turns > 1:
        second_user = trajectory.messages[3]["content"]
        assert second_user.startswith("Turn 2:")
        assert f"Reward of your previous turn: {round(trajectory.turns[0].reward, 4):g}" in second_user


def test_record_for_the_rollout_table(solver_policy):
    (trajectory,) = run_episodes("countdown", {}, [3], solver_policy("countdown"))
    record = trajectory.to_record()
    assert record["prompt_id"] == record["seed"] == 3
    assert record["reward"] == 1.0 and record["success"] is True and record["turns"] == 1
    assert record["prompt"] == trajectory.messages[1]["content"]
    assert record["response"] == trajectory.messages[2]["content"]
    assert record["response_length"] == len(trajectory.messages[2]["content"])
    assert record["format_valid"] is True
    (turn,) = record["turn_log"]  # every turn: what it saw, what it said and did, what it earned
    assert turn == {"observation": trajectory.messages[1]["content"], "response": trajectory.messages[2]["content"],
                    "actions": trajectory.turns[0].actions, "reward": 1.0, "format_valid": True}


def test_policy_is_called_with_the_active_batch_only(solver_policy):
    sizes = []
    inner = solver_policy("sokoban")

    def policy(histories):
        sizes.append(len(histories))
        return inner(histories)

    trajectories = run_episodes("sokoban", {}, SEEDS, policy)
    assert sizes[0] == len(SEEDS)
    assert sizes == sorted(sizes, reverse=True)
    assert len(sizes) == max(t.num_turns for t in trajectories)
    # after round k, only episodes that needed more than k turns are still asked
    assert sizes == [sum(t.num_turns > k for t in trajectories) for k in range(len(sizes))]


def test_a_policy_that_takes_rows_is_told_each_historys_episode(solver_policy):
    """`takes_rows` (the planted control blinds some episodes of a batch, `recipes.policy.sampler.BlindSampler`):
    each call names, per history, its episode's index in `seeds`, as episodes finish at different turns."""
    inner = solver_policy("sokoban")
    calls = []

    class Policy:
        takes_rows = True

        def __call__(self, histories, rows):
            calls.append((rows, histories))
            return inner(histories)

    trajectories = run_episodes("sokoban", {}, SEEDS, Policy())
    assert len({len(rows) for rows, _ in calls}) > 1  # some episodes ended before others
    for turn, (rows, histories) in enumerate(calls):
        assert rows == [row for row, t in enumerate(trajectories) if t.num_turns > turn]
        for row, history in zip(rows, histories, strict=True):
            assert history == trajectories[row].messages[: 2 + 2 * turn]


def test_unparsable_replies_cost_the_penalty_every_turn():
    trajectories = run_episodes("sokoban", {}, [0, 1], lambda hs: ["I would go up"] * len(hs))
    for trajectory in trajectories:
        assert trajectory.num_turns == 5 and not trajectory.success
        assert [turn.reward for turn in trajectory.turns] == [-0.1] * 5
        assert all(
            turn.info["failure"] == "missing_think" and turn.actions == [] for turn in trajectory.turns
        )
        assert "invalid" in trajectory.messages[3]["content"]


def test_format_penalty_and_turn_limit_are_configurable():
    (trajectory,) = run_episodes(
        "frozenlake", {"format_penalty": -0.5}, [0], lambda hs: ["<answer>Up</answer>"] * len(hs), max_turns=2
    )
    assert [turn.reward for turn in trajectory.turns] == [-0.5, -0.5]


def test_extra_actions_are_dropped_and_reported():
    reply = format_response("go", ["Left", "Left", "Left"])
    (trajectory,) = run_episodes("frozenlake", {}, [0], lambda hs: [reply] * len(hs), max_turns=1)
    turn = trajectory.turns[0]
    assert turn.actions == ["Left", "Left"] and turn.info["extra_actions"] == 1 and turn.format_valid


def test_action_budget_ends_the_episode_mid_turn():
    reply = format_response("wait", ["Up", "Up"])
    (trajectory,) = run_episodes("sokoban", {"max_actions": 3}, [0], lambda hs: [reply] * len(hs))
    assert [len(turn.actions) for turn in trajectory.turns] == [2, 1]
    assert trajectory.turns[-1].info["ended"]


def test_invalid_countdown_expression_is_a_format_failure():
    (trajectory,) = run_episodes("countdown", {}, [0], lambda hs: [format_response("", ["2 ** 3"])])
    turn = trajectory.turns[0]
    assert (turn.reward, turn.format_valid, turn.info["failure"]) == (
        pytest.approx(-0.1),
        False,
        "invalid_action",
    )


def test_math_retry_after_incorrect():
    answers = iter(["-1", None])

    def policy(histories):
        (messages,) = histories
        answer = next(answers)
        if answer is None:  # second turn: read the question back and answer it
            env = make_env("metamathqa")
            env.reset(5)
            answer = env.problem.answer
        return [format_response("compute", [answer])]

    (trajectory,) = run_episodes("metamathqa", {}, [5], policy)
    assert [turn.reward for turn in trajectory.turns] == [0.0, 0.5]
    assert trajectory.success and trajectory.episode_return == 0.5
    assert "incorrect" in trajectory.messages[3]["content"]


@pytest.mark.parametrize("task", ["frozenlake", "countdown", "sokoban_8x8"])
def test_solver_policies_succeed_on_other_tasks(task, solver_policy):
    trajectories = run_episodes(task, {}, SEEDS, solver_policy(task))
    assert all(t.success for t in trajectories)


def test_slippery_episodes_are_reproducible_per_seed(solver_policy):
    def run():
        return run_episodes("frozenlake", {"slip": 0.4}, SEEDS, solver_policy("frozenlake"))

    first, second = run(), run()
    assert [t.to_record() for t in first] == [t.to_record() for t in second]
    slips = [info["slipped"] for t in first for turn in t.turns for info in turn.info["env"]]
    assert 0 < sum(slips) < len(slips)


def test_random_policy_runs_are_reproducible():
    def run():
        rng = random.Random(0)
        moves = ["Up", "Down", "Left", "Right"]
        policy = lambda hs: [format_response("?", rng.sample(moves, 2)) for _ in hs]  # noqa: E731
        return [t.to_record() for t in run_episodes("sokoban", {}, SEEDS, policy)]

    assert run() == run()


def test_policy_returning_the_wrong_count_is_an_error():
    with pytest.raises(OrchError, match="1 replies for 2"):
        run_episodes("sokoban", {}, [0, 1], lambda hs: ["x"])


def test_unknown_task_or_key_fails_before_any_episode():
    with pytest.raises(OrchError, match="valid choices"):
        run_episodes("chess", {}, [0], lambda hs: [])
    with pytest.raises(OrchError, match="num_boxes"):
        run_episodes("sokoban", {"boxes": 1}, [0], lambda hs: [])
