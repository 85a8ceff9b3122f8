"""The store's schema: its SQL tables (SQLAlchemy rows), their version, and the engine that reaches them.

    orch_meta  key/value facts about the store (`schema_version`)
    sweeps     one row per sweep: its file as submitted, its folder, its MLflow experiment and parent run
    cells      one row per cell of a sweep (unique digest per sweep): what to run and its current state
    configs    resolved configs as planned, without their per-cell keys (one row per shape: its cells differ only
               in the seed), keyed by the hash of their text, shared by every sweep of the store
    cell_configs  a cell's config as planned: its `configs` row and its per-cell keys; what its job runs
    attempts   one row per run of a cell's job: a submission, or a restart of the same cluster job
    progress   the latest progress its job reported for an attempt (step k of N, phase, last success rate)

Times are UNIX seconds (floats). `ensure_schema` creates the tables of an empty database, or checks that an
existing one has the version this code understands (`SCHEMA_VERSION`); there are no migrations, but a table added
within a version (`progress`; `configs` and `cell_configs`) is created by the next writable open of an older store that may create
(`orch sweep`, `orch tune`), or by `add_tables` before its first write; a reader finds it missing in a store written
before it (`has_table`) and does without it, as that store's own version did. `make_engine`
sets each backend up for many concurrent writers (SQLite in WAL mode with up-front write locks; PostgreSQL with
pre-ping). The rows hold states as plain strings; which changes of them are legal is `orchestrator.states`' job,
and writing them is `orchestrator.store`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy import (
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    insert,
    inspect,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from orchestrator.states import State
from orchlib.errors import OrchError, hide_password, missing_driver
from orchlib.sqlurl import readonly_url, sqlite_tables

SCHEMA_VERSION = 1
SCHEMA_LOCK = 0x6F726368_73746F01  # "orch" "sto" 1: PostgreSQL advisory lock held while creating the schema


class Base(DeclarativeBase):
    """Declarative base of the store's tables."""


class MetaRow(Base):
    """Key/value facts about the store itself (`schema_version`)."""

    __tablename__ = "orch_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class SweepRow(Base):
    """One sweep: its file as submitted, where its files live, and its MLflow experiment and parent run."""

    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    spec_path: Mapped[str] = mapped_column(Text)
    spec_text: Mapped[str] = mapped_column(Text)
    profile: Mapped[str | None] = mapped_column(String(200))
    sets_json: Mapped[str] = mapped_column(Text, default="[]")
    executor: Mapped[str] = mapped_column(String(32))
    cluster_json: Mapped[str] = mapped_column(Text, default="{}")
    varied_json: Mapped[str] = mapped_column(Text, default="[]")
    run_dir: Mapped[str] = mapped_column(Text)
    tracking_uri: Mapped[str | None] = mapped_column(Text)
    experiment_id: Mapped[str | None] = mapped_column(String(64))
    parent_run_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class CellRow(Base):
    """One cell: identity (`digest`), what to run (`overrides_json`), resources, and its current state."""

    __tablename__ = "cells"
    __table_args__ = (
        UniqueConstraint("sweep_id", "digest", name="uq_cell_sweep_digest"),
        Index("ix_cells_sweep_state", "sweep_id", "state"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    digest: Mapped[str] = mapped_column(String(32))
    position: Mapped[int] = mapped_column(Integer)
    axis: Mapped[str | None] = mapped_column(String(200))
    seed: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(32))
    settings_json: Mapped[str] = mapped_column(Text)
    overrides_json: Mapped[str] = mapped_column(Text)
    varied_json: Mapped[str] = mapped_column(Text)
    resources_json: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default=State.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    requeues: Mapped[int] = mapped_column(Integer, default=0)
    job_id: Mapped[str | None] = mapped_column(String(64))
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    steps_done: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class ConfigRow(Base):
    """A resolved config as it was planned, without its per-cell keys (`recipes.config.resolve.stored_form`: its
    `conf/` tree as JSON, hosting keys included): the same text for every seed of a shape, stored once. `id`: the
    SHA-256 of the text. `written_by`: the orch version that first stored it."""

    __tablename__ = "configs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    config_json: Mapped[str] = mapped_column(Text)
    written_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)


class CellConfigRow(Base):
    """A cell's config as it was planned: its `configs` row and its per-cell keys (`cell_json`, `{"seed": 1}`),
    which make the whole `conf/` tree: the object its job validates and runs, whatever `conf/` holds by then.
    Added within schema version 1: the cells of a store written before have none, and their jobs compose their
    `overrides_json` with Hydra, as then."""

    __tablename__ = "cell_configs"
    cell_id: Mapped[int] = mapped_column(ForeignKey("cells.id", ondelete="CASCADE"), primary_key=True)
    config_id: Mapped[str] = mapped_column(ForeignKey("configs.id"))
    cell_json: Mapped[str] = mapped_column(Text)


