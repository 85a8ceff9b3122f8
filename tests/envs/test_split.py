"""Validation never scores a problem the policy trained on (issue 28: "a held-out split, stated"): every task that
plays records of a finite set holds out every 10th record for evaluation seeds (envs.split)."""

from __future__ import annotations

import json

import pytest

from envs.episode import Episode
from envs.registry import build_config, env_class
from envs.split import EVAL_SEED_BASE, HOLDOUT_EVERY, is_held_out, record_index
from recipes.runtime.seeds import heldout_seeds, train_prompt_seeds, validation_seeds


@pytest.mark.parametrize("count", [10, 11, 19, 20, 101, 1000])
def test_training_and_evaluation_seeds_play_disjoint_records_that_cover_the_set(count: int) -> None:
    train = {record_index(seed, count) for seed in range(20 * count)}
    evaluation = {record_index(EVAL_SEED_BASE + seed, count) for seed in range(20 * count)}
    assert not train & evaluation
    assert train | evaluation == set(range(count))  # nothing is dropped
    assert evaluation == {i for i in range(count) if is_held_out(i, count)}
    assert len(evaluation) == -(-count // HOLDOUT_EVERY)


def test_a_set_too_small_to_split_is_shared() -> None:
    assert {record_index(seed, 5) for seed in range(50)} == {record_index(EVAL_SEED_BASE + s, 5) for s in range(50)}


def test_the_run_seed_ranges_are_the_splits() -> None:
    assert max(max(train_prompt_seeds(seed, step, 64)) for seed in range(3) for step in range(1, 4)) < EVAL_SEED_BASE
    assert min(validation_seeds(4) + heldout_seeds(4)) >= EVAL_SEED_BASE


def test_a_users_data_file_is_split_for_validation(tmp_path) -> None:
    records = [{"query": f"What is {i} + 1?", "response": f"The answer is: {i + 1}"} for i in range(30)]
    path = tmp_path / "metamath.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    env = env_class("metamathqa")(build_config("metamathqa", {"data_path": str(path)}))

    def question(seed: int) -> str:
        return Episode(env, seed).messages[-1]["content"]

    trained = {question(seed) for seed in train_prompt_seeds(0, 1, 64)}
    validated = {question(seed) for seed in validation_seeds(16)}
    assert not trained & validated
    assert all(any(f"What is {i} + 1?" in q for i in (0, 10, 20)) for q in validated)  # the held-out records
