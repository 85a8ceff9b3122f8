"""The portable reader: ``MlflowClient.search_runs`` + one ``get_metric_history`` per (run, metric).

Works against any tracking store (an ``http(s)://`` server, a file store, a SQL store whose schema the bulk reader
does not know); slow for many runs, which is why :mod:`analysis.stores.mlflow_sql` exists. Returns the same records as the
bulk reader (see :class:`analysis.stores.mlflow_store.RawRuns`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from analysis.stores.mlflow_query import Progress, RawRuns, RunQuery, select_metric_keys
from orchlib.errors import OrchError

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

PAGE = 50_000  # MLflow's largest search page


def _client(uri: str) -> MlflowClient:
    from recipes.run.tracking import mlflow_client

    try:
        return mlflow_client(uri)
    except Exception as err:  # unreachable server, out-of-date schema, bad URI
        raise OrchError(f"{uri}: cannot open the tracking store: {str(err).splitlines()[0]}") from None


def _search(client: MlflowClient, experiment_ids: list[str], filter_string: str) -> list[Run]:
    from mlflow.exceptions import MlflowException

    found, token = [], None
    try:
        while True:
            page = client.search_runs(experiment_ids, filter_string, max_results=PAGE, page_token=token)
            found.extend(page)
            token = page.token
            if not token:
                return found
    except MlflowException as err:
        raise OrchError(f"bad --filter {filter_string!r}: {err.message.splitlines()[0]}") from None


def _experiments(client: MlflowClient, names: tuple[str, ...]) -> dict[str, str]:
    """id -> name of the named experiments (all active ones when ``names`` is empty)."""
    everything = {e.experiment_id: e.name for e in client.search_experiments(max_results=PAGE)}
    if not names:
        return everything
    by_name = {name: experiment_id for experiment_id, name in everything.items()}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise OrchError(f"unknown experiment {unknown[0]!r}; valid choices: {', '.join(sorted(by_name)) or '(none)'}")
    return {by_name[name]: name for name in names}


def search_run_ids(uri: str, experiment_ids: list[str], filter_string: str) -> set[str]:
    """Ids of the runs in ``experiment_ids`` matching an MLflow filter expression (MLflow evaluates it)."""
    return {run.info.run_id for run in _search(_client(uri), experiment_ids, filter_string)}


def _select(client: MlflowClient, query: RunQuery, experiments: dict[str, str]) -> list[Run]:
    """The runs of the query's experiments (and sweep), then those matching its filter."""
    from analysis.names import TAG_SWEEP

    if query.sweep is None:
        return _search(client, list(experiments), query.filter_string or "")
    tagged = _search(client, list(experiments), f"tags.{TAG_SWEEP} = '{query.sweep}'")
    named = [eid for eid, name in experiments.items() if name == query.sweep]
    runs = {run.info.run_id: run for run in tagged + (_search(client, named, "") if named else [])}
    if not runs:
        sweeps = {run.data.tags.get(TAG_SWEEP) for run in _search(client, list(experiments), "")} - {None}
        raise OrchError(f"unknown sweep {query.sweep!r}; valid choices: {', '.join(sorted(sweeps)) or '(none)'}")
    if query.filter_string:
        scope = sorted({run.info.experiment_id for run in runs.values()})
        matching = {run.info.run_id for run in _search(client, scope, query.filter_string)}
        runs = {run_id: run for run_id, run in runs.items() if run_id in matching}
    return list(runs.values())


def read_runs(uri: str, query: RunQuery, progress: Progress | None = None) -> RawRuns:
    """Read the selected runs through the MLflow client API."""
    client = _client(uri)
    experiments = _experiments(client, query.experiments)
    if progress:
        progress("searching runs", 0, 1)
    selected = _select(client, query, experiments) if experiments else []
    records, params, tags, metrics = [], [], [], {}
    for done, run in enumerate(selected, start=1):
        info = run.info
        records.append(
            (
                info.run_id,
                str(info.experiment_id),
                experiments.get(info.experiment_id, ""),
                info.run_name,
                info.status,
                info.start_time,
                info.end_time,
                info.artifact_uri,
            )
        )
        params.extend((info.run_id, key, value) for key, value in run.data.params.items())
        tags.extend((info.run_id, key, value) for key, value in run.data.tags.items())
        rows = [
            (m.key, m.step, m.timestamp, None if math.isnan(m.value) else m.value)
            for key in select_metric_keys(run.data.metrics, query.metrics)
            for m in client.get_metric_history(info.run_id, key)
        ]
        if rows:
            metrics[info.run_id] = rows
        if progress:
            progress("reading metric histories", done, len(selected))
    return RawRuns(runs=records, params=params, tags=tags, metrics=metrics)
