"""The CPU demo profile end to end: tiny model, 8 prompts x 8 samples, 20 steps, warm start cached beforehand.

Builds (or loads from the cache) the warm-started model first and reports its figures separately, then times the
training run and prints the per-phase breakdown of a step (mean seconds per step of every `timing_s/*` metric)
and the validation success curve, all read back from the run's MLflow metrics.

    python benchmarks/bench_train_demo.py [--task sokoban] [--filter top_p] [--steps 20] [override ...]

Extra arguments are Hydra overrides (e.g. `algorithm=grpo trainer.val_size=32`).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from mlflow import MlflowClient

from recipes.config.schema import compose_train_config
from recipes.run.training import run_training
from recipes.torch_trainer.warmstart import model_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="sokoban")
    parser.add_argument("--filter", default="top_p")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench_train_demo_"))
    cfg = compose_train_config([
        "trainer=cpu", "model=tiny", f"task={args.task}", f"filter={args.filter}",
        f"trainer.total_steps={args.steps}", f"mlflow.tracking_uri=sqlite:///{scratch / 'mlflow.db'}",
        f"trainer.checkpoint_dir={scratch / 'checkpoints'}", "trainer.progress=false", *args.overrides,
    ])

    if cfg.infra.threads:  # the warm start on the cell's threads, as in a sweep (more would spin on a loaded machine)
        torch.set_num_threads(cfg.infra.threads)
    start = time.perf_counter()
    folder, warm = model_folder(cfg)  # cached by input hash: the first call trains, later calls load
    print(f"warm start: {folder} ({time.perf_counter() - start:.1f} s now; trained in {warm.get('seconds', 0):.0f} s, "
          f"{warm.get('epochs')} epochs, held-out format validity {warm.get('format_validity', float('nan')):.3f}, "
          f"success {warm.get('success', float('nan')):.3f})")

    start, cpu_start = time.perf_counter(), time.process_time()
    result = run_training(cfg)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(f"run: {result.status} after {result.steps_done} steps in {wall:.1f} s ({wall / 60:.2f} min) wall, "
          f"{cpu:.1f} s CPU ({cpu / 60:.2f} min; about the wall time on a core of its own) -- {result.reason}")
    print(f"machine load average (1/5/15 min) at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    client = MlflowClient(cfg.infra.mlflow.tracking_uri)
    run = client.get_run(result.mlflow_run_id)
    steps = max(1, result.steps_done)
    print("\nper-phase time (mean s per step; val and setup as totals):")
    for key in sorted(k for k in run.data.metrics if k.startswith("timing_s/")):
        points = [m for m in client.get_metric_history(run.info.run_id, key) if m.step >= 1]
        total = sum(m.value for m in points)
        if key == "timing_s/setup":
            total = run.data.metrics[key]
        label = "total" if key in ("timing_s/val", "timing_s/setup") else "per step"
        value = total if label == "total" else total / steps
        print(f"  {key:28s} {value:8.2f}  ({label})")
    print("\nvalidation (step: success rate, mean return, format validity):")
    for metric in sorted(client.get_metric_history(run.info.run_id, "val/success_rate"), key=lambda m: m.step):
        reward = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/reward_mean")}
        valid = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/format_validity")}
        print(f"  {metric.step:3d}: {metric.value:.3f}  {reward[metric.step]:7.3f}  {valid[metric.step]:.3f}")
    kept = [m.value for m in client.get_metric_history(run.info.run_id, "rollout/kept_ratio")]
    if kept:
        print(f"\nkept ratio: mean {sum(kept) / len(kept):.2f}, min {min(kept):.2f}, max {max(kept):.2f}")


if __name__ == "__main__":
    main()
