"""The bulk SQL reader and the MlflowClient reader give identical frames; selection, errors, schema guard."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pytest

from analysis.stores import mlflow_sql
from analysis.stores.mlflow_query import RunQuery, select_metric_keys, uri_scheme
from analysis.stores.mlflow_store import load_runs
from orchlib.errors import OrchError


def both(query: RunQuery, uri: str):
    bulk = load_runs(query, uri, reader="sql")
    client = load_runs(query, uri, reader="client")
    pdt.assert_frame_equal(bulk.runs, client.runs)
    pdt.assert_frame_equal(bulk.metrics, client.metrics)
    return bulk


@pytest.mark.parametrize(
    "query",
    [
        RunQuery(),
        RunQuery(sweep="demo"),
        RunQuery(experiments=("demo",)),
        RunQuery(sweep="demo", metrics=("val/success_rate", "collapse/*")),
        RunQuery(sweep="demo", metrics=()),
        RunQuery(sweep="demo", filter_string="params.filter.strategy = 'top_p' and params.seed = '1'"),
        RunQuery(sweep="demo", filter_string="metrics.`val/success_rate` > 0.3"),
    ],
    ids=["all", "sweep", "experiment", "metric-globs", "no-metrics", "param-filter", "metric-filter"],
)
def test_bulk_and_client_readers_give_identical_frames(demo_store, query):
    both(query, demo_store.uri)


def test_frames_hold_the_sweep(demo_store, demo_data):
    runs, metrics = demo_data.runs, demo_data.metrics
    assert len(runs) == 19  # parent + 16 finished + failed + scheduled
    assert set(runs["status"]) == {"RUNNING", "FINISHED", "FAILED", "SCHEDULED"}
    assert runs["params.task.name"].notna().sum() == 17  # the scheduled cell never logged params
    assert runs["tags.sweep"].eq("demo").all()
    assert list(metrics.columns) == ["run_id", "key", "step", "timestamp", "value"]
    assert metrics["step"].dtype == "int64" and metrics["value"].dtype == "float64"
    run_id = demo_store.run_ids["sokoban", "ppo", False, 1]
    history = demo_data.history("val/success_rate")
    success = history[history["run_id"] == run_id]
    assert success["step"].tolist() == [0, 10, 20, 30, 40, 50, 60]
    assert success["value"].max() == pytest.approx(0.22)
    assert len(metrics) == 16 * (7 + 13 * 3 + 60 * 10)


def test_filters_select_the_right_runs(demo_store):
    data = both(RunQuery(sweep="demo", filter_string="params.filter.strategy = 'top_p' and params.seed = '1'"),
                demo_store.uri)
    assert sorted(data.runs["params.task.name"] + "/" + data.runs["params.algorithm.name"]) == [
        "frozenlake/grpo", "frozenlake/ppo", "sokoban/grpo", "sokoban/ppo"
    ]
    globbed = load_runs(RunQuery(sweep="demo", metrics=("collapse/*",)), demo_store.uri)
    assert set(globbed.metrics["key"]) == {
        "collapse/alert", "collapse/trajectory/mi_est", "collapse/trajectory/mi_zscore_ema"
    }


def test_nan_and_infinite_values_round_trip_identically(tmp_path):
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("x", artifact_location=tmp_path.as_uri())
    run_id = client.create_run(experiment).info.run_id
    logged = [math.nan, math.inf, -math.inf, 1.5, 1.5]  # a duplicate (same step, later timestamp) too
    client.log_batch(run_id, metrics=[Metric("m", v, 1000 + i, i if i < 4 else 3) for i, v in enumerate(logged)])
    data = both(RunQuery(), uri)
    values = data.metrics["value"].tolist()
    assert math.isnan(values[0])
    assert values[1] == 1.7976931348623157e308 and values[2] == -1.7976931348623157e308  # MLflow's clamp
    assert data.metrics["step"].tolist() == [0, 1, 2, 3, 3]
    assert data.history("m")["value"].iloc[-1] == 1.5  # the last value per (run, step)


def test_unknown_sweep_experiment_and_bad_filter_are_one_line_errors(demo_store):
    for reader in ("sql", "client"):
        with pytest.raises(OrchError, match=r"unknown sweep 'nope'; valid choices: demo"):
            load_runs(RunQuery(sweep="nope"), demo_store.uri, reader=reader)
        with pytest.raises(OrchError, match=r"unknown experiment 'nope'; valid choices: .*demo"):
            load_runs(RunQuery(experiments=("nope",)), demo_store.uri, reader=reader)
        with pytest.raises(OrchError, match=r"bad --filter"):
            load_runs(RunQuery(filter_string="params.x ~~ 'y'"), demo_store.uri, reader=reader)
    with pytest.raises(OrchError, match="unknown reader"):
        load_runs(RunQuery(), demo_store.uri, reader="fast")
    with pytest.raises(OrchError, match="not valid"):
        RunQuery(sweep="a'b")


def test_missing_sqlite_file_is_reported_not_created(tmp_path):
    uri = f"sqlite:///{tmp_path / 'absent.db'}"
    with pytest.raises(OrchError, match="no MLflow store there"):
        load_runs(RunQuery(), uri)
    assert not (tmp_path / "absent.db").exists()


def test_schema_guard_accepts_this_mlflow_and_rejects_unknown_revisions(demo_store, tmp_path):
    with sqlite3.connect(demo_store.path) as conn:
        (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert revision in mlflow_sql.known_revisions()
    assert mlflow_sql.schema_problem(demo_store.uri) is None
    copy = tmp_path / "copy.db"
    shutil.copy(demo_store.path, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    uri = f"sqlite:///{copy}"
    assert "schema revision ffffffffffff is unknown" in mlflow_sql.schema_problem(uri)
    with pytest.warns(UserWarning, match="reading through MlflowClient"), pytest.raises(OrchError):
        load_runs(RunQuery(), uri)  # MLflow itself refuses a schema it does not know
    with sqlite3.connect(copy) as conn:
        conn.execute("DROP TABLE latest_metrics")
    assert "missing tables latest_metrics" in mlflow_sql.schema_problem(uri)


def test_helpers():
    assert uri_scheme("postgresql+psycopg://u@h/db") == "postgresql"
    assert uri_scheme("sqlite:///x.db") == "sqlite"
    assert uri_scheme("http://127.0.0.1:5000") == "http"
    assert uri_scheme("./mlruns") == ""
    assert select_metric_keys(["a/x", "a/y", "b", "A/z"], ("a/*",)) == ["a/x", "a/y"]
    assert select_metric_keys(["b", "a"], None) == ["a", "b"]



def test_empty_selection_gives_empty_frames(demo_store):
    data = both(RunQuery(sweep="demo", filter_string="params.seed = '99'"), demo_store.uri)
    assert data.runs.empty and data.metrics.empty
    assert isinstance(data.metrics, pd.DataFrame)


@pytest.fixture
def mlflow_server(demo_store, tmp_path):
    """A real `mlflow server` on loopback over a copy of the demo store (MLflow's REST API: the client path). A port
    taken by another process between the probe and the server's bind makes the server exit: it starts again on a
    new port (three tries); one that does not answer fails the test with its log, never skips it."""
    store = tmp_path / "served.db"
    shutil.copy(demo_store.path, store)
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    log = tmp_path / "server.log"
    for _ in range(3):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with log.open("w") as handle:
            process = subprocess.Popen(
                [str(mlflow_cli), "server", "--backend-store-uri", f"sqlite:///{store}", "--host", "127.0.0.1",
                 "--port", str(port), "--workers", "1"],
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,  # its own process group
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300  # generous: a loaded 2-core machine starts it in seconds to a minute
        while process.poll() is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5)
                break
            except OSError:
                time.sleep(0.5)
        else:
            with contextlib.suppress(ProcessLookupError):  # exited by itself (its port was taken)
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            continue
        break
    else:
        pytest.fail(f"mlflow server did not answer on three ports; its log ends: {log.read_text()[-2000:]}")
    try:
        yield url, f"sqlite:///{store}"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the server and its workers: nothing to shut down gracefully
        process.wait(timeout=30)


@pytest.mark.slow
def test_http_server_goes_through_the_client_and_matches_the_bulk_reader(mlflow_server):
    url, sqlite_uri = mlflow_server
    query = RunQuery(sweep="demo", metrics=("val/success_rate",))  # one REST call per run: keeps the test short
    remote = load_runs(query, url)
    local = load_runs(query, sqlite_uri)
    assert (remote.reader, local.reader) == ("client", "sql")
    pdt.assert_frame_equal(remote.runs, local.runs)
    pdt.assert_frame_equal(remote.metrics, local.metrics)


def test_metric_rows_come_out_sorted_whatever_their_input_order():
    import random

    from analysis.stores.mlflow_store import _metrics_frame

    rng = random.Random(0)
    for _ in range(200):
        rows = [
            (rng.choice("ab"), rng.choice(["k1", "k2"]), rng.randint(0, 3), rng.randint(0, 2),
             rng.choice([None, 0.5, 1.0, -1.0]))
            for _ in range(rng.randint(0, 30))
        ]
        if rng.random() < 0.5:  # already sorted input takes the no-sort path
            rows.sort(key=lambda r: (r[0], r[1], r[2], r[3], math.inf if r[4] is None else r[4]))
        blocks: dict[str, list[tuple]] = {}
        for run_id, *rest in rows:
            blocks.setdefault(run_id, []).append(tuple(rest))
        got = _metrics_frame(blocks)
        expected = pd.DataFrame([(r, *rest) for r, block in blocks.items() for rest in block], columns=list(got.columns))
        expected = expected.astype({"value": float})
        expected = expected.sort_values(list(got.columns), kind="stable").reset_index(drop=True)
        assert got["run_id"].tolist() == expected["run_id"].tolist()
        assert got["key"].tolist() == expected["key"].tolist()
        assert got[["step", "timestamp"]].to_numpy().tolist() == expected[["step", "timestamp"]].to_numpy().tolist()
        assert got["value"].equals(expected["value"]) or len(got) == 0


POSTGRES_ENV = "ORCH_TEST_POSTGRES_URL"  # scripts/setup_postgres.sh starts a server and prints one


@pytest.fixture
def postgres_uri():
    """An MLflow store in a fresh schema of the test PostgreSQL database (dropped afterwards)."""
    import sqlalchemy as sa

    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV} (bash scripts/setup_postgres.sh starts one and prints it)")
    schema = "orch_analysis_test"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        engine.dispose()


def test_postgresql_store_bulk_and_client_readers_agree(postgres_uri, tmp_path):
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    client = MlflowClient(tracking_uri=postgres_uri)
    experiment = client.create_experiment("pg", artifact_location=tmp_path.as_uri())
    for cell in range(3):
        run_id = client.create_run(experiment, tags={"sweep": "pg", "cell": str(cell)}).info.run_id
        metrics = [Metric("m", math.nan if step == 2 else float(step * cell), 1000 + step, step) for step in range(5)]
        client.log_batch(run_id, metrics=metrics, params=[Param("seed", str(cell))])
    assert mlflow_sql.schema_problem(postgres_uri) is None
    data = both(RunQuery(sweep="pg"), postgres_uri)
    assert data.reader == "sql" and len(data.runs) == 3 and len(data.metrics) == 15
    assert data.metrics["value"].isna().sum() == 3
    assert len(both(RunQuery(sweep="pg", filter_string="params.seed = '1'"), postgres_uri).runs) == 1


def test_series_and_appended_rows_equal_the_histories(demo_data):
    """RunData.series (each run's steps and values, found once per key) holds the history's rows of each run in step
    order; RunData.with_rows appends rows and keeps what was found of the other keys, with every history equal to
    a fresh RunData's over the same rows (issue 60)."""
    import pandas as pd

    from analysis.stores.mlflow_store import RunData

    for key in ("val/success_rate", "actor/entropy", "no/such/key"):
        history = demo_data.history(key)
        series = demo_data.series(key)
        assert list(series) == sorted(history["run_id"].unique())
        for run_id, (steps, values) in series.items():
            rows = history[history["run_id"] == run_id].sort_values("step")
            assert steps.tolist() == rows["step"].tolist()
            np.testing.assert_array_equal(values, rows["value"].to_numpy())
    run_id = demo_data.runs["run_id"].iloc[1]
    derived = pd.DataFrame({"run_id": [run_id] * 3, "key": ["derived", "derived", "actor/entropy"],
                            "step": [1, 2, 999], "timestamp": 0, "value": [0.5, 0.25, 7.0]})
    grown = demo_data.with_rows(derived)
    fresh = RunData(runs=demo_data.runs, metrics=pd.concat([demo_data.metrics, derived.astype(
        demo_data.metrics.dtypes.to_dict())], ignore_index=True), tracking_uri="", reader="sql")
    for key in ("val/success_rate", "actor/entropy", "derived"):
        pd.testing.assert_frame_equal(grown.history(key), fresh.history(key))
    assert grown.series("derived")[run_id][0].tolist() == [1, 2]
    assert grown.series("actor/entropy")[run_id][0][-1] == 999  # a key with rows added is found again


def test_metrics_frame_strings_are_pandas_str_arrays():
    """The metrics frame's run_id and key columns, decoded from codes by Arrow (issue 60), are the "str" arrays
    pandas builds from the Python strings, row for row, and the frame is sorted as before."""
    from analysis.stores.mlflow_store import _metrics_frame

    blocks = {"run-b": [("b/key", 1, 10, 0.5), ("a/key", 2, 11, None)], "run-a": [("é/key", 0, 9, 1.0)],
              "run-c": []}
    frame = _metrics_frame(blocks)
    rows = [(run, *row) for run, block in blocks.items() for row in block]
    expected = pd.DataFrame(rows, columns=["run_id", "key", "step", "timestamp", "value"])
    expected = expected.astype({"run_id": "str", "key": "str", "step": "int64", "timestamp": "int64",
                                "value": "float64"})
    expected = expected.sort_values(["run_id", "key", "step", "timestamp", "value"]).reset_index(drop=True)
    pdt.assert_frame_equal(frame, expected)
    assert frame["run_id"].array._pa_array.type == pd.array(["x"], dtype="str")._pa_array.type
    assert _metrics_frame({}).empty
