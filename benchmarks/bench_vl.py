"""Training-step time of the tiny models with text and with image observations (the vision-language cost on CPU).

Three runs of the torch backend on the same task and batch shape, warm start off (random models: replies run to
the response cap, the worst case), `--steps` steps each: `model=tiny` reading text, `model=tiny_vl` reading text,
and `model=tiny_vl` reading images (`task.env.observation=image`). Prints per run the mean wall seconds per step
and of its main phases (MLflow `timing_s/*`, steps 1..N), and the mean generated (loss) tokens per trajectory.

    python benchmarks/bench_vl.py [--task sokoban] [--prompts 4] [--samples 4] [--steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

RUNS = {
    "tiny, text": ["model=tiny"],
    "tiny_vl, text": ["model=tiny_vl"],
    "tiny_vl, image": ["model=tiny_vl", "task.env.observation=image"],
}
PHASES = ("gen", "old_log_prob", "values", "update_critic", "update_actor", "step")


def mean_metric(client: Any, run_id: str, key: str) -> float:
    """Mean of a metric over steps 1..N (step 0 is setup)."""
    points = [metric.value for metric in client.get_metric_history(run_id, key) if metric.step >= 1]
    return float(np.mean(points)) if points else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="sokoban", help="a grid task (sokoban, frozenlake)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()

    from mlflow import MlflowClient

    from recipes.config.schema import compose_train_config
    from recipes.run.training import run_training

    print(f"task {args.task}, {args.prompts} prompts x {args.samples} samples, {args.steps} steps, "
          f"threads {args.threads}, warm start off, filter none (every trajectory updates)")
    print(f"{'run':<16}" + "".join(f"{phase + ' s':>16}" for phase in PHASES) + f"{'gen tok/traj':>13}")
    with tempfile.TemporaryDirectory() as scratch:
        uri = f"sqlite:///{Path(scratch) / 'mlflow.db'}"
        for name, overrides in RUNS.items():
            cfg = compose_train_config([
                f"task={args.task}", *overrides, "trainer=cpu", "filter=none", "model.warm_start.enabled=false",
                f"trainer.prompts_per_step={args.prompts}", f"trainer.samples_per_prompt={args.samples}",
                f"trainer.mini_batch_size={args.prompts * args.samples}", f"trainer.total_steps={args.steps}",
                "trainer.val_every=0", "trainer.dump_every=0", "trainer.save_every=0", "trainer.progress=false",
                f"trainer.threads={args.threads}", f"mlflow.tracking_uri={uri}",
                f"trainer.checkpoint_dir={Path(scratch) / name.replace(', ', '-')}",
            ])
            run_id = run_training(cfg).mlflow_run_id
            mean = partial(mean_metric, MlflowClient(uri), run_id)
            tokens = mean("rollout/update_tokens") / mean("rollout/update_trajectories")
            row = "".join(f"{mean(f'timing_s/{phase}'):>16.2f}" for phase in PHASES)
            print(f"{name:<16}{row}{tokens:>13.0f}")


if __name__ == "__main__":
    main()
