"""Warm start per task: epochs, seconds, held-out format validity, success, and first-turn retrieval against its
chance level (does the warm-started tiny policy's reasoning depend on its prompt?).

Trains (or loads from the cache) each task's warm start of the tiny preset, as `orch train` would, and prints one
row per task, then each trained warm start's CPU seconds by phase (its process's CPU time, which a loaded machine
inflates far less than wall time: training epochs, held-out evaluations, the rest) with its epochs' losses and which
were evaluated; FrozenLake's (README command 1's) against its budget (issue 59). Use an empty cache to time the
training: `ORCH_CACHE_DIR=$(mktemp -d)`. `--threads` is torch's thread count for the held-out evaluations and the
rest; the training epochs run each op on one thread whatever it is, an optimiser step's shards in as many threads
as the cores this process may use, at most `WARM_START_SHARDS` (`warm_start_workers`), as in a sweep's cells.

    python benchmarks/bench_warm_start.py [--tasks frozenlake sokoban ...] [--threads 1] [override ...]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from recipes.config.schema import compose_train_config
from recipes.stats.mi import retrieval_excess, retrieval_p_value
from recipes.torch_trainer.warmstart import (
    RETRIEVAL_SIGNIFICANCE,
    TARGET_RETRIEVAL_OVER_CHANCE,
    model_folder,
    reads_its_input,
    warm_start_workers,
)

# README command 1's FrozenLake warm start within 40 s of wall time on an idle 2-core machine (issue 59). Its training
# runs on two cores (WARM_START_SHARDS), so the budget is wall seconds: CPU seconds by phase are printed beside it.
BUDGET = {"frozenlake": {"wall": 40.0}}


def phases(task: str, report: dict) -> list[str]:
    """The warm start's wall seconds against the task's budget where it has one, its CPU seconds by phase, and its
    epochs."""
    cpu = report.get("cpu_seconds")
    if not cpu:
        return [f"  {task}: no CPU seconds recorded (a warm start cached before they were)"]
    budget = BUDGET.get(task, {})
    rest = cpu["total"] - cpu["training"] - cpu["evaluations"]
    limit = budget.get("wall")
    said = "" if limit is None else f"   budget {limit:5.0f} s  {'within' if report['seconds'] <= limit else 'OVER'}"
    lines = [f"  {task} {'wall':<12}{report['seconds']:7.1f} s{said}"]
    for phase, seconds in (("training", cpu["training"]), ("evaluations", cpu["evaluations"]), ("rest", rest),
                           ("total", cpu["total"])):
        lines.append(f"  {task} {phase:<12}{seconds:7.1f} CPU s")
    evaluated = {entry["epoch"]: entry for entry in report["history"]}
    for entry in report.get("trained", []):
        figures = evaluated.get(entry["epoch"])
        seen = ("not evaluated" if figures is None else
                f"validity {figures['format_validity']:.3f}, retrieval {figures['first_turn_retrieval']:.3f}, "
                f"evaluated in {figures.get('eval_cpu_seconds', float('nan')):.1f} CPU s")
        lines.append(f"    epoch {entry['epoch']}: loss {entry['loss']:.3f} (halves {entry['loss_first_half']:.3f}, "
                     f"{entry['loss_second_half']:.3f}), {entry['train_cpu_seconds']:.1f} CPU s; {seen}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["frozenlake", "sokoban", "countdown", "metamathqa",
                                                        "searchqa", "webshop", "deepcoder"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the held-out evaluations (training: one per shard, see above)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'task':<11} {'epochs':>6} {'seconds':>8} {'validity':>8} {'success':>7} {'retrieval':>9} {'hits':>7} "
          f"{'chance':>6} {'ratio':>5} {'p luck':>8}  reads its input (>= {TARGET_RETRIEVAL_OVER_CHANCE:.0f}x chance, "
          f"p < {RETRIEVAL_SIGNIFICANCE})")
    trained = []
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
        trained.append((task, report))
    print(f"\nCPU seconds by phase (training's shards in {warm_start_workers()} thread(s), evaluations on "
          f"{args.threads}; load average {os.getloadavg()[0]:.1f} at the end):")
    for task, report in trained:
        print("\n".join(phases(task, report)))

if __name__ == "__main__":
    main()
