"""MLflow bookkeeping of one training run: open or attach to the run, params, tags, metrics, artifacts.

Uses `MlflowClient` with an explicit run id (no global active run), so several runs can live in one process.
`default_tracking_uri` is the one rule for where runs go when no URI is given, and `mlflow_client` the one way to
open a tracking store, for training, sweeps and analysis.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError, hide_password, missing_driver
from orchlib.locks import file_lock
from orchlib.sqlurl import sqlite_tables

PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value
MAX_PENDING = 200_000  # buffered metrics (some 40 MB) before a run whose tracking store is down stops
RETRY_S = 15.0  # a store that failed is tried again at most this often (each try may wait out the client's retries)
PENDING_FILE = "pending_metrics.jsonl"  # metrics a stopped run could not write, beside its checkpoint

log = logging.getLogger(__name__)
TRACKING_SCHEMES = ("databricks", "file", "http", "https", "mssql", "mysql", "postgresql", "sqlite")
PROBE_TIMEOUT_S = 5.0
# Peak memory of the run so far, GB, logged every step under veRL's own name (its workers log the accelerator's):
# the accelerator's peak allocation on cuda, the process's peak resident set on cpu (RAGEN-2 Table 5's memory column).
PEAK_MEMORY_METRIC = "perf/max_memory_allocated_gb"


def peak_memory_gb(device: str) -> float:
    """The peak memory of this process so far, GB: torch's peak allocation on a cuda device, else the process's peak
    resident set size (Linux reports it in KiB)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated(torch.device(device)) / 1024**3
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def default_tracking_uri(explicit: str | None = None, workdir: Path | None = None) -> str:
    """`explicit`, else `$MLFLOW_TRACKING_URI`, else `sqlite:///<workdir>/mlflow.db` (the current directory by
    default; absolute, so that jobs started in another directory write to the same file)."""
    if explicit:
        return explicit
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(workdir or Path.cwd()).resolve() / 'mlflow.db'}"


# pg_advisory_lock key held while MLflow creates or checks its tables in a PostgreSQL database.
MLFLOW_SCHEMA_LOCK = 0x6F726368_6D6C6601  # "orch" "mlf" 1


def mlflow_client(uri: str) -> Any:
    """An `MlflowClient` on `uri` whose store is open. MLflow creates (and migrates) its tables in a new SQL
    database on first use, and processes doing that at the same time break the database for good; here the first
    process creates them while the others wait: a lock file beside an SQLite database (`<file>.lock`), a
    PostgreSQL advisory lock. Other stores (a tracking server, a folder) are opened as they are."""
    from mlflow import MlflowClient

    # MLflow's SQL store logs every database error with its traceback before raising it; orch turns the raised error
    # into one line (an unwritable store) or buffers the metrics (`RunTracker.flush`), so the traceback is noise
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    with _first_use_lock(uri):
        return MlflowClient(tracking_uri=uri)  # opens the store: creates or checks MLflow's tables


# Indexes orch adds to MLflow's SQL schema, which has none for how a sweep's runs are found (runs are indexed by id
# only, tags by (key, run_uuid)): the runs of an experiment, and the runs tagged `sweep=<name>` (a partial index: tag
# values run to 8,000 characters, sweep names are short). Plain indexes beside MLflow's tables: no table or column
# changes, the alembic revision stays MLflow's, so MLflow's schema check and its later migrations are unaffected.
# Measured at 100k runs in docs/analysis.md ("At lab scale").
LOOKUP_INDEXES = (
    ("orch_runs_experiment_id", "runs", "experiment_id", None),
    ("orch_tags_sweep", "tags", "value", "key = 'sweep'"),
)


