"""Load many MLflow runs -- params, tags, status and full metric histories -- into two tidy pandas frames.

MLflow's per-run ``get_metric_history`` costs one round trip per (run, metric); a sweep of 200 runs with 20 metrics
is 4,000 of them. For SQL tracking stores (``sqlite://``, ``postgresql://``) :mod:`analysis.stores.mlflow_sql` reads
MLflow's tables in a few bulk queries instead, after checking the schema revision is one it knows; every other
store (an ``http(s)://`` tracking server, a file store) and any unknown schema go through
:mod:`analysis.stores.mlflow_client` (``search_runs`` + ``get_metric_history``). Both readers hand the same raw records to
:func:`assemble`, so both paths give identical frames (a test checks it).

``RunData.runs``, one row per run, ordered by start time then run id:

    run_id, experiment_id, experiment, run_name, status (FINISHED | RUNNING | FAILED | KILLED | SCHEDULED),
    start_time, end_time (UTC timestamps; end_time NaT while running), artifact_uri,
    params.<key> ... (strings: the flattened resolved config), tags.<key> ... (strings)

``RunData.metrics``, one row per logged value, ordered by run_id, key, step, timestamp, value:

    run_id, key, step (int64), timestamp (int64, ms since the epoch), value (float64; NaN where NaN was logged)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from analysis.stores.mlflow_query import (
    METRIC_COLUMNS,
    RUN_COLUMNS,
    SQL_SCHEMES,
    Progress,
    RawRuns,
    RunQuery,
    uri_scheme,
)
from orchlib.errors import OrchError

if TYPE_CHECKING:
    import pandas as pd

@dataclass(frozen=True)
class RunData:
    """Runs and their metric histories (frames described in the module docstring)."""

    runs: pd.DataFrame
    metrics: pd.DataFrame
    tracking_uri: str
    reader: str  # "sql" (bulk) or "client" (MlflowClient)

    def history(self, key: str) -> pd.DataFrame:
        """The (run_id, step, value) rows of one metric, the last value logged per (run, step): a copy of the one
        found the first time the key was asked (a report asks for the same few keys hundreds of times, each a take
        and a de-duplication of Arrow-backed rows: 50 s at a Table-4 sweep's 3 million values, issue 60)."""
        import numpy as np

        found = self._histories.get(key)
        if found is None:
            rows = self.metrics.iloc[self._rows_by_key.get(key, np.empty(0, dtype=np.intp))]
            rows = rows.drop_duplicates(["run_id", "step"], keep="last")
            found = self._histories[key] = rows[["run_id", "step", "value"]].reset_index(drop=True)
        return found.copy()

    def with_rows(self, rows: pd.DataFrame) -> RunData:
        """This data with ``rows`` (the metrics frame's columns, e.g. a derived metric) appended; what was already
        found of the keys ``rows`` leaves alone (histories, series, row positions) is kept, not found again over
        the whole frame."""
        import numpy as np
        import pandas as pd

        metrics = pd.concat([self.metrics, rows.astype(self.metrics.dtypes.to_dict())], ignore_index=True)
        out = RunData(runs=self.runs, metrics=metrics, tracking_uri=self.tracking_uri, reader=self.reader)
        added = {str(key): positions + len(self.metrics)
                 for key, positions in rows.reset_index(drop=True).groupby("key", sort=False).indices.items()}
        out._histories.update({key: found for key, found in self._histories.items() if key not in added})
        out._series.update({key: found for key, found in self._series.items() if key not in added})
        if "_rows_by_key" in self.__dict__:  # found already: the old rows keep their positions
            by_key = dict(self._rows_by_key)
            for key, positions in added.items():
                by_key[key] = np.concatenate([by_key.get(key, np.empty(0, dtype=np.intp)), positions])
            out.__dict__["_rows_by_key"] = by_key
        return out

    def series(self, key: str) -> dict[str, tuple[Any, Any]]:
        """Each run's (steps, values) numpy arrays of one metric (:meth:`history`'s rows, in step order), by run id
        in sorted order: found once per key (the trend test, the early warning and the figures ask per run, and a
        frame's rows of one run found by comparing run ids cost seconds at a Table-4 sweep, issue 60). Shared:
        do not modify the arrays."""
        import numpy as np

        found = self._series.get(key)
        if found is None:
            history = self._histories.get(key)
            history = self.history(key) if history is None else history
            steps, values = history["step"].to_numpy(dtype=np.int64), history["value"].to_numpy(dtype=np.float64)
            ids = history["run_id"].to_numpy(dtype=object)
            order = np.lexsort((steps, ids.astype(str)))  # by run, then step
            steps, values, ids = steps[order], values[order], ids[order]
            cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1 if ids.size else np.empty(0, dtype=np.intp)
            found = self._series[key] = {str(ids[part[0]]): (steps[part], values[part])
                                         for part in np.split(np.arange(ids.size), cuts) if part.size}
        return found

    @cached_property
    def _series(self) -> dict[str, dict[str, tuple[Any, Any]]]:
        """:meth:`series`' dictionaries, by key."""
        return {}

    @cached_property
    def _histories(self) -> dict[str, pd.DataFrame]:
        """:meth:`history`'s frames, by key, as first found."""
        return {}

    @cached_property
    def _rows_by_key(self) -> dict[str, Any]:
        """Each metric's row positions in ``metrics`` (ascending), found once: a report asks for dozens of
        histories, and comparing every row's key each time cost minutes at a Table-4 sweep's 3 million values."""
        return {str(key): positions for key, positions in self.metrics.groupby("key", sort=False).indices.items()}


def resolve_tracking_uri(uri: str | None) -> str:
    """The tracking URI to read, as the sweep engine resolves it: ``uri``, else ``$MLFLOW_TRACKING_URI``, else
    ``mlflow.db`` in the current directory."""
    from recipes.run.tracking import default_tracking_uri

    return default_tracking_uri(uri)


def load_runs(
    query: RunQuery | None = None,
    tracking_uri: str | None = None,
    *,
    reader: str = "auto",
    progress: Progress | None = None,
) -> RunData:
    """Load the runs ``query`` selects from ``tracking_uri`` (see :func:`resolve_tracking_uri`).

    ``reader``: ``auto`` (bulk SQL where the store allows it, else the client), ``sql`` or ``client``.
    Raises OrchError for an unreachable store, an unknown experiment or sweep, or a bad filter.
    """
    from analysis.stores import mlflow_client, mlflow_sql

    query = query or RunQuery()
    uri = resolve_tracking_uri(tracking_uri)
    if reader not in ("auto", "sql", "client"):
        raise OrchError(f"unknown reader {reader!r}; valid choices: auto, client, sql")
    use_sql = reader == "sql"
    if reader == "auto" and uri_scheme(uri) in SQL_SCHEMES:
        problem = mlflow_sql.schema_problem(uri)
        use_sql = problem is None
        if problem is not None and problem.startswith(mlflow_sql.NOT_MLFLOW):
            # MlflowClient would create its schema in it: say so instead, and write nothing
            raise OrchError(f"{uri}: {problem}; set --tracking-uri or MLFLOW_TRACKING_URI")
        if problem is not None:
            import warnings

            warnings.warn(f"{uri}: {problem}; reading through MlflowClient (slower)", stacklevel=2)
    if use_sql:
        raw = mlflow_sql.read_runs(uri, query, progress)
    else:
        raw = mlflow_client.read_runs(uri, query, progress)
    return assemble(raw, uri, "sql" if use_sql else "client")


def assemble(raw: RawRuns, tracking_uri: str, reader: str) -> RunData:
    """Build the two frames of the module docstring from a reader's records."""
    import pandas as pd

    runs = pd.DataFrame.from_records(raw.runs, columns=list(RUN_COLUMNS))
    for column in ("start_time", "end_time"):
        runs[column] = pd.to_datetime(runs[column].astype("Float64"), unit="ms", utc=True)
    wide = [runs.set_index("run_id")]
    for prefix, triples in (("params", raw.params), ("tags", raw.tags)):
        if triples:
            table = pd.DataFrame.from_records(triples, columns=["run_id", "key", "value"])
            table = table.pivot(index="run_id", columns="key", values="value")
            table.columns = [f"{prefix}.{key}" for key in table.columns]
            wide.append(table[sorted(table.columns)])
    runs = pd.concat(wide, axis=1, join="outer").rename_axis("run_id").reset_index()
    runs = runs.sort_values(["start_time", "run_id"], na_position="last", kind="stable").reset_index(drop=True)

    return RunData(runs=runs, metrics=_metrics_frame(raw.metrics), tracking_uri=tracking_uri, reader=reader)


def _metrics_frame(blocks: dict[str, list[tuple]]) -> pd.DataFrame:
    """The metrics frame from each run's (key, step, timestamp, value-or-None) tuples, sorted by every column."""
    import numpy as np
    import pandas as pd

    rows = list(itertools.chain.from_iterable(blocks.values()))
    table = np.array(rows, dtype=object).reshape(len(rows), len(METRIC_COLUMNS) - 1)
    counts = [len(block) for block in blocks.values()]
    # the two string columns from their codes and distinct values, decoded by Arrow (pd.array of 3.3 M Python
    # strings took 1.7 s a column at a Table-4 sweep, issue 60): the same "str" arrays
    runs = np.array(list(blocks), dtype=object)
    run_order = np.argsort(runs.astype(str), kind="stable")  # codes in sorted order, as factorize(sort=True)'s
    run_code = np.empty(runs.size, dtype=np.int64)
    run_code[run_order] = np.arange(runs.size)
    run_code = np.repeat(run_code, counts)
    key_code, keys = pd.factorize(table[:, 0], sort=True)
    key_code = key_code.astype(np.int64)
    run_id, key = _strings(run_code, runs[run_order]), _strings(key_code, np.asarray(keys, dtype=object))
    step, timestamp = table[:, 1].astype(np.int64), table[:, 2].astype(np.int64)
    value = table[:, 3].astype(np.float64)  # None (a logged NaN) becomes NaN
    series = run_code * (int(key_code.max(initial=0)) + 1) + key_code  # (run, key) in sort order
    columns = (series, step, timestamp, value)
    if not _is_sorted(columns):  # runs read in id order from MLflow's (run, key, step) index usually are
        order = np.lexsort(columns[::-1])  # lexsort's last key is the primary one; NaN sorts last, as in pandas
        run_id, key, step, timestamp, value = run_id[order], key[order], step[order], timestamp[order], value[order]
    return pd.DataFrame({"run_id": run_id, "key": key, "step": step, "timestamp": timestamp, "value": value})


def _strings(codes: Any, distinct: Any) -> Any:
    """The pandas "str" array of ``distinct[codes]`` (codes an int array, distinct Python strings)."""
    import pandas as pd
    import pyarrow as pa

    decoded = pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int64()),
                                             pa.array(list(distinct), type=pa.large_string())).dictionary_decode()
    return pd.array(decoded, dtype="str")


def _is_sorted(columns: tuple) -> bool:
    """Whether rows are in ascending lexicographic order of ``columns`` (the last one float, NaN last)."""
    import numpy as np

    *integers, values = columns
    nan = np.isnan(values)
    later, earlier = values[1:], values[:-1]
    # the last column alone: non-decreasing, with NaN only after numbers or other NaN
    ordered = np.where(nan[:-1], nan[1:], nan[1:] | (later >= earlier))
    for column in reversed(integers):
        step = np.diff(column)
        ordered = (step > 0) | ((step == 0) & ordered)
    return bool(ordered.all())
