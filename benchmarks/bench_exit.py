"""How long a process that imported what a training job imports (torch, transformers, MLflow) takes to exit, with
and without `orchlib.shutdown.before_exit` (gc.freeze) as its last call. Runs each variant `--repeat` times,
alternating, in fresh interpreters; prints one JSON line per run and the medians.

    python benchmarks/bench_exit.py [--repeat 5]

Exit time is measured from the child's last statement to its end as its parent sees it (`waitpid`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHILD = """
import gc, sys, time
import mlflow, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from mlflow import MlflowClient
MlflowClient(sys.argv[2]).search_experiments()
objects = len(gc.get_objects())
if sys.argv[1] == "before_exit":
    from orchlib.shutdown import before_exit
    before_exit()
print(objects, time.time(), flush=True)
"""


def one(variant: str, uri: str) -> dict:
    child = subprocess.Popen([sys.executable, "-c", CHILD, variant, uri], cwd=REPO, stdout=subprocess.PIPE, text=True)
    objects, last = child.stdout.readline().split()
    child.wait()
    return {"variant": variant, "objects": int(objects), "exit_s": round(time.time() - float(last), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        uri = f"sqlite:///{Path(folder) / 'mlflow.db'}"
        one("plain", uri)  # creates the database (not timed)
        runs = [one(variant, uri) for _ in range(args.repeat) for variant in ("plain", "before_exit")]
    for run in runs:
        print(json.dumps(run))
    print(json.dumps({variant: statistics.median(r["exit_s"] for r in runs if r["variant"] == variant)
                      for variant in ("plain", "before_exit")}))


if __name__ == "__main__":
    main()
