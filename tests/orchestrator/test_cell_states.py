"""The cell state machine: its table of transitions (checked exhaustively over every pair of states), and the store
refusing, through its API, every change outside it while leaving the rows as they were. The store tests run on
SQLite; set ORCH_TEST_POSTGRES_URL (scripts/setup_postgres.sh prints one) to run them on PostgreSQL too."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.states import (
    ACTIVE,
    DONE,
    MISSING,
    TRANSITIONS,
    State,
    TransitionError,
    allowed,
    check_sources,
    check_transition,
    reported_state,
    sources,
    targets,
)
from orchestrator.store import Store
from orchlib.errors import OrchError
from tests.orchestrator.races import postgres_schema

POSTGRES_ENV = "ORCH_TEST_POSTGRES_URL"
P, Q, R, RQ = State.PENDING, State.QUEUED, State.RUNNING, State.REQUEUED
FI, ST, FA, CA, LO = State.FINISHED, State.STOPPED, State.FAILED, State.CANCELLED, State.LOST
PR = State.PRUNED

# What the store's callers do today (engine, job, executors, local runner), written out once more on purpose: a
# change to the table must be a deliberate change to this list too.
EXPECTED = {
    (P, Q), (CA, Q), (LO, Q), (FA, Q),  # submitted (again; failed ones with --retry-failed)
    (Q, P),  # the submission failed
    (Q, R), (RQ, R), (R, R),  # the job starts, or restarts (after a requeue, or without having reported an end)
    (R, FI), (R, ST), (R, FA), (R, RQ),  # the job reports its end
    (P, CA), (Q, CA), (R, CA), (RQ, CA),  # orch cancel
    (Q, LO), (R, LO), (RQ, LO),  # the job vanished (reconcile)
    (Q, FA), (RQ, FA),  # a local job exited without reporting an end
    (CA, CA), (CA, FI), (CA, ST),  # the job of a cancelled cell reports its end
    (Q, PR), (R, PR), (RQ, PR), (PR, PR),  # orch tune prunes a trial; its stopped job reports its end
}
PAIRS = list(itertools.product(State, State))


def test_the_table_is_what_the_store_does() -> None:
    assert set(TRANSITIONS) == EXPECTED
    assert all(reason.strip() for reason in TRANSITIONS.values())


@pytest.mark.parametrize(("source", "target"), [pair for pair in PAIRS if pair in EXPECTED])
def test_every_transition_in_the_table_is_accepted(source: State, target: State) -> None:
    assert allowed(source, target) and allowed(str(source), str(target))
    assert check_transition(source, target) is target
    assert check_transition(str(source), str(target), "cell x") == target  # rows hold plain strings


@pytest.mark.parametrize(("source", "target"), [pair for pair in PAIRS if pair not in EXPECTED])
def test_every_other_pair_of_states_is_refused(source: State, target: State) -> None:
    assert not allowed(source, target)
    with pytest.raises(TransitionError, match=f"^cell 0a1b: cannot go from {source} to {target}; from {source} "
                                              "it may become: ") as caught:
        check_transition(str(source), str(target), "cell 0a1b")
    assert isinstance(caught.value, OrchError)  # one line for the user, like every other error


def test_sources_and_targets_follow_the_table() -> None:
    for state in State:
        assert targets(state) == {to for (start, to) in EXPECTED if start == state}
        assert sources(state) == {start for (start, to) in EXPECTED if to == state}
    assert sources(Q) == MISSING | {FA}  # what `orch sweep` / `orch resume` submit
    assert all(not targets(state) for state in DONE)  # finished and stopped are final
    assert sources(CA) >= ACTIVE and sources(LO) == ACTIVE
    with pytest.raises(TransitionError, match="from finished it may become: nothing"):
        check_transition(FI, R)


def test_unknown_states_and_bulk_sources() -> None:
    with pytest.raises(TransitionError, match="unknown state 'done'"):
        check_transition("done", R)
    with pytest.raises(TransitionError, match="unknown state 'done'"):
        check_transition(R, "done")
    assert check_sources([R, Q, RQ, P], CA) == [P, Q, RQ, R]
    with pytest.raises(TransitionError, match="cannot go from pending to finished"):
        check_sources([R, P], FI)


def test_reported_state() -> None:
    assert reported_state(CA, RQ) == CA and reported_state(CA, FA) == CA  # cancel wins over a late report
    assert reported_state(CA, FI) == FI and reported_state(CA, ST) == ST  # but a completed run stands
    assert reported_state(R, RQ) == RQ and reported_state(R, FA) == FA
    assert all(reported_state(PR, report) == PR for report in (RQ, FA, FI, ST))  # a pruned trial stays pruned


# -- through the store ------------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A new store: an SQLite file, or a new empty schema of the test database (dropped afterwards)."""
    if request.param == "sqlite":
        yield Store.open(f"sqlite:///{tmp_path / 'orch.db'}")
        return
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV} (bash scripts/setup_postgres.sh starts one and prints it)")
    with postgres_schema(url) as fresh:
        opened = Store.open(fresh)
        try:
            yield opened
        finally:
            opened.dispose()


