"""What the MLflow readers share: the query (`RunQuery`), the raw records a reader returns (`RawRuns`) and small
helpers. `analysis.stores.mlflow_store.load_runs` picks a reader -- `analysis.stores.mlflow_sql` (bulk SQL) or
`analysis.stores.mlflow_client` (MlflowClient) -- and assembles their records into frames; the readers depend on this
module only, never on the store module that calls them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from orchlib.errors import OrchError

SQL_SCHEMES = ("sqlite", "postgresql")
RUN_COLUMNS = (
    "run_id",
    "experiment_id",
    "experiment",
    "run_name",
    "status",
    "start_time",
    "end_time",
    "artifact_uri",
)
METRIC_COLUMNS = ("run_id", "key", "step", "timestamp", "value")
SWEEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

Progress = Callable[[str, int, int], None]  # (stage description, done, total)


@dataclass(frozen=True)
class RunQuery:
    """Which runs and metrics to load.

    experiments: experiment names (empty: every active experiment).
    sweep: a sweep name: the runs of the experiment of that name and every run tagged ``sweep=<name>``.
    filter_string: MLflow search syntax, e.g. ``params.filter.value = '0.9' and metrics.`val/success_rate` > 0.2``.
    metrics: metric names or shell-style globs (``collapse/*``) to load; None loads all, () none.
    """

    experiments: tuple[str, ...] = ()
    sweep: str | None = None
    filter_string: str | None = None
    metrics: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.sweep is not None and not SWEEP_NAME.match(self.sweep):
            raise OrchError(f"sweep name {self.sweep!r} is not valid; names use letters, digits, '_', '.', '-'")


@dataclass(frozen=True)
class RawRuns:
    """What a reader returns: plain records, assembled into frames by :func:`assemble`.

    runs: one tuple per run in :data:`RUN_COLUMNS` order (times as ms since the epoch or None; ids as str).
    params, tags: (run_id, key, value) triples.
    metrics: run_id -> (key, step, timestamp, value) tuples of that run, value None where NaN was logged.
    """

    runs: list[tuple]
    params: list[tuple[str, str, str]]
    tags: list[tuple[str, str, str]]
    metrics: dict[str, list[tuple]]


def uri_scheme(uri: str) -> str:
    """``sqlite``, ``postgresql``, ``http``, ... (a driver suffix such as ``+psycopg`` dropped; '' for a path)."""
    head, sep, _ = uri.partition("://")
    return head.split("+", 1)[0].lower() if sep else ""


def select_metric_keys(available: Iterable[str], patterns: tuple[str, ...] | None) -> list[str]:
    """The available metric keys matching any pattern (exact names or case-sensitive globs), sorted."""
    keys = sorted(set(available))
    if patterns is None:
        return keys
    return [key for key in keys if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)]
