"""The state store: schema versioning, idempotent cells, the attempt lifecycle reported by jobs, and concurrent
writers. Runs on SQLite; set ORCH_TEST_POSTGRES_URL (scripts/setup_postgres.sh prints one) to run it on
PostgreSQL too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.states import State
from orchestrator.store import Store, Submission
from orchlib.errors import OrchError
from tests.orchestrator.races import postgres_schema

POSTGRES_ENV = "ORCH_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new store: an SQLite file, or a new empty schema of the test database (dropped afterwards), so tests that
    share the PostgreSQL server (another run, another worker) never see each other's tables."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'orch.db'}"
        return
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV} (bash scripts/setup_postgres.sh starts one and prints it)")
    with postgres_schema(url) as fresh:
        yield fresh


def _cells(count: int, start: int = 0) -> list[dict]:
    return [
        {"digest": f"{index:016x}", "position": index, "axis": None, "seed": index, "backend": "torch",
         "settings_json": "{}", "overrides_json": json.dumps([f"seed={index}"]), "varied_json": "{}",
         "resources_json": "{}"}
        for index in range(start, start + count)
    ]


def _sweep(store: Store, name: str = "s") -> int:
    row = store.save_sweep({"name": name, "spec_path": "s.yaml", "spec_text": "name: s", "executor": "local",
                            "cluster_json": json.dumps({"max_requeues": 2}), "run_dir": "/tmp/s"})
    return row.id


def test_schema_is_created_and_versioned(store_url: str) -> None:
    store = Store.open(store_url)
    Store.open(store_url)  # opening again checks, does not recreate
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE orch_meta SET value = '99' WHERE key = 'schema_version'"))
    with pytest.raises(OrchError, match="schema version 99, this orch understands 1; upgrade orch"):
        Store.open(store_url)


def test_open_without_create_refuses_empty(tmp_path: Path) -> None:
    with pytest.raises(OrchError, match="no orch store here"):
        Store.open(f"sqlite:///{tmp_path / 'none.db'}", create=False)


def test_cells_are_added_once(store_url: str) -> None:
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    assert store.add_cells(sweep_id, _cells(5)) == 5
    assert store.add_cells(sweep_id, _cells(7)) == 2  # a grown sweep adds only its new cells
    assert store.counts(sweep_id) == {"pending": 7}
    assert [row.digest for row in store.find_cells(sweep_id, ["0000000000000003"])] == ["0000000000000003"]
    with pytest.raises(OrchError, match="matches 7 cells"):
        store.find_cells(sweep_id, ["0000"])


def test_attempt_lifecycle(store_url: str) -> None:
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    store.add_cells(sweep_id, _cells(2))
    first, second = store.cell_rows(sweep_id)
    attempts = store.record_submissions("slurm", [first.id, second.id])
    store.assign_jobs([Submission(first.id, attempts[first.id], "7_0", "/o", "/e")])
    assert store.counts(sweep_id) == {"queued": 2}

    attempt = store.job_started(first.id, "slurm", "7_0", "node1", 42)
    assert attempt == attempts[first.id]  # the queued attempt is reused
    store.heartbeat(attempt)
    assert store.job_ended(attempt, State.REQUEUED, "preempted", steps_done=5) == State.REQUEUED
    restarted = store.job_started(first.id, "slurm", "7_0", "node1", 43)  # same job id after a requeue
    assert restarted != attempt
    store.job_ended(restarted, State.FINISHED, steps_done=10, mlflow_run_id="run1")
    rows = {row.id: row for row in store.cell_rows(sweep_id)}
    assert (rows[first.id].state, rows[first.id].attempts, rows[first.id].requeues) == ("finished", 2, 1)
    assert rows[first.id].steps_done == 10
    assert [a.state for a in store.attempts(first.id)] == ["requeued", "finished"]

    assert store.mark([second.id], State.CANCELLED, "by test") == 1
    assert store.job_started(second.id, "slurm", "7_1", "node1", 44) is None  # cancelled: the job must not run
    assert store.mark([first.id], State.LOST, "gone") == 0  # finished cells are not active
    context = store.job_context(first.id)
    assert (context.overrides, context.max_requeues, context.sweep) == (["seed=0"], 2, "s")


def test_cancel_wins_over_a_late_requeue_request(store_url: str) -> None:
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    store.add_cells(sweep_id, _cells(1))
    (cell,) = store.cell_rows(sweep_id)
    store.record_submissions("local", [cell.id])
    attempt = store.job_started(cell.id, "local", "99", "h", 1)
    store.mark([cell.id], State.CANCELLED, "orch cancel")
    assert store.job_ended(attempt, State.REQUEUED, "stopped on SIGTERM") == State.CANCELLED


def test_a_job_whose_submission_was_replaced_does_not_start(store_url: str) -> None:
    """Submitted (attempt 1), cancelled, submitted again (attempt 2) before the first job started: the first job
    finds its claim replaced and does not run; the second job runs the cell; a withdrawn submission goes back to
    pending only while it is still the cell's own latest claim."""
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    store.add_cells(sweep_id, _cells(1))
    (cell,) = store.cell_rows(sweep_id)
    first = store.record_submissions("local", [cell.id])[cell.id]
    store.mark([cell.id], State.CANCELLED, "orch cancel", only_states=[State.QUEUED])
    second = store.record_submissions("local", [cell.id], only_states=[State.CANCELLED])[cell.id]
    assert store.job_started(cell.id, "local", "101", "h", 1, attempt_id=first) is None
    assert store.cell_states([cell.id]) == {cell.id: State.QUEUED}
    assert store.end_attempts([first], State.PENDING, "a late failure of the first submission") == 0
    assert store.job_started(cell.id, "local", "102", "h", 2, attempt_id=second) == second
    assert store.cell_states([cell.id]) == {cell.id: State.RUNNING}
    assert [(a.number, a.state) for a in store.attempts(cell.id)] == [(1, State.CANCELLED), (2, State.RUNNING)]


