"""The state store: reads and writes sweeps, cells and attempts in SQL (SQLAlchemy; SQLite by default,
PostgreSQL by URL).

The store records intent and state; MLflow records results. Everyone writes here: `orch sweep` (cells,
submissions), the jobs themselves (start, heartbeat, end: state stays right where `sacct` is unavailable) and the
reconciler (`lost` jobs). The default is `sqlite:///<cwd>/.orch/orch.db` in WAL mode; set `ORCH_STORE` or
`--store` to a `postgresql://` URL for clusters whose jobs run on many nodes.

The tables, their version and the engine are `orchestrator.store_schema`; which state changes are legal is
`orchestrator.states.TRANSITIONS`. Every state this module writes goes through that table: a change of one row is
checked with `check_transition` before it is written (a `TransitionError` rolls the whole call back), and the
bulk updates (`mark`, `end_attempts`) select their rows by the sources the table allows for the new state.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import case, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.states import (
    ACTIVE,
    ORDER,
    State,
    TransitionError,
    check_sources,
    check_transition,
    reported_state,
    sources,
)
from orchestrator.store_schema import (
    AttemptRow,
    CellConfigRow,
    CellRow,
    ConfigRow,
    ProgressRow,
    SweepRow,
    add_tables,
    display_url,
    ensure_schema,
    has_table,
    make_engine,
)
from orchlib.errors import OrchError

T = TypeVar("T")
STORE_ENV = "ORCH_STORE"
DEFAULT_DIR = ".orch"


def default_store_url(workdir: Path | None = None) -> str:
    """`$ORCH_STORE`, else an SQLite file `.orch/orch.db` in `workdir` (the current directory)."""
    if os.environ.get(STORE_ENV):
        return os.environ[STORE_ENV]
    path = (workdir or Path.cwd()).resolve() / DEFAULT_DIR / "orch.db"
    return f"sqlite:///{path}"


@dataclass(frozen=True)
class Submission:
    """A cell handed to an executor: its attempt, the cluster job id and where its logs go."""

    cell_id: int
    attempt_id: int
    job_id: str | None
    stdout_path: str | None = None
    stderr_path: str | None = None


@dataclass(frozen=True)
class Attempt:
    """One attempt as the engine, the local runner and every executor method see it: a detached copy of its row
    (no session behind it) with its cell's resources. `queued_attempts` and `active_attempts` return these."""

    id: int
    cell_id: int
    executor: str
    state: str
    job_id: str | None
    host: str | None
    pid: int | None
    submitted_at: float | None
    heartbeat_at: float | None
    resources_json: str


_ATTEMPT_COLUMNS = (AttemptRow.id, AttemptRow.cell_id, AttemptRow.executor, AttemptRow.state, AttemptRow.job_id,
                    AttemptRow.host, AttemptRow.pid, AttemptRow.submitted_at, AttemptRow.heartbeat_at,
                    CellRow.resources_json)


@dataclass(frozen=True)
class JobContext:
    """What a job needs from the store to run its cell."""

    sweep: str
    sweep_id: int
    parent_run_id: str | None
    cell_id: int
    digest: str
    overrides: list[str]
    mlflow_run_id: str | None
    tracking_uri: str | None
    experiment_name: str
    run_dir: str
    state: str
    requeues: int
    max_requeues: int
    # The config planned for the cell (`recipes.config.resolve.stored_form`: its shared part, its per-cell keys); None
    # in a store written before configs were kept.
    config_json: str | None = None
    cell_json: str | None = None


@dataclass(frozen=True)
class Replacement:
    """`orch resume --replan`: a cell whose settings resolve to another identity now. The old cell leaves the store;
    `fields` (the `cell_fields` of the new identity) make a new pending cell unless the sweep has that digest."""

    cell_id: int
    fields: dict[str, Any]


