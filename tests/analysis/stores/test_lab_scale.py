"""The lab-scale benchmark in small (issue 60; the full one is benchmarks/bench_lab_store.py, its figures in
docs/analysis.md): reading one sweep from a shared MLflow store does not grow with the other sweeps' runs.

Two SQLite stores written by the benchmark's generator (benchmarks/lab_store.py): the paper's Table 4 sweep alone
(264 cells planned by orch, 3 steps of a real cell's metrics), and the same sweep among 1,500 runs of other sweeps.
No wall clock: SQLite's own count of the virtual-machine instructions the bulk reader's queries execute (a scan of
the other sweeps' rows costs several per row; an index lookup the same whatever the table's size), and the query
plan of every statement it sent (no full scan of runs, tags, params or metrics).
"""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
OTHERS = 1500
SCANNED = ("runs", "tags", "params", "metrics", "latest_metrics")


def _generator():
    spec = importlib.util.spec_from_file_location("lab_store", ROOT / "benchmarks" / "lab_store.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lab_store", module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules["lab_store"])
    return sys.modules["lab_store"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict[str, str]:
    generator = _generator()
    root = tmp_path_factory.mktemp("lab")
    template = root / "template.db"
    generator.create_mlflow_schema(f"sqlite:///{template}", root / "artifacts")  # MLflow's migrations, once
    uris = {}
    for name, runs in (("alone", 265), ("crowded", 265 + OTHERS)):
        folder = root / name
        folder.mkdir()
        shutil.copy(template, folder / "mlflow.db")
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        counts = generator.generate(uri, f"sqlite:///{folder / 'orch.db'}", runs, folder, log=lambda line: None,
                                    table4_steps=3, other_steps=2, study=False)
        assert counts["runs"] == counts["runs_total"] >= runs
        uris[name] = uri
    return uris


def _read(uri: str):
    """The sweep table4 through the bulk reader, with every SQL statement it ran and SQLite's instruction count."""
    import sqlalchemy as sa

    from analysis.stores.mlflow_query import RunQuery
    from analysis.stores.mlflow_store import load_runs

    statements: list[str] = []
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    def watch(dbapi_connection, _record) -> None:
        dbapi_connection.set_trace_callback(statements.append)
        dbapi_connection.set_progress_handler(tick, 10)

    sa.event.listen(sa.engine.Engine, "connect", watch)
    try:
        data = load_runs(RunQuery(sweep="table4"), uri, reader="sql")
    finally:
        sa.event.remove(sa.engine.Engine, "connect", watch)
    return data, statements, steps[0] * 10


@pytest.mark.slow  # about 40 s: MLflow's migrations once, two stores of table4's 264 planned cells
def test_reading_a_sweep_does_not_grow_with_other_sweeps_runs(lab):
    alone, alone_sql, alone_steps = _read(lab["alone"])
    crowded, crowded_sql, crowded_steps = _read(lab["crowded"])
    cells = crowded.runs[crowded.runs["tags.orch.role"] == "cell"]
    assert len(cells) == 264 and set(crowded.runs["tags.sweep"]) == {"table4"}
    assert sorted(crowded.runs["tags.cell"].dropna()) == sorted(alone.runs["tags.cell"].dropna())
    assert len(crowded.metrics) == len(alone.metrics) > 264
    # the same statements (but for the run ids in them), and within a few instructions per *other sweep*, far
    # fewer than one per other run: the work of an index lookup, not of a scan
    print("STEPS", alone_steps, crowded_steps, len(alone_sql), len(crowded_sql))
    assert len(crowded_sql) == len(alone_sql)
    assert crowded_steps - alone_steps < OTHERS, (alone_steps, crowded_steps)

    path = lab["crowded"].split(":///", 1)[1]
    with sqlite3.connect(path) as conn:
        for statement in crowded_sql:
            if not statement.lstrip().upper().startswith("SELECT"):
                continue
            plan = " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {statement}"))
            scans = [table for table in SCANNED if f"SCAN {table} " in f"{plan} " or plan.endswith(f"SCAN {table}")]
            assert not scans, f"{statement[:200]}: {plan}"
