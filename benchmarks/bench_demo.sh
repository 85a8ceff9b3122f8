#!/usr/bin/env bash
# The README's first command as a new user runs it: a fresh clone, an empty orch cache (ORCH_CACHE_DIR), then
# setup, the demo sweep and the report, each phase timed; the warm start's own seconds come from its
# warm_start.json and each cell's from its MLflow run. Each phase is printed against its budget (issue 59: the whole
# command within 180 s on an idle 2-core machine: setup 40 s, warm start 40 s, sweep 95 s after it, report 5 s).
#
#   bash benchmarks/bench_demo.sh [CLONE_DIR]      # default: a new temporary directory
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
clone=${1:-$(mktemp -d)/orch}
cache=$(mktemp -d)
git clone -q "$repo" "$clone"
cd "$clone"
export ORCH_CACHE_DIR=$cache
t0=$(date +%s.%N)
bash scripts/setup.sh
t1=$(date +%s.%N)
.venv/bin/orch sweep sweeps/demo.yaml --wait
t2=$(date +%s.%N)
.venv/bin/orch report demo --out report.html
t3=$(date +%s.%N)
.venv/bin/python - "$t0" "$t1" "$t2" "$t3" <<'PY'
import json, sys
from pathlib import Path
import os
from mlflow import MlflowClient
t0, t1, t2, t3 = map(float, sys.argv[1:])
BUDGET = {"setup": 40.0, "warm start": 40.0, "sweep": 95.0, "report": 5.0, "total": 180.0}


def line(phase: str, seconds: float, label: str) -> str:
    budget = BUDGET[phase]
    mark = "within" if seconds <= budget else "OVER"
    return f"{label:<28}{seconds:7.1f} s   budget {budget:5.0f} s  {mark}"


warm = sum(json.loads(r.read_text())["seconds"]
           for r in Path(os.environ["ORCH_CACHE_DIR"]).glob("warm-start/*/warm_start.json"))
print()
print(line("setup", t1 - t0, "setup (venv + install)"))
print(line("warm start", warm, "warm start(s)"))
print(line("sweep", t2 - t1 - warm, "sweep after the warm start"))
for report in sorted(Path(os.environ["ORCH_CACHE_DIR"]).glob("warm-start/*/warm_start.json")):
    figures = json.loads(report.read_text())
    print(f"  warm start ({report.parent.name}): {figures['seconds']:.1f} s, {figures['epochs']} epochs, "
          f"validity {figures['format_validity']:.3f}, first-turn retrieval {figures['first_turn_retrieval']:.3f} "
          f"vs chance {figures['retrieval_chance']:.3f}")
    cpu = figures.get("cpu_seconds")
    if cpu:  # its process's CPU time by phase: what a loaded machine inflates least
        print(f"    CPU s: training {cpu['training']:.1f} ({len(figures.get('trained', []))} epochs), evaluations "
              f"{cpu['evaluations']:.1f} ({len(figures['history'])}), total {cpu['total']:.1f}")
client = MlflowClient("sqlite:///mlflow.db")
for experiment in client.search_experiments():
    for run in client.search_runs([experiment.experiment_id]):
        seconds = (run.info.end_time - run.info.start_time) / 1000 if run.info.end_time else float("nan")
        setup = run.data.metrics.get("timing_s/setup", float("nan"))
        print(f"  cell {run.data.tags.get('mlflow.runName', run.info.run_id)}: {seconds:.1f} s "
              f"(setup incl. warm start {setup:.1f} s)")
print(line("report", t3 - t2, "report"))
print(line("total", t3 - t0, "total") + f"  ({(t3 - t0) / 60:.1f} min)")
print(f"load average at the end (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
PY
