"""The signals that ask a job to stop, and helper processes they must not kill.

SLURM delivers a job's signals (`--signal=USR2@90` before the time limit, `scancel --signal`, the SIGTERM of a
preemption) to every process of the job step, children included; so does a Ctrl-C to a terminal's foreground process
group. The job itself catches them and stops cleanly (`recipes.runtime.stop`); a short helper process it started a
moment before (a first look at an SQLite file, `orchlib.sqlurl`) has no handler and dies of the signal, and the job
then fails with the helper's non-answer instead of checkpointing (issue 31: a SIGUSR2 that landed during the look
at the MLflow store failed a SLURM cell). :func:`held_by_children` starts such helpers with the stop signals blocked:
the mask survives `exec`, the signal stays pending in the helper until it exits, and the job still receives its own.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


@contextmanager
def held_by_children() -> Iterator[None]:
    """Block the stop signals in this thread while the context is open: a process started inside it (fork + exec
    from this thread) starts with them blocked and runs to its end through them. Hold it around the start only (the
    `Popen`), not the wait: the blocking thread receives none of them meanwhile (another thread of the process does,
    or it is delivered when the context closes), and nothing is lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
