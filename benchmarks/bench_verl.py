"""The verl backend against the torch backend on the same tiny setting, and its compute saving from filtering.

    python benchmarks/bench_verl.py [--steps 6] [--model micro|tiny]

1. step time: GRPO on Countdown, 4 prompts x 4 samples, the same model and settings on both backends; mean of
   `timing_s/step` over the steps after the first (wall time, both cores), and the ratio verl / torch;
2. start-up: the verl run's wall time before its first step (imports, Ray, workers, rollout server) and the torch
   run's (`timing_s/setup`);
3. the filter's saving on verl: `timing_s/update_actor` and `rollout/update_trajectories` at kept ratios 1, 1/2
   and 1/4 (top_k with zero-variance groups eligible, so the ratio holds even when rewards do not vary).

Prints a table; writes nothing outside a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MICRO = ["model.preset.hidden_size=32", "model.preset.num_hidden_layers=1", "model.preset.num_attention_heads=2",
         "model.preset.num_key_value_heads=1", "model.preset.intermediate_size=64"]
BASE = ["trainer=test", "task=countdown", "algorithm=grpo", "model.warm_start.enabled=false",
        "trainer.samples_per_prompt=4", "trainer.prompts_per_step=4", "trainer.mini_batch_size=4",
        "trainer.max_response_tokens=32", "trainer.val_every=0", "trainer.dump_every=0", "trainer.save_every=0"]


def train(overrides: list[str], folder: Path) -> tuple[dict[str, list[float]], float]:
    """Run one training; (metric histories of interest, wall seconds)."""
    from mlflow import MlflowClient

    from recipes.config.schema import compose_train_config
    from recipes.run.training import run_training

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    started = time.perf_counter()
    result = run_training(compose_train_config([*overrides, f"mlflow.tracking_uri={uri}",
                                                f"trainer.checkpoint_dir={folder / 'ckpt'}"]))
    wall = time.perf_counter() - started
    client = MlflowClient(uri)
    keys = ("timing_s/step", "timing_s/update_actor", "rollout/update_trajectories", "rollout/kept_ratio",
            "timing_s/setup")
    return {key: [m.value for m in sorted(client.get_metric_history(result.mlflow_run_id, key),
                                          key=lambda m: m.step)] for key in keys}, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--model", choices=("micro", "tiny"), default="micro")
    args = parser.parse_args()
    common = [*BASE, f"trainer.total_steps={args.steps}", *(MICRO if args.model == "micro" else ["model=tiny"])]
    with tempfile.TemporaryDirectory() as scratch:
        os.environ.setdefault("ORCH_CACHE_DIR", str(Path(scratch) / "cache"))
        rows = []
        for backend in ("torch", "verl"):
            folder = Path(scratch) / backend
            folder.mkdir()
            metrics, wall = train([*common, f"backend={backend}", "filter=none"], folder)
            steps = metrics["timing_s/step"]
            rows.append((backend, statistics.mean(steps[1:] or steps), steps[0], wall - sum(steps),
                         statistics.mean(metrics["timing_s/update_actor"] or [float("nan")])))
        print(f"step time, {args.model} model, GRPO Countdown 4x4, {args.steps} steps (wall s):")
        print(f"{'backend':8} {'step (mean, after 1st)':>24} {'1st step':>9} {'start-up':>9} {'update_actor':>13}")
        for backend, mean, first, startup, update in rows:
            print(f"{backend:8} {mean:24.3f} {first:9.3f} {startup:9.1f} {update:13.3f}")
        print(f"ratio verl / torch (step): {rows[1][1] / rows[0][1]:.2f}")
        print("\nfilter on verl: actor-update time against the kept ratio")
        print(f"{'kept':>6} {'update trajectories':>20} {'update_actor s':>15} {'step s':>8}")
        for value in (1.0, 0.5, 0.25):
            folder = Path(scratch) / f"kept-{value}"
            folder.mkdir()
            metrics, _ = train([*common, "backend=verl", "filter=top_k", f"filter.value={value}",
                                "filter.include_zero=true"], folder)
            print(f"{statistics.mean(metrics['rollout/kept_ratio']):6.2f} "
                  f"{statistics.mean(metrics['rollout/update_trajectories']):20.1f} "
                  f"{statistics.mean(metrics['timing_s/update_actor'][1:]):15.3f} "
                  f"{statistics.mean(metrics['timing_s/step'][1:]):8.3f}")


if __name__ == "__main__":
    main()
