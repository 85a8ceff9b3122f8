"""Sweep-engine targets: expand + store a 10,000-cell sweep (< 3 s), `orch status` over 10,000 cells (< 1 s), and
sbatch calls = resource groups x array splits (not cells).

    python benchmarks/bench_sweep.py [--cells 10000] [--slurm-cells 600] [--store URL]

1. expand + store: a sweep of 4 tasks x 25 filter values x (cells / 100) seeds; timed cold (empty conf/ cache:
   Hydra composes each group option once) and warm (cache filled), split into load, plan (expand, resolve,
   validate, hash, resources) and store (insert into a fresh store).
2. status: the 10,000 cells get mixed states; then `orch status SWEEP` runs as a fresh process (wall time,
   Python start-up and imports included), and its query + table rendering is timed in-process too.
3. sbatch count (only where SLURM answers): `--slurm-cells` cells in 3 resource groups are submitted held
   (`#SBATCH --hold`, nothing runs) with arrays split at 150; the distinct array job ids are counted, then cancelled.
   Submission includes creating one MLflow child run per cell, which dominates its time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def write_sweep(folder: Path, name: str, cells: int) -> Path:
    seeds = max(1, cells // 100)
    spec = {
        "name": name,
        "backend": "torch",
        "base": {"trainer": "test"},
        "grid": {"task": ["sokoban", "frozenlake", "metamathqa", "countdown"],
                 "filter.value": [round(0.5 + 0.02 * index, 2) for index in range(25)]},
        "seeds": list(range(seeds)),
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def bench_expand_and_store(folder: Path, cells: int, store_url: str, cache: Path) -> tuple[str, dict[str, float]]:
    from orchestrator.engine import cell_fields
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep
    from orchestrator.store import Store
    from recipes.config.resolve import ConfigResolver

    path = write_sweep(folder, "bench", cells)
    timings: dict[str, float] = {}
    for label in ("cold", "warm"):
        start = time.perf_counter()
        definition = load_sweep(path)
        loaded = time.perf_counter()
        plan = build_plan(definition, ConfigResolver(cache_dir=cache))
        planned = time.perf_counter()
        store = Store.open(store_url.replace("{label}", label))
        row = store.save_sweep({"name": plan.name, "spec_path": str(path), "spec_text": path.read_text(),
                                "executor": "local", "cluster_json": "{}", "varied_json": json.dumps(plan.varied),
                                "run_dir": str(folder / "run")})
        store.add_cells(row.id, cell_fields(plan))
        stored = time.perf_counter()
        assert len(plan.cells) == cells, len(plan.cells)
        timings[f"{label}: load"] = loaded - start
        timings[f"{label}: plan"] = planned - loaded
        timings[f"{label}: store"] = stored - planned
        timings[f"{label}: total"] = stored - start
    return store_url.replace("{label}", "warm"), timings


def bench_status(store_url: str, cells: int) -> dict[str, float]:
    from orchestrator.states import State
    from orchestrator.store import Store
    from orchestrator.views import status_table

    store = Store.open(store_url)
    sweep = store.require_sweep("bench")
    rows = store.cell_rows(sweep.id)
    submitted = [row.id for row in rows[: cells // 2]]
    store.record_submissions("local", submitted)
    store.mark(submitted, State.RUNNING, "", only_states=[State.QUEUED])  # the first tenth stays running
    store.mark(submitted[cells // 10:], State.FINISHED, "", only_states=[State.RUNNING])
    start = time.perf_counter()
    table = status_table(sweep, store.counts(sweep.id), store.status_rows(sweep.id, 50), 160)
    from rich.console import Console

    Console(file=open(os.devnull, "w")).print(table)  # noqa: SIM115
    in_process = time.perf_counter() - start
    command = [str(Path(sys.executable).parent / "orch"), "status", "bench", "--store", store_url]
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
        walls.append(time.perf_counter() - start)
        assert result.returncode == 0, result.stderr
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    python_alone = time.perf_counter() - start
    return {"in-process query + render": in_process, "`orch status` process (best of 3)": min(walls),
            "  of which bare python start": python_alone}


def bench_sbatch(folder: Path, cells: int) -> dict[str, float] | None:
    if shutil.which("sinfo") is None or subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        return None
    from orchestrator.engine import submit_plan
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep
    from orchestrator.store import Store

    spec = {
        "name": "sbatch",
        "backend": "torch",
        "base": {"trainer": "test"},
        "grid": {"task": ["sokoban", "frozenlake", "countdown"]},
        "seeds": list(range(cells // 3)),
        "resources": {"default": {"time_min": 10},
                      "rules": [{"when": {"task": "frozenlake"}, "set": {"time_min": 20}},
                                {"when": {"task": "countdown"}, "set": {"time_min": 30}}]},
        "cluster": {"max_array_size": 150, "sbatch": {"hold": True}},
    }
    path = folder / "sbatch.yaml"
    path.write_text(yaml.safe_dump(spec))
    plan = build_plan(load_sweep(path))
    groups = plan.resource_groups()
    expected = sum(-(-len(group) // 150) for group in groups.values())
    store = Store.open(f"sqlite:///{folder / 'sbatch.db'}")
    start = time.perf_counter()
    submit_plan(plan, store, "slurm", tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    elapsed = time.perf_counter() - start
    rows = store.cell_rows(store.require_sweep("sbatch").id)
    arrays = sorted({row.job_id.split("_")[0] for row in rows})
    subprocess.run(["scancel", *arrays], check=False)
    print(f"sbatch: {len(plan.cells)} cells, {len(groups)} resource groups, split at 150 -> expected {expected} "
          f"sbatch calls, observed {len(arrays)} job arrays ({', '.join(arrays)})")
    assert len(arrays) == expected
    return {f"submit {len(plan.cells)} cells (MLflow child runs included)": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--slurm-cells", type=int, default=600)
    parser.add_argument("--store", default=None, help="store URL with {label} for cold/warm (default: SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        os.chdir(folder)
        store_url = args.store or f"sqlite:///{folder}/{{label}}.db"
        warm_url, timings = bench_expand_and_store(folder, args.cells, store_url, folder / "cache")
        print(f"expand + store {args.cells} cells:")
        for key, value in timings.items():
            print(f"  {key:<40} {value:7.3f} s")
        print(f"status over {args.cells} cells:")
        for key, value in bench_status(warm_url, args.cells).items():
            print(f"  {key:<40} {value:7.3f} s")
        sbatch = bench_sbatch(folder, args.slurm_cells) if args.slurm_cells else None
        if sbatch is None:
            print("sbatch count: skipped (SLURM not running, or --slurm-cells 0)")
        else:
            for key, value in sbatch.items():
                print(f"  {key:<40} {value:7.3f} s")


if __name__ == "__main__":
    main()
