"""Write the SYNTHETIC example rollout batches shipped in examples/ (reproducible: fixed seeds).

These are not results of training; they are drawn from simple reward models shaped like the paper's tasks, so that
`orch predict-filter-gain` and `orch filter` have something realistic to chew on out of the box:

* ``sokoban_bimodal.parquet`` -- 3 steps x 8 prompts x 16 trajectories. Sokoban-like returns (failure about -1,
  success about +10): three prompts in eight are "learnable" (success probability 0.3-0.6, high reward variance), the
  rest are nearly always failed (low or zero variance). Bimodal RV -> a high std(RV)/mean(RV) ratio.
* ``frozenlake_uniform.jsonl`` -- 1 step x 8 prompts x 16 trajectories. Binary FrozenLake-like rewards with a
  success probability between 0.4 and 0.6 on every prompt: uniform RV -> a ratio near 0.

Run: ``python scripts/make_example_batches.py [OUT_DIR]`` (default: examples/).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recipes.stats.rollouts import write_rollout_batch  # noqa: E402

PROMPTS, SAMPLES = 8, 16


def sokoban_return(rng: np.random.Generator, solved: bool) -> tuple[float, int]:
    """Episode return and turns: -0.1 per action, +1 box on target, +10 solved; failures wander for 10 actions."""
    if solved:
        actions = int(rng.integers(3, 11))
        return round(-0.1 * actions + 1.0 + 10.0, 2), (actions + 1) // 2
    penalty = -0.1 * float(rng.integers(0, 3))  # occasional format penalties
    bonus = float(rng.choice([0.0, 0.0, 0.0, 1.0]))  # sometimes a box ends on a target (+1)
    return round(-1.0 + penalty + bonus, 2), 5


def sokoban_bimodal(rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for step in (1, 2, 3):
        for prompt in range(PROMPTS):
            p_success = rng.uniform(0.3, 0.6) if prompt % 3 == 0 else rng.choice([0.0, 0.02])
            for sample in range(SAMPLES):
                solved = bool(rng.random() < p_success)
                reward, turns = sokoban_return(rng, solved)
                rows.append(
                    {"step": step, "prompt_id": f"sokoban-seed{1000 * step + prompt}", "sample": sample,
                     "reward": reward, "success": solved, "turns": turns,
                     "response_length": int(rng.integers(40, 400))}
                )
    return pd.DataFrame(rows)


def frozenlake_uniform(rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for prompt in range(PROMPTS):
        p_success = rng.uniform(0.4, 0.6)
        for sample in range(SAMPLES):
            solved = bool(rng.random() < p_success)
            rows.append(
                {"step": 1, "prompt_id": f"frozenlake-seed{prompt}", "sample": sample, "reward": float(solved),
                 "success": solved, "turns": int(rng.integers(1, 6)), "response_length": int(rng.integers(40, 300))}
            )
    return pd.DataFrame(rows)


def main(out_dir: Path) -> None:
    write_rollout_batch(sokoban_bimodal(np.random.default_rng(20260)), out_dir / "sokoban_bimodal.parquet")
    write_rollout_batch(frozenlake_uniform(np.random.default_rng(20261)), out_dir / "frozenlake_uniform.jsonl")
    print(f"wrote synthetic example batches to {out_dir}/")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "examples")
