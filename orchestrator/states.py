"""The states of a cell (and of each of its attempts), and which of them count as active, done or retryable.

    pending ──submit──▶ queued ──job starts──▶ running ──▶ finished | stopped | failed
                          ▲                       │
                          └──── requeued ◀────────┘  (preemption or time limit: checkpoint, requeue, resume)
    any active state ──orch cancel──▶ cancelled;  job vanished without reporting ──reconcile──▶ lost
"""

from __future__ import annotations

from enum import StrEnum


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


ACTIVE = frozenset({State.QUEUED, State.RUNNING, State.REQUEUED})
DONE = frozenset({State.FINISHED, State.STOPPED})
# Submitted again by `orch sweep` / `orch resume` (FAILED too with --retry-failed).
MISSING = frozenset({State.PENDING, State.CANCELLED, State.LOST})
ORDER = (State.RUNNING, State.REQUEUED, State.QUEUED, State.FAILED, State.LOST, State.CANCELLED, State.PENDING,
         State.STOPPED, State.FINISHED)

# `recipes.backends.TrainResult.status` -> state of the attempt.
FROM_TRAIN_STATUS = {
    "finished": State.FINISHED,
    "stopped": State.STOPPED,
    "failed": State.FAILED,
    "preempted": State.REQUEUED,
}
