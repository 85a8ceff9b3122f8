"""Benchmark: load R runs x S steps x M metrics from an MLflow SQLite store into one frame.

Compares the bulk SQL reader (analysis.stores.mlflow_sql) with the MlflowClient path (search_runs + one
get_metric_history call per run and metric), checks both give identical frames, and prints both timings.

    .venv/bin/python benchmarks/bench_mlflow_load.py                 # 200 runs x 200 steps x 20 metrics
    .venv/bin/python benchmarks/bench_mlflow_load.py --runs 20 --repeat 1

The generated store is cached under --cache-dir (default /tmp/orch_bench_mlflow) and reused by later runs: it is
written with MLflow's own client (log_batch), which takes a few minutes at the default size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARAMS_PER_RUN = 40
BATCH = 1000  # MLflow's log_batch limit on metrics per call


def generate(path: Path, runs: int, steps: int, metrics: int) -> None:
    """Write the store with MlflowClient.log_batch: `runs` runs, each `metrics` metrics at `steps` steps."""
    import numpy as np
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{partial}")
    experiment = client.create_experiment("bench")
    rng = np.random.default_rng(0)
    names = [f"group{m % 4}/metric_{m:02d}" for m in range(metrics)]
    started = time.perf_counter()
    for r in range(runs):
        run = client.create_run(experiment, tags={"sweep": "bench", "cell": f"{r:06x}", "seed": str(r % 3)})
        params = [Param(f"section{p % 5}.key_{p:02d}", str(rng.integers(0, 10))) for p in range(PARAMS_PER_RUN)]
        values = rng.normal(size=(steps, metrics))
        entries = [
            Metric(name, float(values[s, m]), 1_700_000_000_000 + s, s)
            for s in range(steps)
            for m, name in enumerate(names)
        ]
        client.log_batch(run.info.run_id, params=params, tags=[RunTag("task", "sokoban")])
        for start in range(0, len(entries), BATCH):
            client.log_batch(run.info.run_id, metrics=entries[start : start + BATCH])
        client.set_terminated(run.info.run_id)
        if (r + 1) % 20 == 0:
            print(f"  generated {r + 1}/{runs} runs ({time.perf_counter() - started:.0f} s)", flush=True)
    partial.rename(path)


def timed(repeat: int, load):
    """Run `load` `repeat` times; return (timings, last result)."""
    timings, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = load()
        timings.append(time.perf_counter() - started)
    return timings, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions of the bulk reader")
    parser.add_argument("--client-repeat", type=int, default=1, help="timed repetitions of the client loop")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/orch_bench_mlflow"))
    args = parser.parse_args()

    args.cache_dir.mkdir(parents=True, exist_ok=True)
    path = args.cache_dir / f"store_{args.runs}x{args.steps}x{args.metrics}.db"
    if not path.exists():
        print(f"generating {path} (cached for later runs) ...", flush=True)
        started = time.perf_counter()
        generate(path, args.runs, args.steps, args.metrics)
        print(f"generated in {time.perf_counter() - started:.0f} s")
    uri = f"sqlite:///{path}"

    import pandas.testing

    from analysis.stores.mlflow_store import RunQuery, load_runs

    query = RunQuery(sweep="bench")
    bulk_times, bulk = timed(args.repeat, lambda: load_runs(query, uri, reader="sql"))
    loop_times, loop = timed(args.client_repeat, lambda: load_runs(query, uri, reader="client"))
    pandas.testing.assert_frame_equal(bulk.runs, loop.runs)
    pandas.testing.assert_frame_equal(bulk.metrics, loop.metrics)

    rows = len(bulk.metrics)
    bulk_best, loop_best = min(bulk_times), min(loop_times)
    print(f"store: {args.runs} runs x {args.steps} steps x {args.metrics} metrics = {rows:,} metric rows")
    print(
        f"bulk SQL reader:          best {bulk_best:7.2f} s   median {statistics.median(bulk_times):7.2f} s "
        f"over {len(bulk_times)}"
    )
    print(
        f"get_metric_history loop:  best {loop_best:7.2f} s   median {statistics.median(loop_times):7.2f} s "
        f"over {len(loop_times)}"
    )
    median_ratio = statistics.median(loop_times) / statistics.median(bulk_times)
    print(f"speed-up: {loop_best / bulk_best:.1f}x best vs best, {median_ratio:.1f}x median vs median; frames identical")


if __name__ == "__main__":
    main()
