"""DAPO's dynamic sampling, the one rule of every backend (`recipes.stats.dynamic_sampling.gather_groups`: veRL's
DAPO recipe's gather and cut), on generation batches whose answer is known. `SCENARIO` is the step every backend's
caller is tested on too (tests/recipes/torch_trainer/test_training.py, tests/recipes/verl/test_verl_parts.py,
tests/recipes/verl/test_verl_v1_ports.py): the same groups land in the update batch, with the same metrics."""

from __future__ import annotations

import numpy as np
import pytest

from recipes.stats.dynamic_sampling import GEN_BATCHES, GROUPS, gather_groups

# 4 generation batches of G = 4 prompts x K = 2 samples: each group's episode returns (zero variance: a, h, k, c, m,
# n, p). The step needs 4 groups with variance: batch 1 gives b, batch 2 d, batch 3 e and f (g is cut: the first
# gathered first); batch 4 is never generated.
SCENARIO = [
    {"a": [0.0, 0.0], "b": [0.0, 1.0], "h": [-0.1, -0.1], "k": [0.5, 0.5]},
    {"c": [0.0, 0.0], "d": [0.0, 1.0], "m": [1.0, 1.0], "n": [0.0, 0.0]},
    {"e": [1.0, 0.0], "f": [0.5, 0.0], "g": [1.0, 0.0], "p": [0.0, 0.0]},
    {"q": [0.0, 1.0], "r": [0.0, 1.0], "s": [0.0, 1.0], "t": [0.0, 1.0]},
]
PROMPTS, MAX_EXTRA = 4, 3  # prompts_per_step; algorithm.max_extra_gen_batches (veRL's max_num_gen_batches = 4)
UPDATE_GROUPS = ["b", "d", "e", "f"]
UPDATE_RETURNS = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0]
METRICS = {GEN_BATCHES: 3.0, GROUPS: 4.0}


def rows(groups: dict[str, list[float]]) -> tuple[list[str], list[float]]:
    """A generation batch's rows (a group's samples consecutive, as every backend has them): keys and returns."""
    return ([key for key, returns in groups.items() for _ in returns],
            [value for returns in groups.values() for value in returns])


def run(scenario: list[dict[str, list[float]]], prompts: int = PROMPTS, cap: int = MAX_EXTRA + 1):
    drawn: list[int] = []

    def batches():
        for index, groups in enumerate(scenario):
            drawn.append(index)
            keys, returns = rows(groups)
            yield keys, returns, keys

    gathered = gather_groups(batches(), prompts, cap)
    kept = [key for keys, keep in gathered.parts for key, k in zip(keys, keep, strict=True) if k]
    return gathered, list(dict.fromkeys(kept)), drawn


def test_groups_with_variance_are_gathered_across_batches_and_cut_to_the_update_size() -> None:
    gathered, kept, drawn = run(SCENARIO)
    assert kept == UPDATE_GROUPS and drawn == [0, 1, 2]  # batch 4 is never generated
    assert gathered.metrics() == METRICS and gathered.gen_batches == 3 and gathered.groups == 4
    assert [keep.tolist() for _, keep in gathered.parts] == [
        [False, False, True, True, False, False, False, False],
        [False, False, True, True, False, False, False, False],
        [True, True, True, True, False, False, False, False],  # e, f; g cut
    ]


def test_the_cap_reached_short_trains_on_what_was_gathered() -> None:
    """veRL's recipe raises there (dapo_ray_trainer.py:284-290); orch keeps the groups with variance it has."""
    gathered, kept, drawn = run(SCENARIO, cap=2)
    assert kept == ["b", "d"] and drawn == [0, 1]
    assert gathered.metrics() == {GEN_BATCHES: 2.0, GROUPS: 2.0}


def test_nothing_with_variance_up_to_the_cap_keeps_the_first_batch_whole() -> None:
    flat = [{key: [1.0, 1.0] for key in groups} for groups in SCENARIO]
    gathered, kept, drawn = run(flat)
    assert kept == ["a", "b", "h", "k"] and drawn == [0, 1, 2, 3]
    assert gathered.metrics() == {GEN_BATCHES: 4.0, GROUPS: 0.0}
    assert [keep.all() for _, keep in gathered.parts] == [True, False, False, False]
    assert not any(keep.any() for _, keep in gathered.parts[1:])


def test_a_full_first_batch_draws_no_other() -> None:
    gathered, kept, drawn = run(SCENARIO[3:])
    assert kept == ["q", "r", "s", "t"] and drawn == [0] and gathered.metrics() == {GEN_BATCHES: 1.0, GROUPS: 4.0}
    gathered, kept, drawn = run(SCENARIO, prompts=1)
    assert kept == ["b"] and drawn == [0] and gathered.metrics() == {GEN_BATCHES: 1.0, GROUPS: 1.0}


def test_rows_need_not_be_consecutive() -> None:
    ids, returns = ["x", "y", "x", "y", "z", "z"], [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    gathered = gather_groups(iter([("batch", returns, ids)]), 3, 1)
    assert gathered.parts[0][0] == "batch" and gathered.parts[0][1].tolist() == [True, False, True, False, False,
                                                                                   False]
    assert gathered.groups == 1


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        gather_groups(iter([]), 0, 1)
    with pytest.raises(ValueError, match="empty"):
        gather_groups(iter([]), 1, 1)
    assert np.asarray(run(SCENARIO, cap=1)[1]).tolist() == ["b"]