def _cells(store: Store, count: int) -> list[int]:
    """Ids of `count` new pending cells of a new sweep."""
    sweep = store.save_sweep({"name": "s", "spec_path": "s.yaml", "spec_text": "name: s", "executor": "local",
                              "run_dir": "/tmp/s"})
    store.add_cells(sweep.id, [
        {"digest": f"{index:016x}", "position": index, "axis": None, "seed": index, "backend": "torch",
         "settings_json": "{}", "overrides_json": json.dumps([f"seed={index}"]), "varied_json": "{}",
         "resources_json": "{}"}
        for index in range(count)
    ])
    return [row.id for row in store.cell_rows(sweep.id)]


def _started(store: Store, cell_id: int) -> int:
    """Submit a pending cell and start its job; the attempt id."""
    store.record_submissions("local", [cell_id])
    return store.job_started(cell_id, "local", f"job{cell_id}", "h", 1)


def _snapshot(store: Store, cell_id: int) -> tuple:
    """Everything about a cell and its attempts that a state change writes."""
    (cell,) = [row for row in store.cell_rows(store.sweep("s").id) if row.id == cell_id]
    attempts = [(a.number, a.state, a.job_id, a.started_at, a.ended_at, a.reason, a.exit_code, a.steps_done)
                for a in store.attempts(cell_id)]
    return (cell.state, cell.attempts, cell.requeues, cell.job_id, cell.reason, cell.steps_done,
            cell.mlflow_run_id, cell.updated_at, attempts)


def test_ending_an_attempt_of_a_finished_cell_is_refused(store: Store) -> None:
    (cell_id,) = _cells(store, 1)
    attempt = _started(store, cell_id)
    store.job_ended(attempt, FI, steps_done=10, mlflow_run_id="run1")
    before = _snapshot(store, cell_id)
    for state in State:
        with pytest.raises(TransitionError, match=f"cannot go from finished to {state}"):
            store.job_ended(attempt, state, "late report", exit_code=3, steps_done=1, mlflow_run_id="other")
    assert store.end_attempts([attempt], LO, "vanished") == 0  # no longer open
    assert store.end_attempts([attempt], FA, "exited") == 0
    assert _snapshot(store, cell_id) == before


def test_job_started_on_a_finished_cell_is_refused(store: Store) -> None:
    (cell_id,) = _cells(store, 1)
    store.job_ended(_started(store, cell_id), ST, reason="nothing left to learn")
    before = _snapshot(store, cell_id)
    with pytest.raises(TransitionError, match=r"cell 0{16}: cannot go from stopped to running"):
        store.job_started(cell_id, "local", "job-again", "h", 2)
    assert _snapshot(store, cell_id) == before  # no new attempt either


def test_job_started_on_a_pending_or_lost_cell_is_refused(store: Store) -> None:
    pending, lost = _cells(store, 2)
    attempt = _started(store, lost)
    assert store.end_attempts([attempt], LO, "vanished") == 1
    for cell_id, state in ((pending, P), (lost, LO)):
        before = _snapshot(store, cell_id)
        with pytest.raises(TransitionError, match=f"cannot go from {state} to running"):
            store.job_started(cell_id, "local", "job", "h", 2)
        assert _snapshot(store, cell_id) == before


