"""The state machine of a cell (and of each of its attempts): the states, and the one table of the transitions
between them that every state change of the store is checked against.

    pending ──submit──▶ queued ──job starts──▶ running ──job ends──▶ finished | stopped | failed
       ▲                  │                     │  ▲
       └─submission failed┘   checkpointed on   │  │  the job restarts: a new attempt resumes
                              preemption or     ▼  │  from the checkpoint
                              time limit       requeued

    running ──the job restarts without having reported an end (a new attempt)──▶ running
    pending | queued | running | requeued ──orch cancel──▶ cancelled
    queued | running | requeued ──its job vanished or was killed by a signal without reporting, or
                                  stalled (cluster.stall)──▶ lost
    queued | running | requeued ──local job exited without reporting an end, or restarted past
                                  cluster.max_requeues, or stalled (cluster.stall)──▶ failed
    cancelled ──its job reports a requeue request or a failure──▶ cancelled
    cancelled ──its job completed before it saw the cancel──▶ finished | stopped
    cancelled | lost | failed (`--retry-failed`) ──submitted again──▶ queued
    queued | running | requeued ──`orch tune` pruned the trial (its job is stopped)──▶ pruned
    pruned ──its job reports anything after the prune──▶ pruned

A cell is created `pending`; finished and stopped cells never change again, and pruned ones only take the late
report of their stopped job. An attempt is created `queued` (a
restarting job's attempt is created and started at once) and moves along the same table, but a restart or a
resubmission opens a new attempt instead of moving the old one, so of the cell's edges an attempt only ever
takes those that start or end it (an open attempt also becomes lost when its job restarts without having
reported an end). `TRANSITIONS` is the only place that says which changes are legal: the
store checks each row it changes with `check_transition`, and selects the rows of its bulk updates by the
sources the table allows (`check_sources`, `sources`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType

from orchlib.errors import OrchError


class State(StrEnum):
    """State of a cell or an attempt."""

    PENDING = "pending"  # in the store, never submitted
    QUEUED = "queued"  # submitted, waiting for the cluster
    RUNNING = "running"  # the job reported its start (and heartbeats)
    REQUEUED = "requeued"  # checkpointed on preemption/time limit, waiting to resume
    FINISHED = "finished"  # all steps done
    STOPPED = "stopped"  # the trainer ended the run early on purpose (e.g. nothing left to learn from)
    FAILED = "failed"  # an error; the reason holds its last lines
    CANCELLED = "cancelled"  # `orch cancel`
    LOST = "lost"  # the job disappeared without reporting (killed, node failure)
    PRUNED = "pruned"  # `orch tune` stopped the trial early: its intermediate values were among the worst


ACTIVE = frozenset({State.QUEUED, State.RUNNING, State.REQUEUED})
DONE = frozenset({State.FINISHED, State.STOPPED})
# Submitted again by `orch sweep` / `orch resume` (FAILED too with --retry-failed).
MISSING = frozenset({State.PENDING, State.CANCELLED, State.LOST})
ORDER = (State.RUNNING, State.REQUEUED, State.QUEUED, State.FAILED, State.LOST, State.CANCELLED, State.PENDING,
         State.PRUNED, State.STOPPED, State.FINISHED)

# `recipes.config.backends.TrainResult.status` -> state of the attempt.
FROM_TRAIN_STATUS = {
    "finished": State.FINISHED,
    "stopped": State.STOPPED,
    "failed": State.FAILED,
    "preempted": State.REQUEUED,
}

_CANCEL = "`orch cancel`"
_VANISHED = ("its job vanished without reporting (reconcile), a signal killed its local job (kill -9, OOM), or the "
             "cluster restarted it without an end report")
_EXITED = "its local job exited without reporting an end"
_TOO_MANY = "its job was restarted past cluster.max_requeues"
_RESUBMIT = "submitted again (`orch sweep`, `orch resume`)"
_PRUNE = "`orch tune` pruned its trial (the job is asked to stop)"

# (from, to) -> what makes a cell (or an attempt) take that step. Nothing else is allowed.
TRANSITIONS: Mapping[tuple[State, State], str] = MappingProxyType({
    (State.PENDING, State.QUEUED): "submitted (`orch sweep`, `orch resume`)",
    (State.PENDING, State.CANCELLED): _CANCEL,
    (State.QUEUED, State.PENDING): "the submission to the executor failed",
    (State.QUEUED, State.RUNNING): "its job started",
    (State.QUEUED, State.CANCELLED): _CANCEL,
    (State.QUEUED, State.LOST): _VANISHED,
    (State.QUEUED, State.FAILED): f"{_EXITED}, or (an attempt) {_TOO_MANY}",
    (State.RUNNING, State.RUNNING): "its job restarted without having reported an end (a new attempt)",
    (State.RUNNING, State.FINISHED): "its job ended: all steps done",
    (State.RUNNING, State.STOPPED): "its job ended: the trainer stopped early on purpose",
    (State.RUNNING, State.FAILED): f"its job ended with an error, {_EXITED}, {_TOO_MANY}, or it stalled "
                                   "(cluster.stall action fail)",
    (State.RUNNING, State.REQUEUED): "its job checkpointed on preemption or time limit and asked to be requeued",
    (State.RUNNING, State.CANCELLED): _CANCEL,
    (State.RUNNING, State.LOST): f"{_VANISHED}, or it stalled (cluster.stall action requeue)",
    (State.REQUEUED, State.RUNNING): "its job restarted (a new attempt resumes from the checkpoint)",
    (State.REQUEUED, State.CANCELLED): _CANCEL,
    (State.REQUEUED, State.LOST): _VANISHED,
    (State.REQUEUED, State.FAILED): f"{_EXITED}, or {_TOO_MANY}",
    (State.FAILED, State.QUEUED): "submitted again with --retry-failed",
    (State.CANCELLED, State.QUEUED): _RESUBMIT,
    (State.CANCELLED, State.CANCELLED): "its job reported a requeue request or a failure after `orch cancel`",
    (State.CANCELLED, State.FINISHED): "its job completed before it saw `orch cancel`",
    (State.CANCELLED, State.STOPPED): "its job stopped early on purpose before it saw `orch cancel`",
    (State.LOST, State.QUEUED): _RESUBMIT,
    (State.QUEUED, State.PRUNED): _PRUNE,
    (State.RUNNING, State.PRUNED): _PRUNE,
    (State.REQUEUED, State.PRUNED): _PRUNE,
    (State.PRUNED, State.PRUNED): "its job reported its end (stopped, requeue request, failure) after the prune",
})


_NAMES = frozenset(state.value for state in State)


class TransitionError(OrchError):
    """A state change outside `TRANSITIONS`."""


def allowed(source: str, target: str) -> bool:
    """Whether the table lets a cell (or attempt) in `source` become `target`."""
    return (source, target) in TRANSITIONS


def targets(source: str) -> frozenset[State]:
    """The states `source` may become."""
    return frozenset(to for (start, to) in TRANSITIONS if start == source)


def sources(target: str) -> frozenset[State]:
    """The states that may become `target`."""
    return frozenset(start for (start, to) in TRANSITIONS if to == target)


def check_transition(source: str, target: str, what: str = "cell") -> State:
    """`target` as a `State` if `what` (e.g. "cell 0a1b2c3d") may go from `source` to it; `TransitionError`,
    naming the states it may become, otherwise."""
    if allowed(source, target):
        return State(target)
    for state in (source, target):
        if state not in _NAMES:
            raise TransitionError(f"{what}: unknown state {state!r}; states: {', '.join(State)}")
    choices = ", ".join(sorted(targets(source))) or "nothing (it is final)"
    raise TransitionError(f"{what}: cannot go from {source} to {target}; from {source} it may become: {choices}")


def check_sources(states: Iterable[str], target: str, what: str = "cell") -> list[State]:
    """`states`, sorted, if each of them may become `target`; `TransitionError` for the first that may not. For
    the `WHERE state IN (...)` of a bulk update."""
    requested = sorted({str(state) for state in states})
    for state in requested:
        check_transition(state, target, what)
    return [State(state) for state in requested]


def reported_state(cell_state: str, reported: str) -> State:
    """The state a job's end report gives its cell: a requeue request or a failure reported for a cancelled cell
    keeps it cancelled (the job was stopped by `orch cancel`), any report for a pruned cell keeps it pruned (the
    tuner stopped it and told Optuna so); any other report stands as it is."""
    if cell_state == State.CANCELLED and reported in (State.REQUEUED, State.FAILED):
        return State.CANCELLED
    if cell_state == State.PRUNED:
        return State.PRUNED
    return State(reported)
