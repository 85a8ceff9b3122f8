"""What the MI diagnostics add to a run: the CPU demo profile with and without `hooks=[collapse]`, same seed.

The paper's setting: 64 samples per set (`first_turn` and `trajectory`), MI at step 1 and every 5 steps. For each
task the warm start is built (or loaded from the cache) first, then the same run (`trainer=cpu model=tiny`, N steps)
goes once without the hook and once with it. The hook only reads the batch, so both runs train the same policy on
the same rollouts. Printed per task: both runs' wall time, the diagnostics' own time (the sum of
`timing_s/diagnostics`), the MI steps' mean cost, and three ratios:

* own      -- diagnostics / (run wall - diagnostics): what the hook adds to this run, from the hooked run alone;
* wall     -- hooked wall / plain wall - 1: the same, from two runs (noisy on a shared machine);
* 20 steps -- the own ratio projected to the demo's 20 steps (MI at steps 1, 5, 10, 15, 20) from the mean MI-step
  cost and the mean step time without diagnostics;
* long run -- the same projection for a long run, one MI step in every 5: the figure the <= 10% target is about.

    python benchmarks/bench_diagnostics_cost.py [--tasks sokoban,frozenlake] [--steps 10] [--grad-every K]
        [override ...]

Extra arguments are Hydra overrides for both runs (e.g. `diagnostics.method=naive`, or `backend=verl` for veRL's own
trainer on this CPU). `--grad-every K` adds the gradient split by reward-variance bucket every K steps to the hooked
run (the paper's gradient analysis; off by default, as in the paper's sweeps). Peak memory is each run's largest
`perf/max_memory_allocated_gb` (on CPU: the peak resident set of the process that logs it -- the driver on torch, the
actor worker on veRL).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

from mlflow import MlflowClient

from recipes.config.schema import compose_train_config
from recipes.run.tracking import PEAK_MEMORY_METRIC
from recipes.run.training import run_training
from recipes.torch_trainer.warmstart import model_folder

PAPER = ["hooks=[collapse]", "diagnostics.num_samples=64", "diagnostics.mi_every=5"]


def timed_run(task: str, steps: int, overrides: list[str]) -> tuple[float, dict[str, dict[int, float]]]:
    """Wall seconds of one run and its `timing_s/step`, `timing_s/diagnostics` and peak memory by step."""
    scratch = Path(tempfile.mkdtemp(prefix="bench_diagnostics_cost_"))
    cfg = compose_train_config([
        "trainer=cpu", "model=tiny", f"task={task}", f"trainer.total_steps={steps}",
        f"mlflow.tracking_uri=sqlite:///{scratch / 'mlflow.db'}", f"trainer.checkpoint_dir={scratch / 'checkpoints'}",
        "trainer.progress=false", *overrides,
    ])
    model_folder(cfg)  # the warm start, cached by input hash: trained here on the first call only
    start = time.perf_counter()
    result = run_training(cfg)
    wall = time.perf_counter() - start
    client = MlflowClient(cfg.infra.mlflow.tracking_uri)
    series = {
        key: {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, f"timing_s/{key}")
              if m.step >= 1}
        for key in ("step", "diagnostics")
    }
    series["memory"] = {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, PEAK_MEMORY_METRIC)}
    return wall, series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="sokoban,frozenlake")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--grad-every", type=int, default=0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    print(f"{'task':>10} {'plain s':>8} {'hooked s':>9} {'diag s':>7} {'MI steps':>8} {'s/MI step':>9} "
          f"{'own':>6} {'wall':>6} {'20 steps':>8} {'long run':>8} {'GB plain':>8} {'GB hooked':>9}  load avg")
    hooked_overrides = [*PAPER, f"diagnostics.grad_every={args.grad_every}", *args.overrides]
    for task in args.tasks.split(","):
        plain, plain_series = timed_run(task, args.steps, args.overrides)
        hooked, series = timed_run(task, args.steps, hooked_overrides)
        diagnostics = sum(series["diagnostics"].values())
        mi_steps = [step for step in series["diagnostics"] if step == 1 or step % 5 == 0]
        per_mi_step = diagnostics / max(1, len(mi_steps))
        base_step = (sum(series["step"].values()) - diagnostics) / len(series["step"])
        projected = 5 * per_mi_step / (20 * base_step)
        long_run = per_mi_step / (5 * base_step)
        print(f"{task:>10} {plain:8.1f} {hooked:9.1f} {diagnostics:7.1f} {len(mi_steps):8d} {per_mi_step:9.1f} "
              f"{diagnostics / (hooked - diagnostics):6.1%} {hooked / plain - 1:6.1%} {projected:8.1%} {long_run:8.1%} "
              f"{max(plain_series['memory'].values(), default=math.nan):8.2f} "
              f"{max(series['memory'].values(), default=math.nan):9.2f}  "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
