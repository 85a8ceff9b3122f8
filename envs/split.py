"""Which record of a finite problem set an episode plays, so that validation never scores a problem the policy
trained on.

A task that reads records (a user's data file, or a shipped or generated set: MetaMathQA, SearchQA, WebShop's
goals, DeepCoder) holds out every :data:`HOLDOUT_EVERY`-th record (10%): episodes with an evaluation seed
(:data:`EVAL_SEED_BASE` and above: validation, `orch eval`, the warm start's held-out check; `recipes.runtime.seeds`) play
only held-out records, every training seed plays only the others. A set of fewer than :data:`HOLDOUT_EVERY` records
is too small to split and is shared (a warning-free fallback for toy files; say so where it matters).

    record_index(seed, len(records))  ->  index into records
"""

from __future__ import annotations

EVAL_SEED_BASE = 1 << 30  # training seeds are below, evaluation seeds from here on
HOLDOUT_EVERY = 10


def record_index(seed: int, count: int) -> int:
    """The record of `count` that the episode of `seed` plays (see the module docstring)."""
    if count <= 0:
        raise ValueError("no records to play")
    if count < HOLDOUT_EVERY:
        return seed % count
    held = -(-count // HOLDOUT_EVERY)  # records 0, 10, 20, ...
    if seed >= EVAL_SEED_BASE:
        return (seed % held) * HOLDOUT_EVERY
    k = seed % (count - held)  # the k-th record that is not held out
    return k + k // (HOLDOUT_EVERY - 1) + 1


def is_held_out(index: int, count: int) -> bool:
    """Whether record `index` of `count` is reserved for evaluation episodes."""
    return count >= HOLDOUT_EVERY and index % HOLDOUT_EVERY == 0
