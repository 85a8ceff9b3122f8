"""Warm start per task: epochs, seconds, held-out format validity, success, and first-turn retrieval against its
chance level (does the warm-started tiny policy's reasoning depend on its prompt?).

Trains (or loads from the cache) each task's warm start of the tiny preset, as `orch train` would, and prints one
row per task. Use an empty cache to time the training: `ORCH_CACHE_DIR=$(mktemp -d)`.

    python benchmarks/bench_warm_start.py [--tasks frozenlake sokoban ...] [--threads 1] [override ...]
"""

from __future__ import annotations

import argparse
import time

import torch

from recipes.config.schema import compose_train_config
from recipes.stats.mi import retrieval_excess, retrieval_p_value
from recipes.torch_trainer.warmstart import (
    RETRIEVAL_SIGNIFICANCE,
    TARGET_RETRIEVAL_OVER_CHANCE,
    model_folder,
    reads_its_input,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["frozenlake", "sokoban", "countdown", "metamathqa",
                                                        "searchqa", "webshop", "deepcoder"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'task':<11} {'epochs':>6} {'seconds':>8} {'validity':>8} {'success':>7} {'retrieval':>9} {'hits':>7} "
          f"{'chance':>6} {'ratio':>5} {'p luck':>8}  reads its input (>= {TARGET_RETRIEVAL_OVER_CHANCE:.0f}x chance, "
          f"p < {RETRIEVAL_SIGNIFICANCE})")
    for task in args.tasks:
        cfg = compose_train_config(["model=tiny", f"task={task}", *args.overrides])
        start = time.perf_counter()
        _, report = model_folder(cfg)
        accuracy, chance, samples = (report["first_turn_retrieval"], report["retrieval_chance"],
                                     int(report.get("first_turn_samples", 0)))
        hits = f"{accuracy * samples:.0f}/{samples}" if samples else "-"
        print(f"{task:<11} {report['epochs']:>6} {report['seconds']:>8.0f} {report['format_validity']:>8.3f} "
              f"{report['success']:>7.3f} {accuracy:>9.3f} {hits:>7} {chance:>6.3f} "
              f"{retrieval_excess(accuracy, chance) + 1.0:>5.1f} {retrieval_p_value(accuracy, chance, samples):>8.1e}  "
              f"{'yes' if reads_its_input(report) else 'NO'}{'' if time.perf_counter() - start > 5 else ' (cached)'}",
              flush=True)

if __name__ == "__main__":
    main()