def ensure_lookup_indexes(uri: str) -> list[str]:
    """Create the missing :data:`LOOKUP_INDEXES` in the SQL tracking store `uri` (an SQLite file or PostgreSQL
    database that MLflow's tables are in; nothing for other stores); returns the names created. PostgreSQL builds
    them `CONCURRENTLY` (writers are not blocked while a large table is indexed)."""
    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError
    from sqlalchemy.pool import NullPool

    try:
        url = make_url(uri)
    except ArgumentError:  # http://, file:, a folder
        return []
    backend = url.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        return []
    engine = create_engine(url, poolclass=NullPool)
    created = []
    try:
        inspector = inspect(engine)
        tables = set(inspector.get_table_names())
        for name, table, columns, where in LOOKUP_INDEXES:
            if table not in tables or name in {index["name"] for index in inspector.get_indexes(table)}:
                continue
            concurrently = " CONCURRENTLY" if backend == "postgresql" else ""
            ddl = f"CREATE INDEX{concurrently} IF NOT EXISTS {name} ON {table} ({columns})"
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                connection.execute(text(ddl + (f" WHERE {where}" if where else "")))
            created.append(name)
    except SQLAlchemyError as err:  # a read-only database, say: the lookups scan instead
        log.warning("could not add orch's lookup indexes to %s: %s", hide_password(uri), str(err).splitlines()[0])
    finally:
        engine.dispose()
    return created


def experiment_of(client: Any, name: str, tags: dict[str, str] | None = None) -> Any:
    """The experiment called `name`, created (with `tags`) if missing; when several processes create it at once,
    the ones that lose the race get the winner's."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment
    with suppress(MlflowException):  # created meanwhile by another process (other problems show just below)
        client.create_experiment(name, tags=tags)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        raise OrchError(f"MLflow experiment {name!r} could not be created at {client.tracking_uri}")
    return experiment


@contextmanager
def _first_use_lock(uri: str) -> Iterator[bool]:
    """Hold the lock that serialises MLflow's table creation in the SQL database `uri` (none for stores that
    are not SQLite or PostgreSQL); yields whether one is held."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError:  # http://, file:, a folder: MLflow's own business
        yield False
        return
    backend = url.get_backend_name()
    if backend == "sqlite" and url.database and url.database != ":memory:":
        path = Path(url.database)
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(path.with_name(path.name + ".lock")) as locked:
            yield locked
    elif backend == "postgresql":
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(url, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MLFLOW_SCHEMA_LOCK})
                connection.commit()
                try:
                    yield True
                finally:
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MLFLOW_SCHEMA_LOCK})
                    connection.commit()
        finally:
            engine.dispose()
    else:
        yield False


def check_tracking_uri(uri: str, key: str, existing: bool = False) -> None:
    """Refuse, with one line naming `key`, a tracking URI MLflow cannot use: an unknown scheme, a SQLite file that
    is a folder, not a database, another program's database or in a missing folder, a server or database that does
    not answer (probed with a short timeout: MLflow's own client retries for minutes). `existing`: the runs are
    only read, so a SQLite file must already be an MLflow database (MLflow would create one). Writes nothing."""
    from urllib.parse import urlsplit

    where = f"{key} {hide_password(uri)!r}"
    if any(ord(char) < 32 for char in uri):
        raise OrchError(f"{where}: control characters in a URI")
    try:
        scheme = urlsplit(uri).scheme.lower().partition("+")[0]
    except ValueError as err:
        raise OrchError(f"{where}: malformed URI ({err})") from None
    if len(scheme) == 1:  # a Windows drive letter: a path
        scheme = ""
    if scheme and scheme not in TRACKING_SCHEMES:
        raise OrchError(f"{where}: unknown tracking URI scheme {scheme!r}; valid schemes: "
                        f"{', '.join(TRACKING_SCHEMES)} (or a folder path)")
    if scheme == "sqlite":
        _check_sqlite_file(uri, where, existing)
    elif scheme in ("", "file"):
        if not _folder_store_allowed():
            raise OrchError(f"{where}: the installed MLflow keeps folder stores in maintenance mode and opens one only "
                            "with MLFLOW_ALLOW_FILE_STORE=true; use sqlite:///<folder>/mlflow.db (or set it)")
        folder = Path(urlsplit(uri).path if scheme else uri)
        if folder.exists() and not folder.is_dir():
            raise OrchError(f"{where}: {folder} is a file, not an MLflow file-store folder")
        if not folder.exists() and not folder.parent.is_dir():
            raise OrchError(f"{where}: folder {folder.parent} does not exist")
    elif scheme in ("http", "https"):
        _probe_server(uri, where)
    elif scheme in ("postgresql", "mysql", "mssql"):
        check_database_url(uri, where)