def test_mark_from_a_state_the_table_does_not_allow_is_refused(store: Store) -> None:
    pending, running, finished = _cells(store, 3)
    _started(store, running)
    store.job_ended(_started(store, finished), FI)
    before = {cell_id: _snapshot(store, cell_id) for cell_id in (pending, running, finished)}
    everything = [pending, running, finished]
    with pytest.raises(TransitionError, match="cells to mark finished: cannot go from pending to finished"):
        store.mark(everything, FI, "fake", only_states=[P])
    with pytest.raises(TransitionError, match="cannot go from queued to finished"):
        store.mark(everything, FI, "fake")  # the default sources (active states) may not finish by a mark
    with pytest.raises(TransitionError, match="cannot go from finished to cancelled"):
        store.mark(everything, CA, "fake", only_states=[R, FI])
    with pytest.raises(TransitionError, match="cannot go from requeued to pending"):
        store.mark(everything, P, "fake")
    assert {cell_id: _snapshot(store, cell_id) for cell_id in before} == before
    assert store.mark([finished], LO, "gone") == 0  # allowed sources, but the cell is in none of them
    assert store.mark(everything, CA, "orch cancel", only_states=ACTIVE | {P}) == 2
    assert [store.cell_states(everything)[cell_id] for cell_id in everything] == [CA, CA, FI]
    assert [a.state for a in store.attempts(running)] == [CA]


def test_submitting_an_active_or_done_cell_is_refused_and_submits_nothing(store: Store) -> None:
    pending, queued, finished = _cells(store, 3)
    store.record_submissions("local", [queued])
    store.job_ended(_started(store, finished), FI)
    before = {cell_id: _snapshot(store, cell_id) for cell_id in (pending, queued, finished)}
    for other in (queued, finished):
        with pytest.raises(TransitionError, match="cannot go from (queued|finished) to queued"):
            store.record_submissions("local", [pending, other])
    assert {cell_id: _snapshot(store, cell_id) for cell_id in before} == before  # not even the pending one


def test_a_late_report_of_a_resubmitted_cell_is_refused(store: Store) -> None:
    (cell_id,) = _cells(store, 1)
    old = _started(store, cell_id)
    assert store.end_attempts([old], LO, "vanished") == 1
    store.record_submissions("local", [cell_id])  # lost -> queued: a new attempt
    before = _snapshot(store, cell_id)
    with pytest.raises(TransitionError, match="attempt 1 of cell 0{16}: cannot go from lost to finished"):
        store.job_ended(old, FI, steps_done=3)
    assert _snapshot(store, cell_id) == before


def test_end_attempts_only_takes_end_states(store: Store) -> None:
    (cell_id,) = _cells(store, 1)
    attempt = _started(store, cell_id)
    with pytest.raises(TransitionError, match="no open attempt may become 'queued'"):
        store.end_attempts([attempt], Q, "nonsense")
    assert store.cell_states([cell_id]) == {cell_id: R}


def test_resubmission_and_cancellation_paths(store: Store) -> None:
    """The legal paths that the lifecycle test of test_sweep_store.py does not take."""
    failed, cancelled, restarted = _cells(store, 3)
    store.job_ended(_started(store, failed), FA, "boom", exit_code=1)
    store.record_submissions("local", [failed])  # failed -> queued (--retry-failed)
    first = _started(store, restarted)
    second = store.job_started(restarted, "local", f"job{restarted}", "h", 2)  # running -> running: restarted
    assert second != first and [a.state for a in store.attempts(restarted)] == [LO, R]
    cancelled_attempt = _started(store, cancelled)
    assert store.mark([cancelled], CA, "orch cancel", only_states=ACTIVE) == 1
    assert store.job_ended(cancelled_attempt, FI, steps_done=5) == FI  # it completed before it saw the cancel
    assert store.cell_states([failed, cancelled, restarted]) == {failed: Q, cancelled: FI, restarted: R}
    with pytest.raises(OrchError, match="no attempt with id 999"):
        store.job_ended(999, FI)


def test_the_reliability_page_lists_every_transition() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` → `(\w+)` \|", text, flags=re.MULTILINE))
    assert listed == {(str(source), str(target)) for source, target in TRANSITIONS}