def test_the_first_parent_run_recorded_wins(store_url: str) -> None:
    """Two processes creating the sweep's MLflow parent run at once: the first recorded stays; the other learns it."""
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    assert store.claim_parent_run(sweep_id, None, "1", "run-a") == "run-a"
    assert store.claim_parent_run(sweep_id, None, "1", "run-b") == "run-a"  # read None too, but lost
    assert store.claim_parent_run(sweep_id, "run-a", "1", "run-c") == "run-c"  # replacing a deleted parent run
    assert store.require_sweep("s").parent_run_id == "run-c"


def test_progress_travels_with_heartbeats_and_older_stores_get_its_table(store_url: str) -> None:
    """A job's heartbeat carries its trainer's progress into `status_rows`; a store made before the progress table
    existed reads (read-only) without it and gains it at its next writable open."""
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    store.add_cells(sweep_id, _cells(1))
    (cell,) = store.cell_rows(sweep_id)
    store.record_submissions("local", [cell.id])
    attempt = store.job_started(cell.id, "local", "7", "h", 1)
    store.heartbeat(attempt, {"step": 3, "done": 2, "total": 10, "phase": "update", "success": 0.5})
    store.heartbeat(attempt)  # liveness only: the last progress stays
    (row,) = store.status_rows(sweep_id)
    assert row["progress"] == {"step": 3, "done": 2, "total": 10, "phase": "update", "success": 0.5}
    with store.engine.begin() as connection:
        connection.execute(text("DROP TABLE progress"))
    (row,) = Store.open_readonly(store_url).status_rows(sweep_id)
    assert row["progress"] is None and row["state"] == "running"
    reopened = Store.open(store_url)
    reopened.heartbeat(attempt, {"step": 4})
    assert reopened.status_rows(sweep_id)[0]["progress"] == {"step": 4}


HAMMER = """
import os, sys
from orchestrator.states import State
from orchestrator.store import Store
store = Store.open(sys.argv[1], create=False)
for cell_id in map(int, sys.argv[2:]):
    attempt = store.job_started(cell_id, "local", str(cell_id), "h", os.getpid())
    for _ in range(10):
        store.heartbeat(attempt)
    store.job_ended(attempt, State.FINISHED, steps_done=1)
"""


def test_concurrent_job_reports(store_url: str) -> None:
    """Many jobs writing at once: no 'database is locked', every report lands."""
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    store.add_cells(sweep_id, _cells(40))
    ids = [row.id for row in store.cell_rows(sweep_id)]
    store.record_submissions("local", ids)
    store.dispose()
    workers = [subprocess.Popen([sys.executable, "-c", HAMMER, store_url, *map(str, ids[index::4])])
               for index in range(4)]
    assert [worker.wait(120) for worker in workers] == [0, 0, 0, 0]
    assert store.counts(sweep_id) == {"finished": 40}