def _folder_store_allowed() -> bool:
    """Whether the installed MLflow opens a folder store (`file:`, a path): MLflow 3's folder store refuses to open
    unless `MLFLOW_ALLOW_FILE_STORE` is true; older versions have no such switch and open it."""
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:
        return True
    return bool(MLFLOW_ALLOW_FILE_STORE.get())


def _check_sqlite_file(uri: str, where: str, existing: bool) -> None:
    if not uri.startswith("sqlite:///"):
        raise OrchError(f"{where}: expected sqlite:///relative/path.db or sqlite:////absolute/path.db")
    path = Path(uri.removeprefix("sqlite:///").partition("?")[0])
    if path.is_dir():
        raise OrchError(f"{where}: {path} is a folder, not an SQLite database")
    if not path.exists():
        if existing:
            raise OrchError(f"{where}: no MLflow database there ({path} does not exist)")
        if not path.parent.is_dir():
            raise OrchError(f"{where}: folder {path.parent} does not exist")
        return
    tables = sqlite_tables(path, where)
    if (tables or existing) and not {"experiments", "runs", "alembic_version"} <= tables:
        raise OrchError(f"{where}: {path} is not an MLflow tracking database" + (" (it is empty)" if not tables else ""))


def _probe_server(uri: str, where: str) -> None:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S).close()  # noqa: S310
    except urllib.error.HTTPError:
        return  # it answers (authentication or routing is MLflow's business)
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise OrchError(f"{where}: no MLflow server answers ({reason}); start one with `orch mlflow serve`") from None


def check_database_url(url: str, where: str) -> None:
    """Connect once to a database URL (short timeout); one line naming `where` when it fails or its driver is
    missing (PostgreSQL's: `pip install 'orch[postgres]'`)."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url, connect_args=_timeout_args(url))
    except ModuleNotFoundError as err:
        raise missing_driver(where, url, err.name) from None
    except (sqlalchemy.exc.ArgumentError, ValueError) as err:
        raise OrchError(f"{where}: malformed database URL ({str(err).splitlines()[0]})") from None
    try:
        with engine.connect():
            pass
    except Exception as err:  # noqa: BLE001 - any driver error: the database does not answer as asked
        reason = str(getattr(err, "orig", None) or err).strip().splitlines()
        raise OrchError(f"{where}: cannot connect ({reason[0] if reason else type(err).__name__})") from None
    finally:
        engine.dispose()


def _timeout_args(url: str) -> dict[str, Any]:
    if url.startswith("postgres"):
        return {"connect_timeout": int(PROBE_TIMEOUT_S)}
    if url.startswith("mysql"):
        return {"connect_timeout": int(PROBE_TIMEOUT_S)}
    return {}


def check_writable_folder(path: Path, key: str) -> None:
    """`path` is, or can be created as, a folder this process may write. Proven by creating and removing a probe
    file in the nearest existing ancestor (`os.access` says yes to root everywhere, /proc included); no folder is
    created."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise OrchError(f"{key} {str(path)!r}: {probe} is not a folder")
    if _read_only_mount(probe) or not _can_create_file_in(probe):
        raise OrchError(f"{key} {str(path)!r}: cannot write under {probe}")


def _can_create_file_in(folder: Path) -> bool:
    """Whether a file can be created (and removed) in `folder`, tried for real."""
    try:
        handle, name = tempfile.mkstemp(prefix=".orch-write-probe-", dir=folder)
    except OSError:
        return False
    os.close(handle)
    with suppress(OSError):
        os.unlink(name)
    return True


