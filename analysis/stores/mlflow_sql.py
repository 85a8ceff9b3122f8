"""The bulk reader: MLflow's SQL tracking schema read directly with SQLAlchemy (SQLite and PostgreSQL stores).

Tables and columns read (stable across MLflow 2.x and 3.x; :func:`schema_problem` checks them):

    experiments(experiment_id, name, lifecycle_stage)
    runs(run_uuid, experiment_id, name, status, start_time, end_time, lifecycle_stage, artifact_uri)
    params(run_uuid, key, value), tags(run_uuid, key, value), latest_metrics(run_uuid, key)
    metrics(run_uuid, key, step, timestamp, value, is_nan)
    alembic_version(version_num)

A store is read here only when its alembic revision is one of the revisions of the installed MLflow's own migration
chain (the files of ``mlflow/store/db_migrations/versions``) and every column above exists; anything else (a store
written by a newer MLflow, a changed table) goes through :mod:`analysis.stores.mlflow_client`. A ``--filter`` expression
is evaluated by MLflow itself (``MlflowClient.search_runs``), so its semantics are MLflow's exactly; everything else
is a handful of queries, whatever the number of runs and metrics.
"""

from __future__ import annotations

import importlib.util
import itertools
import operator
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.stores.mlflow_query import Progress, RawRuns, RunQuery, select_metric_keys, uri_scheme
from orchlib.errors import OrchError
from orchlib.sqlurl import readonly_url

if TYPE_CHECKING:
    import sqlalchemy as sa

REQUIRED_COLUMNS = {
    "experiments": {"experiment_id", "name", "lifecycle_stage"},
    "runs": {"run_uuid", "experiment_id", "name", "status", "start_time", "end_time", "lifecycle_stage", "artifact_uri"},
    "params": {"run_uuid", "key", "value"},
    "tags": {"run_uuid", "key", "value"},
    "latest_metrics": {"run_uuid", "key"},
    "metrics": {"run_uuid", "key", "step", "timestamp", "value", "is_nan"},
    "alembic_version": {"version_num"},
}
NOT_MLFLOW = "not an MLflow tracking database"
CHUNK = 500  # run ids per IN (...) list: far below every backend's bound-parameter limit
METRICS_QUERY = "per_run"  # how metric_rows reads histories: "per_run" or "batched" (measured: docs/analysis.md)