def test_every_restart_counts_against_max_requeues(store_url: str) -> None:
    """Restarts the job did not ask for (`scontrol requeue`, a node failure: no end reported) count as requeues
    like the reported ones; the restart past `cluster.max_requeues` (2 here) fails the cell instead of running."""
    store = Store.open(store_url)
    sweep_id = _sweep(store)
    store.add_cells(sweep_id, _cells(1))
    (cell,) = store.cell_rows(sweep_id)
    store.record_submissions("slurm", [cell.id], "9")
    first = store.job_started(cell.id, "slurm", "9", "node1", 1)
    store.job_ended(first, State.REQUEUED, "preempted")  # a requeue the job asked for: requeues 1
    assert store.job_started(cell.id, "slurm", "9", "node1", 2) is not None  # no extra count for it
    assert store.job_started(cell.id, "slurm", "9", "node2", 3) is not None  # silent restart: requeues 2
    assert store.job_started(cell.id, "slurm", "9", "node3", 4) is None  # requeues 3 > 2: not run
    (row,) = store.cell_rows(sweep_id)
    assert (row.state, row.requeues, row.attempts) == ("failed", 3, 4)
    assert "restarted 3 times (cluster.max_requeues=2)" in row.reason
    attempts = store.attempts(cell.id)
    assert [a.state for a in attempts] == ["requeued", "lost", "lost", "failed"]
    assert attempts[-1].reason == row.reason


def test_a_read_only_store_reads_and_cannot_write(store_url: str) -> None:
    with pytest.raises(OrchError, match="no orch store here|not an orch store \\(it is empty\\)"):
        Store.open_readonly(store_url)  # nothing there yet: refused...
    with pytest.raises(OrchError):
        Store.open_readonly(store_url)  # ...and nothing was created by the first try
    store = Store.open(store_url)
    _sweep(store)
    reader = Store.open_readonly(store_url)
    assert reader.sweep_names() == ["s"] and reader.display_url() == store.display_url()
    with pytest.raises(Exception, match="(?i)read-only|readonly"):
        reader.update_sweep(reader.require_sweep("s").id, executor="slurm")
    assert store.require_sweep("s").executor == "local"


def test_a_read_only_look_at_a_postgresql_store_stays_in_the_schema_its_url_names() -> None:
    """`?options=-csearch_path%3Dteam` puts a team's store in its own schema: `orch status` and the reports (read-only
    connections) read that schema, not `public` (the read-only setting used to replace the URL's options)."""
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV} (bash scripts/setup_postgres.sh starts one and prints it)")
    with postgres_schema(url) as team_a, postgres_schema(url) as team_b:
        _sweep(Store.open(team_a), "a")
        _sweep(Store.open(team_b), "b")
        reader = Store.open_readonly(team_a)
        assert reader.sweep_names() == ["a"]
        with pytest.raises(Exception, match="(?i)read-only|readonly"):
            reader.update_sweep(reader.require_sweep("a").id, executor="slurm")


@pytest.mark.parametrize(("action", "state"), [("flag", "running"), ("fail", "failed"), ("requeue", "lost")])
def test_reconcile_ends_stalled_cells_under_the_stall_rule(store_url: str, tmp_path: Path, action: str,
                                                           state: str) -> None:
    """A running cell whose heartbeat is older than `cluster.stall.after_s` is left (flag), failed, or lost (so
    `orch resume` runs it again); a cell that beats in time is never touched. Debug-executor attempts of this
    live process: nothing is there to kill."""
    from orchestrator.engine import reconcile

    store = Store.open(store_url)
    sweep = store.save_sweep({"name": "st", "spec_path": "s.yaml", "spec_text": "name: st", "executor": "debug",
                              "cluster_json": json.dumps({"stall": {"after_s": 60, "action": action}}),
                              "run_dir": str(tmp_path)})
    store.add_cells(sweep.id, _cells(2))
    hung, alive = store.cell_rows(sweep.id)
    store.record_submissions("debug", [hung.id, alive.id], f"debug-{os.getpid()}")
    for cell in (hung, alive):
        store.job_started(cell.id, "debug", f"debug-{os.getpid()}", socket.gethostname(), os.getpid())
    with store.engine.begin() as connection:  # the hung job's last beat was 2 minutes ago
        connection.execute(text("UPDATE attempts SET heartbeat_at = heartbeat_at - 120 WHERE cell_id = :id"),
                           {"id": hung.id})
    assert reconcile(store, sweep) == (0 if action == "flag" else 1)
    rows = {row.id: row for row in store.cell_rows(sweep.id)}
    assert (rows[hung.id].state, rows[alive.id].state) == (state, "running")
    if action != "flag":
        assert "stalled: no heartbeat for 12" in rows[hung.id].reason and f"action {action}" in rows[hung.id].reason
        assert store.attempts(hung.id)[-1].state == state