class Store:
    """Access to one store database. Thread-safe per instance (a session per call)."""

    def __init__(self, url: str, readonly: bool = False) -> None:
        self.url = url
        self.engine = make_engine(url, readonly=readonly)
        self._tables: dict[str, bool] = {}  # tables added within the schema version: present in this store?

    # -- lifecycle ------------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, create: bool = True) -> Store:
        """Connect to `url` (default: `default_store_url()`), creating or checking the schema."""
        store = cls(url or default_store_url())
        store.ensure_schema(create=create)
        return store

    @classmethod
    def open_readonly(cls, url: str | None = None) -> Store:
        """Connect to the existing store at `url` (default: `default_store_url()`) for reading only: nothing is
        created or written, whatever the file holds; `OrchError` (one line) if it is not an orch store."""
        store = cls(url or default_store_url(), readonly=True)
        first_look = make_engine(store.url, readonly=True, first_look=True)  # no file at all next to a stranger
        try:
            ensure_schema(first_look, create=False)
        finally:
            first_look.dispose()
        return store

    def ensure_schema(self, create: bool = True) -> None:
        """Create the tables of an empty database, or check the schema version of an existing one."""
        ensure_schema(self.engine, create=create)

    def display_url(self) -> str:
        """The URL without a password."""
        return display_url(self.engine)

    def dispose(self) -> None:
        """Close pooled connections (before forking, or at exit)."""
        self.engine.dispose()

    # -- sweeps and cells -------------------------------------------------------------------------------------------

    def sweep(self, name: str) -> SweepRow | None:
        """The sweep called `name`, or None."""
        with Session(self.engine, expire_on_commit=False) as session:
            return session.scalars(select(SweepRow).where(SweepRow.name == name)).one_or_none()

    def require_sweep(self, name: str) -> SweepRow:
        """The sweep called `name`; `OrchError` listing the known sweeps otherwise."""
        row = self.sweep(name)
        if row is None:
            from orchlib.errors import choices_error

            raise choices_error("sweep", name, self.sweep_names(), where=f"store {self.display_url()}")
        return row

    def sweep_names(self) -> list[str]:
        """Every sweep name, newest first."""
        with Session(self.engine) as session:
            return list(session.scalars(select(SweepRow.name).order_by(SweepRow.created_at.desc())))

    def sweep_summaries(self) -> list[tuple[SweepRow, dict[str, int]]]:
        """Every sweep, newest first, with its number of cells per state: two queries, whatever the number of
        sweeps (`orch status` without a sweep on a lab's store of thousands)."""
        with Session(self.engine, expire_on_commit=False) as session:
            rows = list(session.scalars(select(SweepRow).order_by(SweepRow.created_at.desc())))
            counts: dict[int, dict[str, int]] = {}
            query = select(CellRow.sweep_id, CellRow.state, func.count()).group_by(CellRow.sweep_id, CellRow.state)
            for sweep_id, state, count in session.execute(query):
                counts.setdefault(sweep_id, {})[state] = count
        return [(row, counts.get(row.id, {})) for row in rows]

    def save_sweep(self, fields: dict[str, Any]) -> SweepRow:
        """Create the sweep `fields["name"]`, or update its fields."""

        def write() -> SweepRow:
            now = time.time()
            with Session(self.engine, expire_on_commit=False) as session, session.begin():
                row = session.scalars(select(SweepRow).where(SweepRow.name == fields["name"])).one_or_none()
                if row is None:
                    row = SweepRow(created_at=now, **fields)
                    session.add(row)
                else:
                    for key, value in fields.items():
                        setattr(row, key, value)
                row.updated_at = now
            return row

        return _again_on_conflict(write)

    def update_sweep(self, sweep_id: int, **fields: Any) -> None:
        """Set some fields of a sweep."""
        with Session(self.engine) as session, session.begin():
            session.execute(update(SweepRow).where(SweepRow.id == sweep_id).values(updated_at=time.time(), **fields))

    def claim_parent_run(self, sweep_id: int, expected: str | None, experiment_id: str, run_id: str) -> str:
        """Record `run_id` as the sweep's MLflow parent run if the sweep still has `expected` (what the caller read)
        there: one conditional UPDATE. Returns the parent run the sweep has now: `run_id`, or the one another
        process recorded first (the caller then drops its own)."""
        with Session(self.engine) as session, session.begin():
            current = (SweepRow.parent_run_id.is_(None) if expected is None else SweepRow.parent_run_id == expected)
            claimed = session.execute(update(SweepRow).where(SweepRow.id == sweep_id, current).values(
                experiment_id=experiment_id, parent_run_id=run_id, updated_at=time.time())).rowcount
            if claimed:
                return run_id
            return session.scalar(select(SweepRow.parent_run_id).where(SweepRow.id == sweep_id))

    def add_cells(self, sweep_id: int, cells: Sequence[dict[str, Any]]) -> int:
        """Insert the cells whose digest the sweep does not have yet, each with its planned config when given
        (`config_json` and `cell_json`: `recipes.config.resolve.stored_form`, kept in `configs` and `cell_configs`),
        in one transaction; return how many were new. A cell the sweep has already keeps its row and its config."""
        if any(cell.get("config_json") for cell in cells):
            self._add_tables()

        def write() -> int:
            with Session(self.engine) as session, session.begin():
                existing = set(session.scalars(select(CellRow.digest).where(CellRow.sweep_id == sweep_id)))
                return _insert_cells(session, sweep_id, [cell for cell in cells if cell["digest"] not in existing])

        return _again_on_conflict(write)

    def replan(self, sweep_id: int, same: dict[int, dict[str, Any]], replaced: Sequence[Replacement],
               active: Iterable[str] = ()) -> dict[int, str]:
        """`orch resume --replan`'s write, one transaction: the cells of `same` (cell id -> `cell_fields` of the same
        identity) take their new settings, overrides and config; each `Replacement`'s cell is deleted (its attempts
        and config with it) and its new identity added as a pending cell unless the sweep has that digest. Cells are
        locked first; `OrchError`, and nothing written, if a cell to replace is now in one of the `active` states
        (submitted since it was read), or a cell is gone. Returns {old cell id: the digest of the cell that replaces
        it}."""
        self._add_tables()
        ids = [*same, *(item.cell_id for item in replaced)]
        if not ids:
            return {}
        now = time.time()
        with Session(self.engine) as session, session.begin():
            rows = session.execute(select(CellRow.id, CellRow.digest, CellRow.state).where(CellRow.id.in_(ids))
                                   .order_by(CellRow.id).with_for_update()).all()
            old = {item.cell_id for item in replaced}
            busy = [row for row in rows if row.id in old and row.state in {str(state) for state in active}]
            if busy or len(rows) != len(ids):
                what = f"cell {busy[0].digest} is {busy[0].state} now" if busy else "a cell was removed meanwhile"
                raise OrchError(f"{what} (another orch changed the sweep meanwhile); nothing replanned: run it again")
            if same:
                session.execute(update(CellRow), [
                    {"id": cell_id, "settings_json": fields["settings_json"],
                     "overrides_json": fields["overrides_json"], "updated_at": now}
                    for cell_id, fields in same.items()])
                session.execute(delete(CellConfigRow).where(CellConfigRow.cell_id.in_(list(same))))
                _store_configs(session, [(cell_id, fields) for cell_id, fields in same.items()], now)
            if old:
                session.execute(delete(CellConfigRow).where(CellConfigRow.cell_id.in_(list(old))))
                session.execute(delete(CellRow).where(CellRow.id.in_(list(old))))  # attempts, progress: ON DELETE CASCADE
            existing = set(session.scalars(select(CellRow.digest).where(CellRow.sweep_id == sweep_id)))
            new, seen = [], set()
            for item in replaced:
                if item.fields["digest"] not in existing | seen:
                    seen.add(item.fields["digest"])
                    new.append(item.fields)
            _insert_cells(session, sweep_id, new)
        return {item.cell_id: item.fields["digest"] for item in replaced}

    def cell_rows(self, sweep_id: int, digests: Iterable[str] | None = None,
                  states: Iterable[str] | None = None) -> list[CellRow]:
        """Cells of a sweep (optionally only these digests or states), in sweep order."""
        query = select(CellRow).where(CellRow.sweep_id == sweep_id)
        if digests is not None:
            query = query.where(CellRow.digest.in_(list(digests)))
        if states is not None:
            query = query.where(CellRow.state.in_([str(state) for state in states]))
        with Session(self.engine, expire_on_commit=False) as session:
            return list(session.scalars(query.order_by(CellRow.position)))

    def find_cells(self, sweep_id: int, prefixes: Iterable[str]) -> list[CellRow]:
        """Cells whose digest starts with one of `prefixes` (each must match exactly one cell)."""
        rows = self.cell_rows(sweep_id)
        found = []
        for prefix in prefixes:
            matched = [row for row in rows if row.digest.startswith(prefix)]
            if len(matched) != 1:
                problem = "matches no cell" if not matched else f"matches {len(matched)} cells; give more digits"
                raise OrchError(f"cell {prefix!r} {problem} of this sweep")
            found.append(matched[0])
        return found

    def set_run_ids(self, run_ids: dict[int, str]) -> None:
        """Record the MLflow child run created for each cell id."""
        if not run_ids:
            return
        with Session(self.engine) as session, session.begin():
            session.execute(
                update(CellRow),
                [{"id": cell_id, "mlflow_run_id": run_id} for cell_id, run_id in run_ids.items()],
            )

    def counts(self, sweep_id: int) -> dict[str, int]:
        """Number of cells per state."""
        with Session(self.engine) as session:
            rows = session.execute(
                select(CellRow.state, func.count()).where(CellRow.sweep_id == sweep_id).group_by(CellRow.state)
            )
            return {state: count for state, count in rows}

    def status_rows(self, sweep_id: int, limit: int | None = None) -> list[dict[str, Any]]:
        """Light rows for `orch status` (no ORM objects, with the latest attempt's `heartbeat_at`): every cell in
        sweep order, or the first `limit` cells in display order (active states first, see `states.ORDER`),
        chosen by the database."""
        columns = (CellRow.id, CellRow.digest, CellRow.position, CellRow.axis, CellRow.seed, CellRow.state,
                   CellRow.attempts, CellRow.job_id, CellRow.varied_json, CellRow.steps_done, CellRow.reason,
                   CellRow.mlflow_run_id, CellRow.updated_at, AttemptRow.heartbeat_at)
        latest = (AttemptRow.cell_id == CellRow.id) & (AttemptRow.number == CellRow.attempts)
        progress = self._has_progress()
        if progress:
            columns = (*columns, ProgressRow.progress_json)
        query = select(*columns).outerjoin(AttemptRow, latest)
        if progress:
            query = query.outerjoin(ProgressRow, ProgressRow.attempt_id == AttemptRow.id)
        query = query.where(CellRow.sweep_id == sweep_id)
        if limit is None:
            query = query.order_by(CellRow.position)
        else:
            rank = case({str(state): index for index, state in enumerate(ORDER)}, value=CellRow.state, else_=len(ORDER))
            query = query.order_by(rank, CellRow.position).limit(limit)
        with Session(self.engine) as session:
            rows = [dict(row._mapping) for row in session.execute(query)]
        for row in rows:
            row["progress"] = json.loads(row.pop("progress_json", None) or "null")
        return rows

    def _has_progress(self) -> bool:
        """Whether the store has the progress table (an older store opened read-only may not)."""
        return self._has_table(ProgressRow.__tablename__)

    def _has_table(self, name: str) -> bool:
        """Whether the store has table `name`, one added within the schema version (looked up once: a table is never
        dropped; `_add_tables` records its creation)."""
        if not self._tables.get(name):
            self._tables[name] = has_table(self.engine, name)
        return self._tables[name]

    def _add_tables(self) -> None:
        """Create the tables an older store lacks before writing to one (`store_schema.add_tables`)."""
        if not self._has_table(CellConfigRow.__tablename__):
            add_tables(self.engine)
            self._tables.clear()

    # -- submissions and job reports --------------------------------------------------------------------------------

    def record_submissions(self, executor: str, cell_ids: Sequence[int], job_id: str | None = None,
                           only_states: Iterable[str] | None = None) -> dict[int, int]:
        """Open a queued attempt per cell (before the cluster sees it, so a fast job finds it); the cells become
        queued. `job_id` is known up front for in-process runs only. Returns {cell_id: attempt_id}.

        Without `only_states`, `TransitionError`, and nothing written, if a cell may not be submitted (see
        `states.TRANSITIONS`). With it, this is a claim: the cells are locked and only those still in one of
        `only_states` are submitted; the others were claimed (or cancelled) by another process since the caller
        read them, and are left out of the result. Two `orch sweep` of one file thus submit each cell once."""
        allowed = None if only_states is None else {
            str(state) for state in check_sources(only_states, State.QUEUED, "cells to submit")}
        if not cell_ids:
            return {}
        now = time.time()
        with Session(self.engine) as session, session.begin():
            cells = session.execute(select(CellRow.id, CellRow.digest, CellRow.state, CellRow.attempts)
                                    .where(CellRow.id.in_(cell_ids)).order_by(CellRow.id).with_for_update())
            numbers = {}
            for cell in cells:
                if allowed is not None and cell.state not in allowed:
                    continue
                check_transition(cell.state, State.QUEUED, f"cell {cell.digest}")
                numbers[cell.id] = cell.attempts
            claimed = [cell_id for cell_id in cell_ids if cell_id in numbers]
            if not claimed:
                return {}
            created = session.execute(insert(AttemptRow).returning(AttemptRow.cell_id, AttemptRow.id), [
                {"cell_id": cell_id, "number": numbers[cell_id] + 1, "executor": executor, "state": State.QUEUED,
                 "submitted_at": now, "job_id": job_id}
                for cell_id in claimed
            ])
            attempt_ids = dict(created.all())
            session.execute(update(CellRow), [
                {"id": cell_id, "state": State.QUEUED, "attempts": numbers[cell_id] + 1, "job_id": job_id,
                 "reason": None, "updated_at": now}
                for cell_id in claimed
            ])
            return attempt_ids

    def assign_jobs(self, submissions: Sequence[Submission]) -> None:
        """Record the cluster job id and log paths of submitted attempts."""
        if not submissions:
            return
        with Session(self.engine) as session, session.begin():
            session.execute(update(AttemptRow), [
                {"id": item.attempt_id, "job_id": item.job_id, "stdout_path": item.stdout_path,
                 "stderr_path": item.stderr_path}
                for item in submissions
            ])
            session.execute(update(CellRow), [{"id": item.cell_id, "job_id": item.job_id} for item in submissions])

    def queued_attempts(self, sweep_id: int, executor: str) -> list[Attempt]:
        """Attempts of `executor` waiting for a job (no job id yet), in sweep order (for the local runner). A cell
        just claimed by `orch sweep` is left out until its MLflow run is recorded (its job attaches to it)."""
        with Session(self.engine) as session:
            rows = session.execute(
                select(*_ATTEMPT_COLUMNS).join(CellRow, CellRow.id == AttemptRow.cell_id)
                .where(CellRow.sweep_id == sweep_id, AttemptRow.executor == executor,
                       AttemptRow.state == State.QUEUED, AttemptRow.job_id.is_(None),
                       CellRow.mlflow_run_id.is_not(None))
                .order_by(CellRow.position)
            )
            return [Attempt(*row) for row in rows]

    def cell_states(self, cell_ids: Sequence[int]) -> dict[int, str]:
        """Current state of each cell id."""
        with Session(self.engine) as session:
            return dict(session.execute(select(CellRow.id, CellRow.state).where(CellRow.id.in_(list(cell_ids)))).all())

    def job_context(self, cell_id: int) -> JobContext:
        """Everything the job of `cell_id` reads from the store."""
        configs = self._has_table(CellConfigRow.__tablename__)  # before the session: SQLite would wait for itself
        with Session(self.engine) as session:
            cell = session.get(CellRow, cell_id)
            if cell is None:
                raise OrchError(f"store {self.display_url()}: no cell with id {cell_id}")
            sweep = session.get(SweepRow, cell.sweep_id)
            config = session.execute(
                select(ConfigRow.config_json, CellConfigRow.cell_json).join(ConfigRow, ConfigRow.id ==
                                                                            CellConfigRow.config_id)
                .where(CellConfigRow.cell_id == cell_id)).first() if configs else None
            return JobContext(
                sweep=sweep.name, sweep_id=sweep.id, parent_run_id=sweep.parent_run_id, cell_id=cell.id, digest=cell.digest, overrides=json.loads(cell.overrides_json),
                mlflow_run_id=cell.mlflow_run_id, tracking_uri=sweep.tracking_uri, experiment_name=sweep.name,
                run_dir=sweep.run_dir, state=cell.state, requeues=cell.requeues,
                max_requeues=_max_requeues(sweep), config_json=config.config_json if config else None,
                cell_json=config.cell_json if config else None,
            )

    def stored_configs(self, cell_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """The planned config of each of `cell_ids` that has one: cell id -> (its `configs` text, its `cell_json`);
        a cell of a store written before configs were stored has none."""
        if not cell_ids or not self._has_table(CellConfigRow.__tablename__):
            return {}
        with Session(self.engine) as session:
            rows = session.execute(
                select(CellConfigRow.cell_id, ConfigRow.config_json, CellConfigRow.cell_json)
                .join(ConfigRow, ConfigRow.id == CellConfigRow.config_id)
                .where(CellConfigRow.cell_id.in_(list(cell_ids))))
            return {cell_id: (shared, own) for cell_id, shared, own in rows}

    def job_started(self, cell_id: int, executor: str, job_id: str | None, host: str, pid: int,
                    stdout_path: str | None = None, stderr_path: str | None = None,
                    attempt_id: int | None = None) -> int | None:
        """The job of `cell_id` started: reuse its queued attempt for this job id, or open a new attempt (a
        requeued job restarting: a restart the job did not ask for, by `scontrol requeue` or a node failure,
        counts as a requeue too). The cell becomes running. Returns the attempt id, or None when the job must not
        run: the cell was cancelled meanwhile, the cell was submitted again since the job's own submission
        (`attempt_id`, the attempt the job was submitted for: a cancel and a resume replaced it), or this restart
        is one more than `cluster.max_requeues` (the cell is then failed, with the reason); `TransitionError` if
        the cell may not start (finished...)."""
        now = time.time()
        with Session(self.engine) as session, session.begin():
            cell = session.get(CellRow, cell_id, with_for_update=True)
            if cell.state == State.CANCELLED:
                return None
            latest = session.scalars(
                select(AttemptRow).where(AttemptRow.cell_id == cell_id).order_by(AttemptRow.number.desc()).limit(1)
            ).first()
            if (attempt_id is not None and latest is not None and latest.id != attempt_id
                    and (job_id is None or latest.job_id != job_id)):
                return None  # superseded: a newer submission of the cell owns it (not a restart of this job)
            check_transition(cell.state, State.RUNNING, f"cell {cell.digest}")
            reusable = latest is not None and latest.state == State.QUEUED and (
                job_id is None or latest.job_id in (None, job_id))
            if not reusable:
                latest = _restart_attempt(session, cell, latest, executor, job_id, now)
                limit = _max_requeues(session.get(SweepRow, cell.sweep_id))
                if cell.requeues > limit:  # every restart counts, whoever requeued the job
                    reason = f"restarted {cell.requeues} times (cluster.max_requeues={limit}); not running it again"
                    for row, what in ((latest, _attempt_name(cell, latest)), (cell, f"cell {cell.digest}")):
                        _move(row, State.FAILED, what)
                        row.reason = reason
                    latest.ended_at = cell.updated_at = now
                    return None
            latest.job_id = job_id = job_id or latest.job_id
            _move(latest, State.RUNNING, _attempt_name(cell, latest))
            latest.started_at = latest.heartbeat_at = now
            latest.host, latest.pid = host, pid
            latest.stdout_path = stdout_path or latest.stdout_path
            latest.stderr_path = stderr_path or latest.stderr_path
            _move(cell, State.RUNNING, f"cell {cell.digest}")
            cell.job_id, cell.reason, cell.updated_at = job_id, None, now
            session.flush()
            return latest.id

    def heartbeat(self, attempt_id: int, progress: dict[str, Any] | None = None) -> None:
        """The job is alive; `progress`: what its trainer reported last (`recipes.run.progress`), kept per attempt."""
        now = time.time()
        with Session(self.engine) as session, session.begin():
            session.execute(update(AttemptRow).where(AttemptRow.id == attempt_id).values(heartbeat_at=now))
            if progress is not None:
                values = {"progress_json": json.dumps(progress), "updated_at": now}
                row = session.get(ProgressRow, attempt_id)  # one writer per attempt: its own job
                if row is None:
                    session.add(ProgressRow(attempt_id=attempt_id, **values))
                else:
                    row.progress_json, row.updated_at = values["progress_json"], now

    def job_ended(self, attempt_id: int, state: str, reason: str | None = None, exit_code: int | None = None,
                  steps_done: int | None = None, mlflow_run_id: str | None = None) -> str:
        """The job ended in `state`. A requeue request on a cancelled cell becomes `cancelled`; the late report of a
        cancelled attempt whose cell has been resumed since changes only that attempt's end fields. Returns the state
        recorded for the cell; `TransitionError`, and nothing written, if the attempt or its cell may not take it
        (e.g. the cell finished already, or was submitted again since)."""
        now = time.time()
        with Session(self.engine) as session, session.begin():
            cell_id = session.scalar(select(AttemptRow.cell_id).where(AttemptRow.id == attempt_id))
            if cell_id is None:
                raise OrchError(f"store {self.display_url()}: no attempt with id {attempt_id}")
            cell = session.get(CellRow, cell_id, with_for_update=True)
            attempt = session.get(AttemptRow, attempt_id)  # read under the cell's lock
            if attempt.state == State.CANCELLED and attempt.number < cell.attempts:
                # A cancelled job reporting late, after the cell was resumed: its end is noted on its attempt; the
                # cell belongs to the newer attempt now.
                attempt.ended_at, attempt.exit_code, attempt.steps_done = now, exit_code, steps_done
                return State.CANCELLED
            state = reported_state(cell.state, state)
            _move(attempt, state, _attempt_name(cell, attempt))
            attempt.ended_at, attempt.reason = now, reason
            attempt.exit_code, attempt.steps_done = exit_code, steps_done
            _move(cell, state, f"cell {cell.digest}")
            cell.reason, cell.updated_at = reason, now
            if steps_done is not None:
                cell.steps_done = steps_done
            if mlflow_run_id:
                cell.mlflow_run_id = mlflow_run_id
            if state == State.REQUEUED:
                cell.requeues += 1
            return state

    def mark(self, cell_ids: Sequence[int], state: str, reason: str, only_states: Iterable[str] = ACTIVE) -> int:
        """Set cells (and their latest attempts, in the same states) to `state` if they are in `only_states`.
        Returns how many. `TransitionError` if one of `only_states` may not become `state` (see
        `states.TRANSITIONS`): the table decides which rows the update may select."""
        allowed = [str(item) for item in check_sources(only_states, state, f"cells to mark {state}")]
        if not cell_ids:
            return 0
        now = time.time()
        with Session(self.engine) as session, session.begin():
            # One conditional UPDATE: a cell that changed state since the caller looked (a job ended, another
            # process submitted or cancelled it) is changed only if it is still in an allowed state.
            ids = list(session.scalars(
                update(CellRow).where(CellRow.id.in_(list(cell_ids)), CellRow.state.in_(allowed))
                .values(state=state, reason=reason, updated_at=now).returning(CellRow.id)
            ))
            if not ids:
                return 0
            latest = (select(CellRow.attempts).where(CellRow.id == AttemptRow.cell_id).scalar_subquery())
            session.execute(update(AttemptRow)
                            .where(AttemptRow.cell_id.in_(ids), AttemptRow.number == latest,
                                   AttemptRow.state.in_(allowed))
                            .values(state=state, reason=reason, ended_at=now))
            return len(ids)

    def end_attempts(self, attempt_ids: Sequence[int], state: str, reason: str) -> int:
        """End attempts whose job vanished, if each is still its cell's open latest attempt (a newer submission
        is never touched); their cells take `state`. Returns how many were ended. Open means active and allowed
        to become `state` by `states.TRANSITIONS`, for the attempt and for its cell alike."""
        open_states = ACTIVE & sources(state)
        if not open_states:
            raise TransitionError(f"end attempts: no open attempt may become '{state}'")
        now = time.time()
        ended = 0
        with Session(self.engine) as session, session.begin():
            for attempt in session.scalars(select(AttemptRow).where(AttemptRow.id.in_(list(attempt_ids)))):
                cell = session.get(CellRow, attempt.cell_id, with_for_update=True)
                if (attempt.state not in open_states or attempt.number != cell.attempts
                        or cell.state not in open_states):
                    continue
                _move(attempt, state, _attempt_name(cell, attempt))
                attempt.reason, attempt.ended_at = reason, now
                _move(cell, state, f"cell {cell.digest}")
                cell.reason, cell.updated_at = reason, now
                ended += 1
        return ended

    def open_attempts(self, sweep_id: int, job_id: str) -> dict[int, str]:
        """{attempt id: state} of the open attempts of the sweep run by cluster job `job_id`."""
        with Session(self.engine) as session:
            return dict(session.execute(
                select(AttemptRow.id, AttemptRow.state).join(CellRow, CellRow.id == AttemptRow.cell_id)
                .where(CellRow.sweep_id == sweep_id, AttemptRow.job_id == job_id,
                       AttemptRow.state.in_([str(state) for state in ACTIVE]))
            ).tuples().all())

    def active_attempts(self, sweep_id: int) -> list[Attempt]:
        """The latest attempt of each active cell (queued, running, or requeued and waiting to restart), for
        reconciliation with the cluster."""
        with Session(self.engine) as session:
            rows = session.execute(
                select(*_ATTEMPT_COLUMNS).join(CellRow, CellRow.id == AttemptRow.cell_id)
                .where(CellRow.sweep_id == sweep_id, CellRow.state.in_([str(s) for s in ACTIVE]),
                       AttemptRow.number == CellRow.attempts)
            )
            return [Attempt(*row) for row in rows]

    def attempts_by_id(self, attempt_ids: Sequence[int]) -> list[AttemptRow]:
        """The attempts with these ids."""
        with Session(self.engine, expire_on_commit=False) as session:
            return list(session.scalars(select(AttemptRow).where(AttemptRow.id.in_(list(attempt_ids)))))

    def attempts(self, cell_id: int) -> list[AttemptRow]:
        """Every attempt of a cell, oldest first."""
        with Session(self.engine, expire_on_commit=False) as session:
            return list(session.scalars(select(AttemptRow).where(AttemptRow.cell_id == cell_id)
                                        .order_by(AttemptRow.number)))


CONFIG_FIELDS = ("config_json", "cell_json")  # a cell's planned config in `cell_fields`: not columns of `cells`


def _insert_cells(session: Session, sweep_id: int, cells: Sequence[dict[str, Any]]) -> int:
    """Insert `cells` (store columns, and optionally their `CONFIG_FIELDS`) as pending cells of the sweep, with
    their configs; returns how many."""
    if not cells:
        return 0
    now = time.time()
    rows = [{**{key: value for key, value in cell.items() if key not in CONFIG_FIELDS}, "sweep_id": sweep_id,
             "state": State.PENDING, "attempts": 0, "requeues": 0, "created_at": now, "updated_at": now}
            for cell in cells]
    session.connection().execute(CellRow.__table__.insert(), rows)  # Core executemany: fast for 10,000 rows
    if any(cell.get("config_json") for cell in cells):
        ids = dict(session.execute(select(CellRow.digest, CellRow.id).where(CellRow.sweep_id == sweep_id)).all())
        _store_configs(session, [(ids[cell["digest"]], cell) for cell in cells], now)
    return len(rows)


def _store_configs(session: Session, cells: Sequence[tuple[int, dict[str, Any]]], now: float) -> None:
    """Keep the planned config of each (cell id, its fields) that has one: its shared part once in `configs` (keyed
    by the SHA-256 of its text; a shape's cells share one text), its per-cell keys in `cell_configs`."""
    cells = [(cell_id, fields) for cell_id, fields in cells if fields.get("config_json")]
    if not cells:
        return
    keys: dict[str, str] = {}
    for _, fields in cells:
        if fields["config_json"] not in keys:
            keys[fields["config_json"]] = hashlib.sha256(fields["config_json"].encode()).hexdigest()
    known = set(session.scalars(select(ConfigRow.id).where(ConfigRow.id.in_(list(set(keys.values()))))))
    connection = session.connection()
    new = [{"id": key, "config_json": text, "written_by": _orch_version(), "created_at": now}
           for text, key in keys.items() if key not in known]
    if new:
        connection.execute(ConfigRow.__table__.insert(), new)
    connection.execute(CellConfigRow.__table__.insert(), [
        {"cell_id": cell_id, "config_id": keys[fields["config_json"]], "cell_json": fields.get("cell_json") or "{}"}
        for cell_id, fields in cells])


@functools.cache
def _orch_version() -> str:
    """This orch's version (the package's), which `cell_configs.written_by` records."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"orch {version('orch')}"
    except PackageNotFoundError:
        return "orch (not installed)"


def _again_on_conflict(write: Callable[[], T]) -> T:
    """`write()`, run a second time if it lost a race to insert the same unique row (PostgreSQL lets two
    transactions read "absent" and insert; SQLite's up-front write lock never does): the second run finds the row
    the winner wrote, and updates or skips it."""
    try:
        return write()
    except IntegrityError:
        return write()


def _move(row: CellRow | AttemptRow, state: str, what: str) -> None:
    """Set the state of a cell or attempt row, if `states.TRANSITIONS` allows it (`TransitionError` otherwise)."""
    row.state = check_transition(row.state, state, what)


def _max_requeues(sweep: SweepRow) -> int:
    """The sweep's `cluster.max_requeues` (5 when its cluster settings do not say)."""
    return int(json.loads(sweep.cluster_json).get("max_requeues", 5))


def _attempt_name(cell: CellRow, attempt: AttemptRow) -> str:
    return f"attempt {attempt.number} of cell {cell.digest}"


def _restart_attempt(session: Session, cell: CellRow, latest: AttemptRow | None, executor: str,
                     job_id: str | None, now: float) -> AttemptRow:
    """A new queued attempt for a job that restarts; the previous one becomes lost if it was left open."""
    if latest is not None and latest.state in (State.QUEUED, State.RUNNING):
        _move(latest, State.LOST, _attempt_name(cell, latest))
        latest.ended_at, latest.reason = now, "restarted by the cluster without reporting an end"
        cell.requeues += 1  # a requeue the job did not report (a reported one was counted by `job_ended`)
    previous_job = latest.job_id if latest is not None else None
    attempt = AttemptRow(cell_id=cell.id, number=cell.attempts + 1, executor=executor,
                         job_id=job_id or previous_job, state=State.QUEUED, submitted_at=now)
    session.add(attempt)
    cell.attempts += 1
    return attempt
