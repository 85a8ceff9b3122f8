"""Benchmark (issue 60): orch's commands on a lab's shared store as it grows (1k, 10k, 100k runs), PostgreSQL and
SQLite; the figures are in docs/analysis.md ("At lab scale").

One store per backend, grown by benchmarks/lab_store.py (the first size written whole, each next one by `--append`ing
other sweeps' runs), measured after each growth:

    PG=postgresql+psycopg://postgres@127.0.0.1:5439        # e.g. a throwaway cluster: initdb -D DIR -A trust;
    #                                                       # pg_ctl -D DIR -o "-p 5439" start; createdb mlflow_lab orch_lab
    nice -n 10 .venv/bin/python benchmarks/lab_store.py --runs 1000 --mlflow $PG/mlflow_lab --store $PG/orch_lab \
        --root /tmp/orch_lab/pg
    nice -n 10 .venv/bin/python benchmarks/bench_lab_store.py --mlflow $PG/mlflow_lab --store $PG/orch_lab \
        --folder /tmp/orch_lab/pg --runs 1000 --queries
    # the next size: a copy (createdb -T mlflow_lab mlflow_10k; the same for orch_lab) grown by the difference
    nice -n 10 .venv/bin/python benchmarks/lab_store.py --append --seed 1 --runs 9000 --mlflow $PG/mlflow_10k ...

Every command runs as a user runs it (`.venv/bin/orch ...`, a new process, in --folder) under `/usr/bin/time -v`:
wall time and peak RSS, with the load average at its start (the machine is shared: compare ratios). Printed one line
each and appended to --json. `--queries` also times the bulk reader's metrics query per run against the batched one,
in process (best of 3).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ORCH = ROOT / ".venv" / "bin" / "orch"
TARGETS = {"runs --sweep": 5.0, "status SWEEP": 5.0, "report SWEEP": 30.0}  # seconds at 100k on PostgreSQL
SWEEP = "table4"


def label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def commands(uri: str, store: str, out: Path) -> list[tuple[str, list[str]]]:
    return [
        ("runs --sweep", ["runs", "--sweep", SWEEP, "--tracking-uri", uri, "--format", "parquet",
                          "--out", str(out / "runs.parquet")]),
        ("status SWEEP", ["status", SWEEP, "--store", store]),
        ("status (all sweeps)", ["status", "--store", store]),
        ("report SWEEP", ["report", SWEEP, "--tracking-uri", uri, "--store", store, "--out", str(out / "r.html")]),
        ("report --paper", ["report", "--paper", "--tracking-uri", uri, "--out", str(out / "paper.html")]),
        ("archive SWEEP", ["archive", SWEEP, "--tracking-uri", uri, "--out", str(out / "archive")]),
        ("tune (resume)", ["tune", str(ROOT / "sweeps" / "tune_rho.yaml"), "--profile", "cpu", "--wait",
                           "--store", store, "--tracking-uri", uri]),
        ("sweep (re-plan)", ["sweep", str(ROOT / "sweeps" / "table4.yaml"), "--submit-anyway", "--store", store,
                             "--tracking-uri", uri]),
    ]


def timed(argv: list[str], cwd: Path, timeout: float) -> dict:
    """Wall seconds, CPU seconds (user + system: what the command costs, which a loaded machine's wall time
    hides) and peak RSS (MB) of one command, with its exit code and last stderr line."""
    started = time.perf_counter()
    process = subprocess.Popen(["/usr/bin/time", "-v", *argv], cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the command too, not only `time`
        process.communicate()
        return {"seconds": None, "cpu": None, "peak_mb": None, "code": "timeout", "note": f"over {timeout:.0f} s"}
    done = subprocess.CompletedProcess(argv, process.returncode, "", stderr)
    seconds = time.perf_counter() - started
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("\t")
             and "Command being timed" not in line]
    cpu = sum(float(found.group(1)) for found in re.finditer(r"(?:User|System) time \(seconds\): ([\d.]+)",
                                                               done.stderr))
    return {"seconds": round(seconds, 2), "cpu": round(cpu, 2), "peak_mb": round(int(peak.group(1)) / 1024) if peak else None,
            "code": done.returncode, "note": (lines[-1][:160] if lines and done.returncode else "")}


def query_timings(uri: str, repeat: int = 3) -> dict:
    """The bulk reader's two ways to read the sweep's metric histories, best of `repeat` (seconds): one query per
    run (`per_run`, `analysis.stores.mlflow_sql.metric_rows(how="per_run")`) and one per chunk of 500 runs (`batched`)."""
    from analysis.stores.mlflow_sql import _engine, _sweep_run_ids, _tables, metric_rows

    t = _tables()
    engine = _engine(uri)
    result: dict = {}
    try:
        with engine.connect() as conn:
            run_ids = sorted(_sweep_run_ids(conn, SWEEP))
            for how in ("per_run", "batched"):
                best = None
                for _ in range(repeat):
                    started = time.perf_counter()
                    rows = metric_rows(conn, None, t, run_ids, how=how)
                    elapsed = time.perf_counter() - started
                    best = elapsed if best is None else min(best, elapsed)
                result[how] = round(best, 2)
                result["values"] = sum(len(block) for block in rows.values())
    finally:
        engine.dispose()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mlflow", required=True, help="MLflow tracking URI of the store")
    parser.add_argument("--store", required=True, help="orch store URL")
    parser.add_argument("--folder", type=Path, required=True, help="where the commands run and write")
    parser.add_argument("--runs", type=int, required=True, help="runs the store holds (for the table)")
    parser.add_argument("--only", default="", help="commands to run (comma-separated prefixes; default: all)")
    parser.add_argument("--queries", action="store_true", help="also time the metrics query per run vs batched")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path, default=Path("/tmp/orch_lab/results.json"))
    parser.add_argument("--label", default="", help="a name for this code or setting, kept with each row")
    args = parser.parse_args(argv)
    backend = "postgresql" if args.mlflow.startswith("postgresql") else "sqlite"
    results = json.loads(args.json.read_text()) if args.json.is_file() else []
    out = args.folder / "out"
    for name, command in commands(args.mlflow, args.store, out):
        if args.only and not any(name.startswith(prefix) for prefix in args.only.split(",")):
            continue
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        load = os.getloadavg()[0]
        row = {"command": name, "runs": args.runs, "backend": backend, "label": args.label, "load": round(load, 2),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               **timed([str(ORCH), *command], args.folder, args.timeout)}
        results.append(row)
        print(f"{name:22} {label(args.runs):>5} {backend:10} {args.label:8} {row['seconds']!s:>8} s (CPU {row['cpu']!s} s) {row['peak_mb']!s:>6} MB "
              f"load {load:.1f} {row['code']} {row['note']}", flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    if args.queries:
        row = {"command": "metrics query", "runs": args.runs, "backend": backend, "label": args.label,
               "load": round(os.getloadavg()[0], 2), **query_timings(args.mlflow)}
        results.append(row)
        print(f"metrics query {label(args.runs)} {backend}: {row}", flush=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
