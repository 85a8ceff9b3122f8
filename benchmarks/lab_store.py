"""A lab's shared store of N runs, written fast through MLflow's own schema (issue 60): the generator behind
benchmarks/bench_lab_store.py and the fast test tests/analysis/test_lab_scale.py.

    .venv/bin/python benchmarks/lab_store.py --runs 10000 --mlflow sqlite:////tmp/lab/mlflow.db \
        --store sqlite:////tmp/lab/orch.db
    .venv/bin/python benchmarks/lab_store.py --runs 100000 \
        --mlflow postgresql+psycopg://postgres@127.0.0.1:5439/mlflow_100k \
        --store postgresql+psycopg://postgres@127.0.0.1:5439/orch_100k

What it writes, in two databases (MLflow's and orch's store; Optuna keeps its study in the store's, as `orch tune`):

* MLflow's schema, created by MLflow itself (`SqlAlchemyStore`, every migration of the installed MLflow), then
  filled with SQLAlchemy Core / the DBAPI (`COPY` on PostgreSQL, `executemany` on SQLite): experiments (one per
  sweep, tagged `orch.sweep`), runs, tags, params, metrics, latest_metrics.
* ``table4``: the paper's Table 4 sweep (sweeps/table4.yaml, 264 cells) planned by orch itself (`build_plan`,
  its real digests, settings and configs in the store through `Store.add_cells`), a parent run and one finished
  run per cell tagged as `orchestrator.tracking.create_child_runs` tags it, its params the trainer's
  (`flatten_config` of the cell's resolved config), its tags the trainer's (`log_run_config`, `orch.status`), and
  200 steps of every metric a real cell logs (the keys and how often each is logged, from a cell of the committed
  archive docs/results/repro_long).
* ``tune_rho``: the Optuna study of sweeps/tune_rho.yaml (profile cpu) run to its end through Optuna's own
  ask/tell (24 trials, TPE), each trial's cell planned and stored by orch's `StudyPlan` as `orch tune` does.
* other sweeps until N runs: 8 to 96 cells each, a parent run each, a mix of finished, failed, killed, running and
  scheduled runs (and the same states in the store, with attempts and progress), 6 metrics over 10 steps each.

Deterministic for a given N (`random.Random(seed)`); nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARCHIVE = ROOT / "docs" / "results" / "repro_long" / "session16-a"  # a real cell's metric keys and cadence
TABLE4 = "table4"
STUDY = "tune_rho"
TABLE4_STEPS = 200
OTHER_STEPS = 10
OTHER_KEYS = (
    "val/success_rate", "actor/entropy", "rollout/reward_mean", "rollout/in_group_reward_std_mean",
    "collapse/trajectory/mi_zscore_ema", "timing_s/step",
)
T0 = 1_767_225_600_000  # 2026-01-01, ms
TOPICS = ("ablation", "seeds", "rho", "eval", "slip", "kl", "entropy", "lr", "budget", "prompt", "repro", "probe")
# an orch state per sweep fate, with the MLflow status its run has
MLFLOW_STATUS = {"finished": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "running": "RUNNING",
                 "queued": "SCHEDULED", "lost": "FAILED", "stopped": "FINISHED"}


@dataclass
class Rows:
    """Everything to insert, table by table (MLflow's tables by name; the orch store's apart)."""

    experiments: list[tuple] = field(default_factory=list)
    experiment_tags: list[tuple] = field(default_factory=list)
    runs: list[tuple] = field(default_factory=list)
    tags: list[tuple] = field(default_factory=list)
    params: list[tuple] = field(default_factory=list)
    metric_runs: list[tuple] = field(default_factory=list)  # (run_uuid, start ms, [(key, stride)], steps, seed)


RUN_COLUMNS = ("run_uuid", "name", "source_type", "source_name", "entry_point_name", "user_id", "status",
               "start_time", "end_time", "source_version", "lifecycle_stage", "artifact_uri", "experiment_id")
METRIC_COLUMNS = ("key", "value", "timestamp", "run_uuid", "step", "is_nan")


def cell_metric_plan() -> list[tuple[str, int]]:
    """(key, every how many steps it is logged): every key a real cell of the committed repro_long archive logged,
    at the cadence it logged it there."""
    import pandas as pd

    runs = pd.read_parquet(ARCHIVE / "runs.parquet")
    metrics = pd.read_parquet(ARCHIVE / "metrics.parquet")
    cell = runs.loc[runs["tags.orch.role"] == "cell", "run_id"].iloc[0]
    mine = metrics[metrics["run_id"] == cell]
    span = max(int(mine["step"].max()), 1)
    plan = []
    for key, group in mine.groupby("key"):
        count = group["step"].nunique()
        plan.append((str(key), max(1, round(span / max(count, 1)))))
    return sorted(plan)


def metric_rows(run_uuid: str, start: int, plan: list[tuple[str, int]], steps: int, seed: int
                ) -> tuple[list[tuple], list[tuple]]:
    """(metrics rows, latest_metrics rows) of one run: each key at its cadence, a noisy trend in [0, 1]."""
    rng = random.Random(seed)
    rows, latest = [], []
    for k, (key, stride) in enumerate(plan):
        level, slope = rng.random(), (rng.random() - 0.5) / steps
        last = None
        for step in range(0 if stride == 1 else stride, steps + 1, stride):
            value = min(1.0, max(0.0, level + slope * step + rng.gauss(0, 0.05)))
            if key == "collapse/alert":
                value = float(value > 0.95)
            last = (key, value, start + step * 1000 + k, run_uuid, step, False)
            rows.append(last)
        if last is not None:
            latest.append((key, last[1], last[2], last[4], False, run_uuid))
    return rows, latest


class Writer:
    """Bulk inserts into MLflow's tables: COPY on PostgreSQL, executemany on SQLite (one transaction)."""

    def __init__(self, uri: str) -> None:
        import sqlalchemy as sa

        self.uri = uri
        self.postgres = uri.startswith("postgresql")
        self.engine = sa.create_engine(uri)
        self.conn = self.engine.raw_connection()
        if not self.postgres:
            cursor = self.conn.cursor()
            cursor.execute("PRAGMA synchronous=OFF")
            cursor.close()

    def insert(self, table: str, columns: Iterable[str], rows: Iterable[tuple]) -> int:
        columns = tuple(columns)
        count = 0
        cursor = self.conn.cursor()
        if self.postgres:
            with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
                    count += 1
        else:
            marks = ", ".join("?" for _ in columns)
            sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
            batch: list[tuple] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= 50_000:
                    cursor.executemany(sql, batch)
                    count += len(batch)
                    batch = []
            cursor.executemany(sql, batch)
            count += len(batch)
        cursor.close()
        return count

    def commit(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


def create_mlflow_schema(uri: str, artifact_root: Path) -> None:
    """MLflow's own schema, every migration of the installed MLflow (what `mlflow server` would create)."""
    import logging

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    store = SqlAlchemyStore(uri, str(artifact_root))
    store.engine.dispose()


class Lab:
    """Builds the rows of every sweep (MLflow and orch store) for a store of `n_runs` runs."""

    def __init__(self, mlflow_uri: str, store_url: str, n_runs: int, root: Path, seed: int = 0,
                 log: Callable[[str], None] = print, *, table4_steps: int = TABLE4_STEPS, study: bool = True,
                 other_steps: int = OTHER_STEPS, append: bool = False) -> None:
        self.mlflow_uri, self.store_url, self.n_runs, self.root = mlflow_uri, store_url, n_runs, root
        self.table4_steps, self.with_study, self.other_steps = table4_steps, study, other_steps
        self.append = append  # only more other sweeps, into stores this generator wrote before
        self.rng = random.Random(seed)
        self.log = log
        self.rows = Rows()
        self.next_experiment = 1  # 0 is MLflow's Default experiment
        self.cell_plan = cell_metric_plan()
        self.other_plan = [(key, 1) for key in OTHER_KEYS]
        self.clock = T0

    def run_id(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"

    def experiment(self, name: str) -> int:
        experiment_id = self.next_experiment
        self.next_experiment += 1
        self.rows.experiments.append((experiment_id, name, str(self.root / "artifacts" / str(experiment_id)),
                                      "active", self.clock, self.clock))
        self.rows.experiment_tags.append(("orch.sweep", name, experiment_id))
        return experiment_id

    def add_run(self, experiment_id: int, name: str, status: str, tags: dict[str, str], params: dict[str, str],
                plan: list[tuple[str, int]] | None, steps: int) -> str:
        run_uuid = self.run_id()
        start = self.clock
        self.clock += 60_000
        end = None if status in ("RUNNING", "SCHEDULED") else start + steps * 1000 + 5000
        if status == "SCHEDULED":
            start = None
        artifact = str(self.root / "artifacts" / str(experiment_id) / run_uuid / "artifacts")
        self.rows.runs.append((run_uuid, name[:250], "LOCAL", "orch", "", "lab", status, start, end, "",
                               "active", artifact, experiment_id))
        tags = {**tags, "mlflow.runName": name[:250], "mlflow.user": "lab"}
        self.rows.tags.extend((key, value, run_uuid) for key, value in tags.items())
        self.rows.params.extend((key, value, run_uuid) for key, value in params.items())
        if plan and status != "SCHEDULED":
            done = steps if status in ("FINISHED",) else self.rng.randint(1, steps)
            self.rows.metric_runs.append((run_uuid, start, plan, done, self.rng.getrandbits(32)))
        return run_uuid

    # -- sweeps --------------------------------------------------------------------------------------------------

    def table4(self, store: Any) -> int:
        """The paper's Table 4 sweep, planned by orch; every cell finished with 200 steps. Returns its runs."""
        from orchestrator.plan import build_plan
        from orchestrator.spec import load_sweep

        plan = build_plan(load_sweep(ROOT / "sweeps" / "table4.yaml"))
        return self._planned_sweep(store, plan.definition, plan.varied, cells=[
            (fields, cell) for fields, cell in zip(_cell_fields(plan), plan.cells, strict=True)])

    def _planned_sweep(self, store: Any, definition: Any, varied: list[str],
                       cells: list[tuple[dict[str, Any], Any]], trial_of: Callable[[int], str] | None = None) -> int:
        from orchestrator.engine import save_sweep_row
        from recipes.config.schema import flatten_config

        name = definition.spec.name
        sweep = save_sweep_row(store, definition, "local", varied, self.mlflow_uri)
        store.update_sweep(sweep.id, run_dir=str(self.root / "sweeps" / name))
        store.add_cells(sweep.id, [fields for fields, _ in cells])
        experiment_id = self.experiment(name)
        parent = self.add_run(experiment_id, name, "FINISHED", {"sweep": name, "orch.role": "sweep"},
                              {"spec_path": str(definition.path), "profile": definition.profile or "",
                               "sets": "[]", "varied": json.dumps(varied)}, None, 0)
        store.update_sweep(sweep.id, experiment_id=str(experiment_id), parent_run_id=parent)
        rows = {row.digest: row for row in store.cell_rows(sweep.id)}
        done: dict[int, str] = {}
        for fields, cell in cells:
            config = cell.resolved.config
            cell_varied = json.loads(fields["varied_json"])
            tags = {"mlflow.parentRunId": parent, "sweep": name, "cell": cell.digest, "seed": str(cell.seed),
                    "orch.role": "cell"}
            if cell.axis:
                tags["axis"] = cell.axis
            for key, value in cell_varied.items():
                tags.setdefault(key, str(value)[:5000])
            tags.update({"task": config.task.name, "algorithm": config.algorithm.name, "model": config.model.name,
                         "backend": config.backend, "filter": config.filter.name,
                         "orch.checkpoint_dir": str(self.root / "sweeps" / name / cell.digest),
                         "orch.status": "finished", "orch.reason": ""})
            run_name = ",".join(f"{k}={v}" for k, v in cell_varied.items() if k != "axis") or cell.digest
            run_uuid = self.add_run(experiment_id, run_name, "FINISHED", tags, flatten_config(config),
                                    self.cell_plan if name == TABLE4 else self.other_plan,
                                    self.table4_steps if name == TABLE4 else self.other_steps)
            done[rows[cell.digest].id] = run_uuid
        _finish_cells(store, done, self.table4_steps if name == TABLE4 else self.other_steps, self.clock / 1000)
        return 1 + len(cells)

    def study(self, store: Any) -> int:
        """sweeps/tune_rho.yaml's Optuna study run to its end (profile cpu), as `orch tune` stores it."""
        import optuna

        from orchestrator.spec import load_sweep
        from orchestrator.tune import CELLS_ATTR, StudyPlan

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        definition = load_sweep(ROOT / "sweeps" / f"{STUDY}.yaml", profile="cpu")
        from recipes.config.resolve import ConfigResolver

        study_plan = StudyPlan(definition, ConfigResolver())
        study = optuna.create_study(
            study_name=STUDY, storage=optuna.storages.RDBStorage(self.store_url),
            directions=study_plan.spec.directions(), sampler=study_plan.spec.make_sampler(), load_if_exists=True)
        cells: list[tuple[dict[str, Any], Any]] = []
        seen: set[str] = set()
        for _ in range(study_plan.spec.trials):
            trial = study.ask()
            params = study_plan.spec.suggest(trial)
            plan = study_plan.trial_plan(params)
            trial.set_user_attr(CELLS_ATTR, [cell.digest for cell in plan.cells])
            for fields, cell in zip(study_plan.cell_fields(trial.number, params, plan), plan.cells, strict=True):
                if cell.digest not in seen:
                    seen.add(cell.digest)
                    cells.append((fields, cell))
            study.tell(trial, [self.rng.random()])
        return self._planned_sweep(store, definition, study_plan.varied(), cells)

    def other_sweeps(self, store: Any, budget: int) -> int:
        """Sweeps of 8 to 96 cells until `budget` runs; fates: mostly finished, some failed, running, queued."""
        from orchestrator.store_schema import AttemptRow, CellRow, ProgressRow, SweepRow

        base_params = self._base_params()
        written = 0
        sweeps, cells, attempts, progress = [], [], [], []
        sweep_id = _max_id(store, SweepRow) + 1
        cell_id = _max_id(store, CellRow) + 1
        attempt_id = _max_id(store, AttemptRow) + 1
        while written < budget:
            size = min(self.rng.choice((8, 12, 16, 24, 32, 48, 64, 96)), max(budget - written - 1, 1))
            name = f"{self.rng.choice(TOPICS)}-{sweep_id:05d}"
            fate = self.rng.choices(("done", "active", "broken"), (0.85, 0.1, 0.05))[0]
            experiment_id = self.experiment(name)
            now = self.clock / 1000
            parent = self.add_run(experiment_id, name, "RUNNING" if fate == "active" else "FINISHED",
                                  {"sweep": name, "orch.role": "sweep"},
                                  {"spec_path": f"sweeps/{name}.yaml", "profile": "", "sets": "[]",
                                   "varied": '["seed", "filter"]'}, None, 0)
            sweeps.append({"id": sweep_id, "name": name, "spec_path": f"/lab/sweeps/{name}.yaml",
                           "spec_text": f"name: {name}\n", "profile": None, "sets_json": "[]",
                           "executor": "slurm", "cluster_json": "{}", "varied_json": '["seed", "filter"]',
                           "run_dir": str(self.root / "sweeps" / name), "tracking_uri": self.mlflow_uri,
                           "experiment_id": str(experiment_id), "parent_run_id": parent,
                           "created_at": now, "updated_at": now})
            for position in range(size):
                state = self._state(fate, position, size)
                task = self.rng.choice(("sokoban", "frozenlake", "countdown", "webshop"))
                flt = self.rng.choice(("none", "top_p"))
                seed = position % 3
                digest = f"{self.rng.getrandbits(128):032x}"
                varied = {"task": task, "filter": flt, "seed": seed}
                tags = {"mlflow.parentRunId": parent, "sweep": name, "cell": digest, "seed": str(seed),
                        "orch.role": "cell", "task": task, "filter": flt, "algorithm": "ppo", "model": "hf",
                        "backend": "verl"}
                if state in ("finished", "failed", "cancelled"):
                    tags["orch.status"] = state
                params = {**base_params, "task.name": task, "filter.name": flt, "seed": str(seed)}
                status = MLFLOW_STATUS[state]
                run_uuid = self.add_run(experiment_id, f"task={task},filter={flt},seed={seed}", status, tags,
                                        params, self.other_plan, self.other_steps)
                steps = self.other_steps if state == "finished" else self.rng.randint(0, self.other_steps)
                cells.append({"id": cell_id, "sweep_id": sweep_id, "digest": digest, "position": position,
                              "axis": None, "seed": seed, "backend": "verl",
                              "settings_json": json.dumps({"task": task, "filter": flt, "seed": seed}),
                              "overrides_json": json.dumps([f"task={task}", f"filter={flt}", f"seed={seed}"]),
                              "varied_json": json.dumps(varied), "resources_json": "{}", "state": state,
                              "attempts": 0 if state == "queued" else 1, "requeues": 0,
                              "job_id": f"{100000 + cell_id}", "mlflow_run_id": run_uuid,
                              "steps_done": steps, "reason": "Traceback ...\nRuntimeError: CUDA out of memory"
                              if state == "failed" else None, "created_at": now, "updated_at": now})
                if state != "queued":
                    ended = state not in ("running",)
                    attempts.append({"id": attempt_id, "cell_id": cell_id, "number": 1, "executor": "slurm",
                                     "job_id": f"{100000 + cell_id}", "state": state, "submitted_at": now,
                                     "started_at": now + 5, "heartbeat_at": now + 60,
                                     "ended_at": now + 600 if ended else None,
                                     "exit_code": (0 if state == "finished" else 1) if ended else None,
                                     "reason": None, "stdout_path": None, "stderr_path": None,
                                     "host": "node01", "pid": 4242, "steps_done": steps})
                    if state == "running":
                        progress.append({"attempt_id": attempt_id, "updated_at": now + 60, "progress_json":
                                         json.dumps({"step": steps, "total": self.other_steps, "phase": "rollout",
                                                     "success": 0.4})})
                    attempt_id += 1
                cell_id += 1
            sweep_id += 1
            written += size + 1
        with store.engine.begin() as conn:
            for table, rows in ((SweepRow, sweeps), (CellRow, cells), (AttemptRow, attempts), (ProgressRow, progress)):
                for start in range(0, len(rows), 20_000):
                    conn.execute(table.__table__.insert(), rows[start:start + 20_000])
        if store.engine.url.get_backend_name() == "postgresql":
            with store.engine.begin() as conn:
                for table in ("sweeps", "cells", "attempts"):
                    conn.exec_driver_sql(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                         f"(SELECT max(id) FROM {table}))")
        return written

    def _state(self, fate: str, position: int, size: int) -> str:
        if fate == "done":
            return self.rng.choices(("finished", "failed", "stopped"), (0.95, 0.04, 0.01))[0]
        if fate == "broken":
            return self.rng.choices(("finished", "failed", "cancelled", "lost"), (0.4, 0.4, 0.1, 0.1))[0]
        share = position / size
        return "finished" if share < 0.5 else "running" if share < 0.75 else "queued"

    def _base_params(self) -> dict[str, str]:
        """A real cell's params (a table4 cell's flattened config), shared by the other sweeps' runs."""
        from orchestrator.plan import build_plan
        from orchestrator.spec import load_sweep
        from recipes.config.schema import flatten_config

        plan = build_plan(load_sweep(ROOT / "sweeps" / "demo.yaml"))
        return flatten_config(plan.cells[0].resolved.config)

    # -- writing ---------------------------------------------------------------------------------------------------

    def write(self) -> dict[str, Any]:
        from orchestrator.store import Store

        started = time.perf_counter()
        (self.root / "sweeps").mkdir(parents=True, exist_ok=True)
        create_mlflow_schema(self.mlflow_uri, self.root / "artifacts")
        store = Store.open(self.store_url, create=True)
        try:
            if self.append:
                self.next_experiment = _max_experiment(self.mlflow_uri) + 1
                runs = self.other_sweeps(store, self.n_runs)
            else:
                runs = self.table4(store)
                runs += self.study(store) if self.with_study else 0
                runs += self.other_sweeps(store, max(self.n_runs - runs, 0))
        finally:
            store.dispose()
        self.log(f"planned {runs} runs in {time.perf_counter() - started:.0f} s; writing MLflow's tables")
        counts = self._write_mlflow()
        from recipes.run.tracking import ensure_lookup_indexes

        counts["indexes"] = ensure_lookup_indexes(self.mlflow_uri)  # as `orch sweep` adds them
        counts["runs_total"] = runs
        counts["seconds"] = round(time.perf_counter() - started, 1)
        return counts

    def _write_mlflow(self) -> dict[str, Any]:
        writer = Writer(self.mlflow_uri)
        counts: dict[str, Any] = {}
        try:
            counts["experiments"] = writer.insert(
                "experiments", ("experiment_id", "name", "artifact_location", "lifecycle_stage", "creation_time",
                                "last_update_time"), self.rows.experiments)
            writer.insert("experiment_tags", ("key", "value", "experiment_id"), self.rows.experiment_tags)
            counts["runs"] = writer.insert("runs", RUN_COLUMNS, self.rows.runs)
            counts["tags"] = writer.insert("tags", ("key", "value", "run_uuid"), self.rows.tags)
            counts["params"] = writer.insert("params", ("key", "value", "run_uuid"), self.rows.params)
            latest: list[tuple] = []
            counts["metrics"] = writer.insert("metrics", METRIC_COLUMNS, self._metrics(latest))
            counts["latest_metrics"] = writer.insert(
                "latest_metrics", ("key", "value", "timestamp", "step", "is_nan", "run_uuid"), latest)
            if writer.postgres:
                cursor = writer.conn.cursor()
                cursor.execute("SELECT setval(pg_get_serial_sequence('experiments', 'experiment_id'), "
                               "(SELECT max(experiment_id) FROM experiments))")
                cursor.close()
            writer.commit()
            if writer.postgres:  # the planner's statistics, as autovacuum would gather them in time
                writer.conn.dbapi_connection.autocommit = True
            cursor = writer.conn.cursor()
            cursor.execute("VACUUM ANALYZE" if writer.postgres else "ANALYZE")
            cursor.close()
        finally:
            writer.close()
        return counts

    def _metrics(self, latest: list[tuple]) -> Iterator[tuple]:
        total = len(self.rows.metric_runs)
        for number, (run_uuid, start, plan, steps, seed) in enumerate(self.rows.metric_runs):
            rows, last = metric_rows(run_uuid, start, plan, steps, seed)
            latest.extend(last)
            yield from rows
            if (number + 1) % 10_000 == 0:
                self.log(f"  metrics of {number + 1}/{total} runs")


def _cell_fields(plan: Any) -> list[dict[str, Any]]:
    from orchestrator.engine import cell_fields

    return cell_fields(plan)


def _max_experiment(uri: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(uri)
    try:
        with engine.connect() as conn:
            return int(conn.scalar(sa.text("SELECT max(experiment_id) FROM experiments")) or 0)
    finally:
        engine.dispose()


def _max_id(store: Any, table: Any) -> int:
    from sqlalchemy import func, select

    with store.engine.connect() as conn:
        return int(conn.scalar(select(func.max(table.id))) or 0)


def _finish_cells(store: Any, run_ids: dict[int, str], steps: int, now: float) -> None:
    """The cells finished, each with one attempt, as a job's end leaves them."""
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from orchestrator.store_schema import AttemptRow, CellRow

    with Session(store.engine) as session, session.begin():
        conn = session
        conn.execute(update(CellRow), [{"id": cell_id, "state": "finished", "attempts": 1, "steps_done": steps,
                                        "mlflow_run_id": run_id, "job_id": f"local-{cell_id}", "updated_at": now}
                                       for cell_id, run_id in run_ids.items()])
        conn.execute(AttemptRow.__table__.insert(), [
            {"cell_id": cell_id, "number": 1, "executor": "local", "job_id": f"local-{cell_id}",
             "state": "finished", "submitted_at": now - 4000, "started_at": now - 3990, "heartbeat_at": now - 10,
             "ended_at": now, "exit_code": 0, "host": "lab", "pid": 4242, "steps_done": steps}
            for cell_id in run_ids])


def generate(mlflow_uri: str, store_url: str, n_runs: int, root: Path, seed: int = 0,
             log: Callable[[str], None] = print, **sizes: Any) -> dict[str, Any]:
    """Write a lab store of about `n_runs` runs (at least table4's and the study's) into two new databases.
    `sizes`: `table4_steps` (200), `other_steps` (10), `study` (True): smaller stores for the fast test."""
    return Lab(mlflow_uri, store_url, n_runs, root, seed, log, **sizes).write()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, required=True, help="runs in all (at least table4's 265 and the study's)")
    parser.add_argument("--mlflow", required=True, help="MLflow tracking database URI (a new, empty database)")
    parser.add_argument("--store", required=True, help="orch store URL (a new, empty database)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/orch_lab"), help="sweep folders and artifacts")
    parser.add_argument("--append", action="store_true",
                        help="add --runs runs of other sweeps to stores written before (a curve over one store)")
    parser.add_argument("--seed", type=int, default=0, help="a new one for each --append")
    args = parser.parse_args(argv)
    counts = generate(args.mlflow, args.store, args.runs, args.root, args.seed, append=args.append)
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
