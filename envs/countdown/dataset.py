"""Loader for real Countdown records: Countdown-Tasks-3to4 (Jiayi-Pan/Countdown-Tasks-3to4 on Hugging Face, the file
RAGEN's `scripts/download_data.py:16-18` fetches) or any JSON (a list), JSONL or Parquet file with `target` (an
integer) and `nums` (a list of positive integers).

The records are selected as RAGEN's environment selects them (`ragen/env/countdown/env.py:46-50`): the first
`max_instances` records of the file (RAGEN's `CountdownEnvConfig.max_instances`, 20,000), then only those whose
target a signed sum of the numbers reaches, each number once (RAGEN's `has_solution`, env.py:24-33: + and - only,
although the answer may use * and /). Which record an episode plays follows orch's split (`envs.split`: evaluation
seeds play the held-out tenth), not RAGEN's `seed % len` over all records.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Any

from envs.countdown.puzzle import Puzzle
from envs.records import read_data_file
from orchlib.errors import OrchError

MIN_COUNT, MAX_COUNT = 2, 6  # numbers per puzzle that orch's solver and scorer take


def signed_sum_reaches(numbers: tuple[int, ...], target: int) -> bool:
    """Whether +-n1 +- n2 ... +- nk equals `target` for some choice of signs (RAGEN's `has_solution`)."""
    return any(sum(sign * n for sign, n in zip(signs, numbers, strict=True)) == target
               for signs in itertools.product((1, -1), repeat=len(numbers)))


def _to_puzzle(record: Any) -> Puzzle | None:
    if not isinstance(record, dict):
        return None
    target, nums = record.get("target"), record.get("nums")
    if isinstance(target, bool) or not isinstance(target, int) or not isinstance(nums, list | tuple):
        return None
    if not MIN_COUNT <= len(nums) <= MAX_COUNT or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in nums):
        return None
    return Puzzle(tuple(nums), target)


@lru_cache(maxsize=4)
def load_puzzles(path: str, max_instances: int) -> tuple[Puzzle, ...]:
    """The puzzles of `path` as RAGEN selects them (see the module docstring), in file order. Raises OrchError for a
    missing or unreadable file, an unknown suffix, or a file with no usable record."""
    records = read_data_file(path, "countdown", ["target", "nums"])
    puzzles = tuple(puzzle for puzzle in map(_to_puzzle, records[:max_instances])
                    if puzzle is not None and signed_sum_reaches(puzzle.numbers, puzzle.target))
    if not puzzles:
        raise OrchError(f"countdown data_path {path}: no record among the first {max_instances} has an integer "
                        f"'target' and {MIN_COUNT}-{MAX_COUNT} positive integers 'nums' that a signed sum reaches")
    return puzzles
