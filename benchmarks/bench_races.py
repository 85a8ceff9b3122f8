"""Race scenarios at N = 32 processes (tests/orchestrator/test_races.py runs them at N = 8): concurrent first runs
in a fresh folder, `Store.open` of a new store, `orch sweep` of one file, `orch resume` against `orch cancel`.
Prints one JSON line per scenario: successes, attempts per cell, MLflow runs, wall time. SQLite, and PostgreSQL
when ORCH_TEST_POSTGRES_URL is set.

    python benchmarks/bench_races.py [--n 32] [--only first_runs,store_opens,sweeps,resume_and_cancel]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "orchestrator")]

import races  # noqa: E402  (tests/orchestrator/races.py: the scenarios the race tests run)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--only", default="first_runs,store_opens,sweeps,resume_and_cancel")
    args = parser.parse_args()
    backends = ["sqlite"] + (["postgresql"] if os.environ.get(races.POSTGRES_ENV) else [])
    for backend in backends:
        for scenario in args.only.split(","):
            with tempfile.TemporaryDirectory(prefix="bench-races-") as scratch:
                folder = Path(scratch)
                made = []

                def url(name: str, folder: Path = folder, made: list = made, backend: str = backend) -> str:
                    if backend == "sqlite":
                        return f"sqlite:///{folder / name}"
                    made.append(races.fresh_postgres_schema(os.environ[races.POSTGRES_ENV]))
                    return made[-1]

                if scenario == "first_runs":
                    outcome = races.first_runs(folder, args.n, None if backend == "sqlite" else url("mlflow"))
                elif scenario == "store_opens":
                    outcome = races.store_opens(folder, args.n, url("orch.db"))
                else:
                    tracking = f"sqlite:///{folder / 'mlflow.db'}"
                    outcome = getattr(races, scenario)(folder, args.n, url("orch.db"), tracking)
                print(f"{backend} {scenario} N={args.n}: {races.summary(outcome)}", flush=True)
                for made_url in made:
                    races.drop_postgres_schema(made_url)


if __name__ == "__main__":
    main()