def test_a_requeued_local_job_whose_controller_ended_is_restarted_within_max_requeues(tmp_path: Path) -> None:
    """The local runner reaps a job whose submitit controller ended: an attempt still running failed ("exited
    without reporting an end"); one whose job had recorded its requeue (checkpoint written) but was not restarted --
    submitit's local controller restarts a job at most 6 times whatever its max_num_timeout (local.py,
    Controller.run: max_retry=6), or the job was killed at the time limit while it exited -- is restarted under a new
    controller, and that restart counts against cluster.max_requeues like any other. (It was `lost`: a cell with
    max_requeues above 5 could never use them, seen as a CI failure of test_local_time_limit_checkpoints_and_requeues
    on a loaded machine.) A restart whose job ends before it starts ends the requeued attempt as any silent exit
    does (failed, or lost when a signal killed it), rather than leaving the cell waiting forever."""
    from types import SimpleNamespace

    from orchestrator.local_runner import LocalRunner, _Running
    from orchestrator.resources import Resources

    store = Store.open(f"sqlite:///{tmp_path / 'orch.db'}")
    sweep_id = _sweep(store)
    store.add_cells(sweep_id, _cells(2))
    requeued, running = store.cell_rows(sweep_id)
    attempts = store.record_submissions("local", [requeued.id, running.id])
    store.assign_jobs([Submission(requeued.id, attempts[requeued.id], "100", "/o", "/e"),
                       Submission(running.id, attempts[running.id], "200", "/o", "/e")])
    first = store.job_started(requeued.id, "local", "100", "vm", 1)
    store.job_started(running.id, "local", "200", "vm", 2)
    store.job_ended(first, State.REQUEUED, "checkpointed at step 1", steps_done=1)
    runner = object.__new__(LocalRunner)
    runner.store, runner.sweep, runner.log_dir = store, store.require_sweep("s"), tmp_path
    restarted = []

    def submit(cell_id, attempt_id, resources, restart=False):  # what would start a new submitit controller
        job = SimpleNamespace(job_id="300", done=lambda: False, paths=SimpleNamespace(stderr=tmp_path / "none.err"))
        runner.running[attempt_id] = _Running(job, cell_id, attempt_id, 1, resources, restart=restart)
        restarted.append((cell_id, attempt_id, restart))
        return job

    runner._submit = submit
    ended = SimpleNamespace(done=lambda: True, paths=SimpleNamespace(stderr=tmp_path / "none.err"))
    runner.running = {attempt: _Running(SimpleNamespace(**vars(ended), job_id=job), cell, attempt, 1, Resources())
                      for attempt, job, cell in ((first, "100", requeued.id), (attempts[running.id], "200", running.id))}
    runner._reap()
    rows = {row.id: row for row in store.cell_rows(sweep_id)}
    assert restarted == [(requeued.id, first, True)]
    assert rows[requeued.id].state == "requeued"  # waiting for its new controller, not lost
    assert rows[running.id].state == "failed" and "exited without reporting an end" in rows[running.id].reason
    # the new job starts as a restart of the requeued attempt (a new attempt, one more requeue) ...
    second = store.job_started(requeued.id, "local", "300", "vm", 3, attempt_id=first)
    assert second is not None and second != first
    assert [a.state for a in store.attempts(requeued.id)] == ["requeued", "running"]
    assert store.cell_rows(sweep_id)[0].requeues == 1
    # ... and a restart whose job ended before it opened an attempt ends the cell, not left waiting forever
    store.job_ended(second, State.REQUEUED, "checkpointed at step 2", steps_done=2)
    runner.running = {second: _Running(SimpleNamespace(**vars(ended), job_id="400"), requeued.id, second, 1,
                                       Resources(), restart=True)}
    runner._reap()
    cell = store.cell_rows(sweep_id)[0]
    assert cell.state == "failed" and "local job 400 exited without reporting an end" in cell.reason
    assert runner.running == {}