class AttemptRow(Base):
    """One run of a cell's job: a submission, or a restart of the same cluster job after a requeue."""

    __tablename__ = "attempts"
    __table_args__ = (Index("ix_attempts_cell", "cell_id"), Index("ix_attempts_job", "job_id"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cell_id: Mapped[int] = mapped_column(ForeignKey("cells.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    executor: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    submitted_at: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)
    stdout_path: Mapped[str | None] = mapped_column(Text)
    stderr_path: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str | None] = mapped_column(String(200))
    pid: Mapped[int | None] = mapped_column(Integer)
    steps_done: Mapped[int | None] = mapped_column(Integer)


class ProgressRow(Base):
    """The latest progress an attempt's job reported (its trainer's `recipes.run.progress` file, copied by the job's
    heartbeat): `progress_json` holds step, done, total, phase and success."""

    __tablename__ = "progress"
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"), primary_key=True)
    progress_json: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)


def display_url(engine: Engine) -> str:
    """The engine's URL without a password (a read-only SQLite URL as the plain one)."""
    path = _sqlite_file(engine)
    return f"sqlite:///{path}" if path else engine.url.render_as_string(hide_password=True)


def _sqlite_file(engine: Engine) -> str | None:
    """The database file of an SQLite engine (read-only or not), None for other backends."""
    if engine.url.get_backend_name() != "sqlite" or not engine.url.database:
        return None
    database = engine.url.database
    return unquote(database[len("file:"):]) if engine.url.query.get("uri") else database


def ensure_schema(engine: Engine, create: bool = True) -> None:
    """Create the tables of an empty database (unless `create` is false: then `OrchError`), or check the schema
    version of an existing one. Safe when many processes open a new store at once: the check and the creation are
    one transaction that holds the write lock (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: an advisory lock), so one
    process creates the tables and the version together and the others find both."""
    where = f"store {display_url(engine)}"
    database = _sqlite_file(engine)
    if database and database != ":memory:" and not Path(database).exists():
        if not create:
            raise OrchError(f"{where}: no orch store here (run `orch sweep` first)")
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    elif create and database and database != ":memory:":
        # looked at read-only first: `orch sweep` never turns another program's database (or a text file) into a store
        tables = sqlite_tables(Path(database), where)
        if tables and MetaRow.__tablename__ not in tables:
            raise OrchError(f"{where}: not an orch store (an SQLite database with other tables: "
                            f"{', '.join(sorted(tables)[:5])}); give a new file")
    try:
        with engine.begin() as connection:
            if create and engine.url.get_backend_name() == "postgresql":
                connection.execute(select(func.pg_advisory_xact_lock(SCHEMA_LOCK)))
            tables = set(inspect(connection).get_table_names())
            if MetaRow.__tablename__ not in tables:
                if not create:
                    found = f"it holds other tables ({', '.join(sorted(tables)[:5])})" if tables else "it is empty"
                    raise OrchError(f"{where}: not an orch store ({found}); run `orch sweep` to create one")
                Base.metadata.create_all(connection)
                connection.execute(insert(MetaRow).values(key="schema_version", value=str(SCHEMA_VERSION)))
                return
            value = connection.scalar(select(MetaRow.value).where(MetaRow.key == "schema_version"))
            if create and str(value) == str(SCHEMA_VERSION) and not set(Base.metadata.tables) <= tables:
                Base.metadata.create_all(connection)  # a table added within this version (checkfirst)
    except SQLAlchemyError as err:
        raise OrchError(f"{where}: {err.__class__.__name__}: {_first_line(err)}") from None
    version = int(value) if value else 0
    if version != SCHEMA_VERSION:
        raise OrchError(
            f"{where}: schema version {version}, this orch understands {SCHEMA_VERSION}"
            + ("; upgrade orch" if version > SCHEMA_VERSION else "; no migration exists from it")
        )


def has_table(engine: Engine, name: str) -> bool:
    """Whether the store has table `name` (one added within the schema version may be missing from an older store)."""
    return name in inspect(engine).get_table_names()


def add_tables(engine: Engine) -> None:
    """Create the tables added within this schema version that an existing store lacks (`checkfirst`), under the
    same lock as `ensure_schema`'s creation, so that concurrent writers create each once."""
    with engine.begin() as connection:
        if engine.url.get_backend_name() == "postgresql":
            connection.execute(select(func.pg_advisory_xact_lock(SCHEMA_LOCK)))
        Base.metadata.create_all(connection)


def make_engine(url: str, readonly: bool = False, first_look: bool = False) -> Engine:
    """An engine with the settings each backend needs for many concurrent writers; or, `readonly`, one that
    cannot write (SQLite's `mode=ro`, PostgreSQL's read-only transactions) and changes nothing when it connects
    (`first_look`: no file created beside a file that may not be ours; see `orchlib.sqlurl.readonly_url`)."""
    try:
        if readonly:
            if url.startswith("sqlite"):
                return create_engine(readonly_url(url, first_look=first_look))
            return create_engine(url, pool_pre_ping=True, connect_args={"options": _readonly_options(url)})
        if url.startswith("sqlite"):
            return _sqlite_engine(url)
        return create_engine(url, pool_pre_ping=True)
    except ModuleNotFoundError as err:
        raise missing_driver(f"store {hide_password(url)!r}", url, err.name) from None
    except Exception as err:  # bad URL: one clear line
        raise OrchError(f"store {hide_password(url)!r}: {err}") from None


def _readonly_options(url: str) -> str:
    """libpq `options` for a read-only connection: the URL's own (`?options=-csearch_path%3Dteam` picks the store's
    schema) plus read-only transactions. `connect_args` replaces the URL's `options` rather than adding to it, and a
    read-only look without the URL's search path reads another schema's tables."""
    from sqlalchemy.engine import make_url

    given = make_url(url).query.get("options", ())
    given = [given] if isinstance(given, str) else list(given)
    return " ".join([*given, "-c default_transaction_read_only=on"])


def _sqlite_engine(url: str) -> Engine:
    """SQLite in WAL mode, waiting for locks rather than failing, each transaction taking the write lock."""
    engine = create_engine(url, connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(connection: Any, _record: Any) -> None:
        connection.isolation_level = None  # let the "begin" hook below open transactions
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        # Take the write lock up front: a read-then-write transaction could otherwise fail with "database is
        # locked" when another job commits in between (busy_timeout cannot wait out that case).
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