@cache
def known_revisions() -> frozenset[str]:
    """Alembic revisions of the installed MLflow's migration chain (read from file names, without importing it)."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    versions = Path(next(iter(spec.submodule_search_locations))) / "store" / "db_migrations" / "versions"
    return frozenset(path.name.split("_", 1)[0] for path in versions.glob("*_*.py"))


def _engine(uri: str, first_look: bool = False) -> sa.Engine:
    import sqlalchemy as sa

    if uri_scheme(uri) == "sqlite":
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        if path and path != ":memory:" and not Path(path).is_file():
            raise OrchError(f"{uri}: no MLflow store there (file {path} does not exist); set --tracking-uri or MLFLOW_TRACKING_URI")
    try:
        return sa.create_engine(readonly_url(uri, first_look))  # reading never creates or changes anything in it
    except Exception as err:  # missing DB driver, malformed URI
        raise OrchError(f"{uri}: cannot open the tracking store: {err}") from None


def schema_problem(uri: str) -> str | None:
    """Why the bulk reader cannot read this store (None when it can)."""
    import sqlalchemy as sa

    engine = _engine(uri, first_look=True)  # a first look: creates nothing, even beside a WAL-mode file
    try:
        inspector = sa.inspect(engine)
        tables = set(inspector.get_table_names())
        missing = sorted(set(REQUIRED_COLUMNS) - tables)
        if missing:
            return f"{NOT_MLFLOW} (missing tables {', '.join(missing)})"
        with engine.connect() as conn:
            revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        if revision not in known_revisions():
            return f"schema revision {revision} is unknown to the installed MLflow"
        for table, columns in REQUIRED_COLUMNS.items():
            absent = columns - {column["name"] for column in inspector.get_columns(table)}
            if absent:
                return f"table {table} lacks columns {', '.join(sorted(absent))}"
    except sa.exc.SQLAlchemyError as err:
        raise OrchError(f"{uri}: cannot read the tracking store: {str(err).splitlines()[0]}") from None
    finally:
        engine.dispose()
    return None


def _tables() -> dict[str, sa.TableClause]:
    import sqlalchemy as sa

    return {
        name: sa.table(name, *(sa.column(column) for column in sorted(columns)))
        for name, columns in REQUIRED_COLUMNS.items()
    }


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[start : start + CHUNK] for start in range(0, len(ids), CHUNK)]


def fetch_tuples(conn: sa.Connection, stmt: sa.Select) -> list[tuple]:
    """Run ``stmt`` and return plain tuples (see :func:`fetch_each`)."""
    return next(fetch_each(conn, stmt, None, [None]))[1]


def fetch_each(
    conn: sa.Connection, stmt: sa.Select, name: str | None, values: Iterable[Any]
) -> Iterator[tuple[Any, list[tuple]]]:
    """Run ``stmt`` once per value of its bind parameter ``name`` and yield (value, rows as plain tuples).

    The statement is compiled once by SQLAlchemy for the connection's dialect and executed on the DBAPI cursor:
    SQLAlchemy's Row objects cost more than the query itself at a million rows.
    """
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        for value in values:
            params = dict(compiled.params) if name is None else {**compiled.params, name: value}
            if compiled.positional:
                params = tuple(params[key] for key in compiled.positiontup)
            cursor.execute(compiled.string, params)
            yield value, cursor.fetchall()
    finally:
        cursor.close()


def _experiment_ids(conn: sa.Connection, query: RunQuery) -> list[str] | None:
    """Experiment ids named by the query (None: all); raises OrchError naming the known experiments."""
    import sqlalchemy as sa

    if not query.experiments:
        return None
    t = _tables()["experiments"]
    rows = conn.execute(sa.select(t.c.experiment_id, t.c.name).where(t.c.lifecycle_stage == "active")).all()
    by_name = {name: str(experiment_id) for experiment_id, name in rows}
    unknown = [name for name in query.experiments if name not in by_name]
    if unknown:
        raise OrchError(
            f"unknown experiment {unknown[0]!r}; valid choices: {', '.join(sorted(by_name)) or '(none)'}"
        )
    return [by_name[name] for name in query.experiments]


def _sweep_run_ids(conn: sa.Connection, sweep: str) -> set[str]:
    """Runs of the experiment named ``sweep`` and runs tagged ``sweep=<sweep>``."""
    import sqlalchemy as sa

    from analysis.names import TAG_SWEEP

    t = _tables()
    runs, experiments, tags = t["runs"], t["experiments"], t["tags"]
    # both lookups go by index where orch's lookup indexes exist (`recipes.run.tracking.ensure_lookup_indexes`,
    # added by `orch sweep`); MLflow's schema alone makes them scan every run and every sweep tag
    in_experiment = sa.select(runs.c.run_uuid).join_from(
        runs, experiments, runs.c.experiment_id == experiments.c.experiment_id
    ).where(experiments.c.name == sweep, experiments.c.lifecycle_stage == "active")
    # the key inline, not bound: the lookup index on these tags is partial (`recipes.run.tracking.LOOKUP_INDEXES`)
    tagged = sa.select(tags.c.run_uuid).where(tags.c.key == _inline(TAG_SWEEP), tags.c.value == sweep)
    return {row[0] for row in conn.execute(sa.union(in_experiment, tagged))}


def known_sweeps(conn: sa.Connection) -> list[str]:
    """Values of the ``sweep`` tag in the store, for error messages."""
    import sqlalchemy as sa

    from analysis.names import TAG_SWEEP

    tags = _tables()["tags"]
    stmt = sa.select(tags.c.value).where(tags.c.key == _inline(TAG_SWEEP)).distinct()
    return sorted(row[0] for row in conn.execute(stmt))


def _inline(value: str) -> sa.BindParameter:
    """A literal rendered into the SQL text (a partial index's condition must be visible to the planner)."""
    import sqlalchemy as sa

    return sa.literal(value, literal_execute=True)


def read_runs(uri: str, query: RunQuery, progress: Progress | None = None) -> RawRuns:
    """Read the selected runs with a few bulk queries (see the module docstring)."""
    import sqlalchemy as sa

    t = _tables()
    engine = _engine(uri)
    try:
        with engine.connect() as conn:
            return _read(conn, uri, query, t, progress)
    except sa.exc.SQLAlchemyError as err:
        raise OrchError(f"{uri}: cannot read the tracking store: {str(err).splitlines()[0]}") from None
    finally:
        engine.dispose()


def _read(
    conn: sa.Connection, uri: str, query: RunQuery, t: dict[str, sa.TableClause], progress: Progress | None
) -> RawRuns:
    report = progress or (lambda stage, done, total: None)
    report("reading runs", 0, 3)
    records = _select_runs(conn, uri, query, t)
    run_ids = [record[0] for record in records]
    report("reading params and tags", 1, 3)
    params, tags = (_triples(conn, t[name], run_ids) for name in ("params", "tags"))
    report("reading metric histories", 2, 3)
    metrics = metric_rows(conn, query.metrics, t, sorted(run_ids))  # in id order: rows arrive sorted
    report("reading metric histories", 3, 3)
    return RawRuns(runs=records, params=params, tags=tags, metrics=metrics)


def _select_runs(conn: sa.Connection, uri: str, query: RunQuery, t: dict[str, sa.TableClause]) -> list[tuple]:
    """The active runs the query selects, as :class:`RawRuns` run records."""
    import sqlalchemy as sa

    runs, experiments = t["runs"], t["experiments"]
    experiment_ids = _experiment_ids(conn, query)
    columns = (runs.c.run_uuid, runs.c.experiment_id, experiments.c.name, runs.c.name, runs.c.status,
               runs.c.start_time, runs.c.end_time, runs.c.artifact_uri)
    stmt = (
        sa.select(*columns)
        .join_from(runs, experiments, runs.c.experiment_id == experiments.c.experiment_id)
        .where(runs.c.lifecycle_stage == "active", experiments.c.lifecycle_stage == "active")
    )
    if experiment_ids is not None:
        stmt = stmt.where(runs.c.experiment_id.in_([int(e) for e in experiment_ids]))
    if query.sweep is None:
        records = [(str(r[0]), str(r[1]), *r[2:]) for r in fetch_tuples(conn, stmt)]
    else:  # the sweep's runs by id (an index lookup each), never every run of the store
        members = _sweep_run_ids(conn, query.sweep)
        if not members:
            raise OrchError(
                f"unknown sweep {query.sweep!r}; valid choices: {', '.join(known_sweeps(conn)) or '(none)'}"
            )
        records = []
        for chunk in _chunks(sorted(members)):
            records.extend((str(r[0]), str(r[1]), *r[2:])
                           for r in fetch_tuples(conn, stmt.where(runs.c.run_uuid.in_(chunk))))
    if query.filter_string:
        from analysis.stores.mlflow_client import search_run_ids  # MLflow evaluates its own filter language

        scope = experiment_ids or sorted({record[1] for record in records})
        matching = search_run_ids(uri, scope, query.filter_string) if scope else set()
        records = [record for record in records if record[0] in matching]
    return records


def _triples(conn: sa.Connection, table: sa.TableClause, run_ids: list[str]) -> list[tuple]:
    """(run_id, key, value) of a params or tags table for these runs."""
    import sqlalchemy as sa

    rows: list[tuple] = []
    for chunk in _chunks(run_ids):
        rows.extend(fetch_tuples(conn, sa.select(table.c.run_uuid, table.c.key, table.c.value)
                                 .where(table.c.run_uuid.in_(chunk))))
    return rows


def metric_rows(
    conn: sa.Connection, patterns: tuple[str, ...] | None, t: dict[str, sa.TableClause], run_ids: list[str],
    how: str = METRICS_QUERY,
) -> dict[str, list[tuple]]:
    """run_id -> (key, step, timestamp, value or None) of every logged value of the metrics matching ``patterns``,
    read along MLflow's (run_uuid, key, step) index: one query per run (``how="per_run"``: its rows leave the run id
    out) or one per chunk of runs (``"batched"``); benchmarks/bench_lab_store.py measures both (docs/analysis.md)."""
    import sqlalchemy as sa

    if patterns == ():
        return {}
    latest, history = t["latest_metrics"], t["metrics"]
    available: set[str] = set()
    for chunk in _chunks(run_ids):  # no DISTINCT: with it SQLite walks the whole (key, run_uuid) primary key
        available.update(row[0] for row in fetch_tuples(
            conn, sa.select(latest.c.key).where(latest.c.run_uuid.in_(chunk))))
    keys = select_metric_keys(available, patterns)
    if not keys:
        return {}
    value = sa.case((history.c.is_nan == sa.true(), sa.null()), else_=history.c.value)
    if how == "batched":
        blocks: dict[str, list[tuple]] = {}
        for chunk in _chunks(run_ids):
            stmt = sa.select(history.c.run_uuid, history.c.key, history.c.step, history.c.timestamp, value).where(
                history.c.run_uuid.in_(chunk))
            if patterns is not None:
                stmt = stmt.where(history.c.key.in_(keys))
            for run_id, rows in itertools.groupby(fetch_tuples(conn, stmt), key=operator.itemgetter(0)):
                blocks.setdefault(run_id, []).extend(row[1:] for row in rows)
        return {run_id: blocks[run_id] for run_id in run_ids if run_id in blocks}
    stmt = sa.select(history.c.key, history.c.step, history.c.timestamp, value).where(
        history.c.run_uuid == sa.bindparam("run_id", value="")
    )
    if patterns is not None:
        stmt = stmt.where(history.c.key.in_(keys))
    return {run_id: rows for run_id, rows in fetch_each(conn, stmt, "run_id", run_ids) if rows}
