"""Where every environment seed and random stream of a run comes from.

Environment seeds live in disjoint ranges: training prompts in [0, 2^30), validation from 2^30, the warm start's
held-out check from 2^30 + 2^29. Within a step, all randomness (prompt seeds, sampling) derives from
(run seed, step), so a resumed run replays exactly what an uninterrupted one would have done.
"""

from __future__ import annotations

import random

import numpy as np

from envs.split import EVAL_SEED_BASE

TRAIN_SEED_LIMIT = EVAL_SEED_BASE
VALIDATION_SEED_BASE = EVAL_SEED_BASE  # records of a finite set: envs.split holds out 10% for these
HELDOUT_SEED_BASE = (1 << 30) + (1 << 29)


def train_prompt_seeds(run_seed: int, step: int, count: int, batch_index: int = 0) -> list[int]:
    """`count` distinct training environment seeds for `step` (and extra generation batch `batch_index`)."""
    rng = np.random.default_rng([run_seed, step, batch_index])
    seeds: list[int] = []
    while len(seeds) < count:
        seed = int(rng.integers(0, TRAIN_SEED_LIMIT))
        if seed not in seeds:
            seeds.append(seed)
    return seeds


# The blinded rows' stream: a key `train_prompt_seeds` never uses (its third entry is a generation batch, a few at most).
BLIND_STREAM = (1 << 31) - 1


def blinded_rows(count: int, strength: float, run_seed: int, step: int) -> list[int]:
    """CONTROL (`control.blind_strength`): which of a step's `count` training rows (trajectories, in the rollout's
    order: prompt-major, a prompt's samples consecutive, as both backends lay them out) have their replies generated
    from the fixed chat -- the one rule both backends use. Exactly `round(strength * count)` rows (Python's round),
    the first of a permutation seeded by (run seed, step): deterministic, so a resumed step blinds the same rows, and
    nested (at one step a stronger plant blinds a superset of a weaker one's rows). Strength 1: every row (the total
    plant); 0: none. Sorted row indices in [0, count)."""
    chosen = round(strength * count)
    if chosen >= count:
        return list(range(count))
    rng = np.random.default_rng([run_seed, step, BLIND_STREAM])
    return sorted(int(row) for row in rng.permutation(count)[:chosen])


def validation_seeds(count: int) -> list[int]:
    """The fixed validation episodes (the same at every validation, disjoint from training)."""
    return [VALIDATION_SEED_BASE + index for index in range(count)]


def heldout_seeds(count: int) -> list[int]:
    """Episodes for the warm start's format-validity check (disjoint from training and validation)."""
    return [HELDOUT_SEED_BASE + index for index in range(count)]


def seed_everything(*key: int) -> None:
    """Seed torch, numpy and random from `key` (e.g. (run_seed, step))."""
    import torch  # here, not at the top: preflight and the sweep planner read the seeds without torch (~2 s)

    seed = int(np.random.SeedSequence(list(key)).generate_state(1)[0])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