def _read_only_mount(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_run_targets(infra: Any) -> None:
    """Before a run writes anything: its tracking URI answers and its checkpoint folder can be written."""
    uri = infra.mlflow.tracking_uri
    key = ("config key mlflow.tracking_uri" if uri else
           "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "tracking URI")
    check_tracking_uri(default_tracking_uri(uri), key)
    folder = Path(infra.checkpoint_dir) if infra.checkpoint_dir else Path.cwd() / "checkpoints"
    check_writable_folder(folder, "config key trainer.checkpoint_dir")
    check_cache_folder()


def check_cache_folder() -> None:
    """The cache (warm starts, composed configs) is a folder this process can create or write."""
    from recipes.runtime.cache import cache_root

    check_writable_folder(cache_root(), "$ORCH_CACHE_DIR" if os.environ.get("ORCH_CACHE_DIR") else "cache folder")


UNWRITABLE = ("readonly database", "read-only file system", "unable to open database file", "permission denied",
              "operation not permitted")


def unwritable_store(err: BaseException) -> str | None:
    """What SQLite (through SQLAlchemy and MLflow) says when the tracking store cannot be written -- a read-only
    file, folder or mount, an immutable file -- found down the exception's chain, or None for any other error."""
    todo: list[Any] = [err]
    seen: set[int] = set()
    while todo:
        exc = todo.pop()
        if not isinstance(exc, BaseException) or id(exc) in seen:
            continue
        seen.add(id(exc))
        line = next((line for line in str(exc).splitlines() if any(w in line.lower() for w in UNWRITABLE)), None)
        if line is not None:  # SQLAlchemy's "(sqlite3.OperationalError) attempt to write a readonly database"
            return re.sub(r"^\((?:sqlite3|raised)[^)]*\)\s*", "", " ".join(line.split()))[:200]
        todo += [exc.__cause__, exc.__context__, getattr(exc, "orig", None)]
    return None


class RunTracker:
    """One MLflow run, created or attached.

    Args:
        uri: tracking URI.
        experiment_name: experiment to create the run in (ignored when attaching).
        run_id: attach to this existing run (the sweep pre-creates runs; a resume re-attaches); None creates one.
        run_name: name of a created run.
    """

    def __init__(self, uri: str, experiment_name: str, run_id: str | None, run_name: str | None = None,
                 outage_s: float = 1800.0) -> None:
        from mlflow.exceptions import MlflowException

        self.outage_s = outage_s
        self.pending: list[Any] = []  # metrics the store has not taken yet (`flush`)
        self.outage_since: float | None = None
        self.outage_error = ""
        self._next_try = 0.0
        try:
            self.client = mlflow_client(uri)
            if run_id is not None:
                try:
                    run = self.client.get_run(run_id)
                except MlflowException as err:
                    raise OrchError(f"config key mlflow.run_id: no run {run_id!r} at {uri} ({err.message})") from None
                self.run_id = run.info.run_id
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                experiment_id = experiment_of(self.client, experiment_name).experiment_id
                self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        except OrchError:
            raise
        except Exception as err:  # a store that cannot be written at the run's start: bad input, before any work
            why = unwritable_store(err)
            if why is None:
                raise
            raise OrchError(f"config key mlflow.tracking_uri: {hide_password(uri)} cannot be written ({why}); make "
                            "it writable or choose another store (mlflow.tracking_uri, --tracking-uri)") from None

    def log_params(self, params: dict[str, str]) -> None:
        """Log params not yet on the run (a resumed run keeps its original values)."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        new = [Param(key, value[:PARAM_VALUE_LIMIT]) for key, value in params.items() if key not in existing]
        for start in range(0, len(new), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(self.run_id, params=new[start : start + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set the run's tags; while the store cannot be written (`flush` failed) they are skipped with a warning,
        as artifacts are (a hook's tag is set again at its next change; the metrics are not lost)."""
        try:
            for key, value in tags.items():
                self.client.set_tag(self.run_id, key, value)
        except Exception as err:  # noqa: BLE001 - the store is down: the run trains on
            if self.outage_since is None:
                raise
            log.warning("tags %s not set, the tracking store is down (%s)", sorted(tags),
                        " ".join(str(err).split())[:200])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log one step's metrics. While the store cannot be written they are buffered (`flush`): training goes on."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        self.pending.extend(Metric(key, float(value), stamp, step) for key, value in sorted(metrics.items()))
        if self.outage_since is None or time.monotonic() >= self._next_try:
            self.flush()

    def flush(self) -> bool:
        """Write the buffered metrics, oldest first; True once none is left. A store that cannot be written (the
        server or the network gone, a locked or read-only database) keeps them buffered, says so once, and is tried
        again at most every `RETRY_S` seconds; `store_down` turns true after `outage_s` (or `MAX_PENDING`)."""
        while self.pending:
            chunk = self.pending[:1000]  # MLflow accepts at most 1000 metrics per batch
            try:
                self.client.log_batch(self.run_id, metrics=chunk)
            except Exception as err:  # noqa: BLE001 - whatever the store's client raises, the run trains on
                if getattr(err, "error_code", None) == "INVALID_PARAMETER_VALUE":
                    raise  # a metric MLflow refuses (a bad name or value) is a bug to show, not an outage to wait out
                self.outage_error = unwritable_store(err) or " ".join(str(err).split())[:300]
                self._next_try = time.monotonic() + RETRY_S
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    log.warning("tracking store unreachable (%s): metrics are buffered, training goes on for up to "
                                "%.0f s (mlflow.outage_s)", self.outage_error, self.outage_s)
                return False
            del self.pending[:len(chunk)]
        if self.outage_since is not None:
            log.warning("tracking store back after %.0f s: the buffered metrics are written",
                        time.monotonic() - self.outage_since)
            self.outage_since = None
        return True

    def adopt(self, rows: list[list[Any]], error: str) -> None:
        """Take over metrics another tracker of this run could not write (`[key, value, timestamp, step]` rows: a veRL
        trainer's, in its Ray process), as if this tracker had failed to write them: `tracked_run` then writes them or
        keeps them beside the checkpoint and fails the run resumably."""
        from mlflow.entities import Metric

        self.pending.extend(Metric(key, float(value), int(stamp), int(step)) for key, value, stamp, step in rows)
        if rows and self.outage_since is None:
            self.outage_since, self.outage_error = time.monotonic(), error

    @property
    def store_down(self) -> bool:
        """Whether the store has been unreachable for `outage_s` (or `MAX_PENDING` metrics wait): time to stop."""
        return self.outage_since is not None and (time.monotonic() - self.outage_since > self.outage_s
                                                  or len(self.pending) > MAX_PENDING)

    def spill(self, folder: Path) -> Path | None:
        """Append the metrics the store did not take to `folder/PENDING_FILE` (the next attempt writes them)."""
        if not self.pending:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / PENDING_FILE
        with open(path, "a") as handle:
            for metric in self.pending:
                handle.write(json.dumps([metric.key, metric.value, metric.timestamp, metric.step]) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return path

    def take_spilled(self, folder: Path) -> int:
        """Buffer the metrics a previous attempt spilled in `folder` and write them (before this run's own);
        returns how many. The file goes once they are written."""
        from mlflow.entities import Metric

        path = folder / PENDING_FILE
        if not path.is_file():
            return 0
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        self.pending[:0] = [Metric(key, float(value), int(stamp), int(step)) for key, value, stamp, step in rows]
        if self.flush():
            path.unlink()
        return len(rows)

    def last_logged_step(self, key: str) -> int | None:
        """The largest step at which `key` was logged, or None."""
        history = self.client.get_metric_history(self.run_id, key)
        return max((metric.step for metric in history), default=None)

    def log_run_config(self, cfg: Any, checkpoint_dir: Path) -> None:
        """A training run's config: its params (the flattened `conf/` layout; kept as they are on a resumed run),
        the tags analysis and `orch runs` read, and the whole config as `config.yaml`."""
        import yaml

        from recipes.config.schema import flatten_config

        self.log_params(flatten_config(cfg))
        self.set_tags({"task": cfg.task.name, "algorithm": cfg.algorithm.name, "model": cfg.model.name,
                       "backend": cfg.backend, "filter": cfg.filter.name, "orch.checkpoint_dir": str(checkpoint_dir)})
        self.log_text(yaml.safe_dump(cfg.to_tree(), sort_keys=False), "config.yaml")

    def log_text(self, text: str, artifact_file: str) -> None:
        self._artifact(lambda: self.client.log_text(self.run_id, text, artifact_file), artifact_file)

    def log_file(self, path: Path, artifact_dir: str) -> None:
        self._artifact(lambda: self.client.log_artifact(self.run_id, str(path), artifact_dir),
                       f"{artifact_dir}/{path.name}")

    def _artifact(self, write: Any, name: str) -> None:
        """Write an artifact; while the tracking store is down (`flush` failed) one that cannot be written is skipped
        with a warning (a rollout dump is lost; the metrics are not)."""
        if self.outage_since is None:
            write()
            return
        try:
            write()
        except Exception as err:  # noqa: BLE001 - the store is down: the run trains on
            log.warning("artifact %s not logged, the tracking store is down (%s)", name, " ".join(str(err).split())[:200])

    def log_frame(self, frame: Any, artifact_dir: str, file_name: str) -> None:
        """Write a pandas frame as Parquet and log it under `artifact_dir/file_name`."""
        from recipes.stats.rollouts import write_rollout_batch

        with tempfile.TemporaryDirectory() as scratch:
            path = write_rollout_batch(frame, Path(scratch) / file_name)
            self.log_file(path, artifact_dir)

    def end(self, status: str) -> None:
        """Mark the run FINISHED, FAILED or KILLED (best effort while the store is down: the next attempt does)."""
        if self.outage_since is not None:
            with suppress(Exception):
                self.client.set_terminated(self.run_id, status=status)
            return
        self.client.set_terminated(self.run_id, status=status)


# How a run's end is recorded in MLflow: `recipes.config.backends.TrainResult.status` -> run status.
MLFLOW_STATUS = {"finished": "FINISHED", "stopped": "FINISHED", "preempted": "KILLED", "failed": "FAILED"}


def tracked_run(infra: Any, resumed_run_id: str | None, checkpoint_dir: Path | None, train: Any) -> Any:
    """Run `train(tracker)` inside the run's MLflow run, and record how it ended (tags `orch.status`, `orch.reason`
    and the run's status; FAILED when `train` raises). The run is the configured one (`mlflow.run_id`: the sweep's
    cell run), else the one the checkpoint in `checkpoint_dir` belongs to (`resumed_run_id`), else a new one.

    Raises:
        OrchError: the tracking URI or the checkpoint folder cannot be used, or the configured run is not the
            checkpoint's (before anything is written).
    """
    mlflow = infra.mlflow
    check_run_targets(infra)
    if resumed_run_id and mlflow.run_id and mlflow.run_id != resumed_run_id:
        raise OrchError(
            f"config key mlflow.run_id: {mlflow.run_id} but the checkpoint in {checkpoint_dir} belongs to run "
            f"{resumed_run_id}; use another trainer.checkpoint_dir or trainer.resume=never"
        )
    tracker = RunTracker(default_tracking_uri(mlflow.tracking_uri), mlflow.experiment_name,
                         run_id=mlflow.run_id or resumed_run_id, run_name=mlflow.run_name, outage_s=mlflow.outage_s)
    folder = checkpoint_dir or Path("checkpoints") / tracker.run_id
    spilled = tracker.take_spilled(folder)
    if spilled:
        log.info("wrote %d metrics a previous attempt kept while the tracking store was down", spilled)
    try:
        result = train(tracker)
    except BaseException:
        tracker.flush()
        tracker.spill(folder)
        tracker.end("FAILED")
        raise
    if not tracker.flush():  # the store is still down: keep the metrics beside the checkpoint, stop resumable
        kept = tracker.spill(folder)
        result = type(result)("failed", result.steps_done, result.mlflow_run_id,
                              f"tracking store unreachable ({tracker.outage_error}): stopped after step "
                              f"{result.steps_done}; {len(tracker.pending)} metrics kept in {kept} are written when "
                              "the run resumes (orch resume --retry-failed, or orch train again)")
        tracker.end("FAILED")
        return result
    tracker.set_tags({"orch.status": result.status, "orch.reason": result.reason})
    tracker.end(MLFLOW_STATUS[result.status])
    return result
