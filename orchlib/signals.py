"""The signals that ask a job to stop, and helper processes they must not kill.

SLURM delivers a job's signals (`--signal=USR2@90` before the time limit, `scancel --signal`, the SIGTERM of a
preemption) to every process of the job step, children included; so does a Ctrl-C to a terminal's foreground process
group. The job itself catches them and stops cleanly (`recipes.runtime.stop`); a short helper process it started a
moment before (a first look at an SQLite file, `orchlib.sqlurl`) has no handler and dies of the signal, and the job
then fails with the helper's non-answer instead of checkpointing (issue 31: a SIGUSR2 that landed during the look
at the MLflow store failed a SLURM cell). :func:`held_by_children` starts such helpers with the stop signals blocked:
the mask survives `exec`, the signal stays pending in the helper until it exits, and the job still receives its own.

The commands that train install their own handlers (a stop there checkpoints first); every other command of the CLI
(`orch eval`, `orch export`, `orch tune --wait`, `orch sweep --preflight`, ...) runs inside :func:`stop_ends_command`:
a stop signal raises :class:`StopSignal` where the command is, so its `finally` blocks and context managers run (a
scratch folder removed, a child process such as veRL's model merger killed by `subprocess.run`, an MLflow run ended)
and the CLI ends with one line and exit code 128 + the signal's number, instead of dying silently mid-write.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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


class StopSignal(BaseException):  # noqa: N818 (a signal, not an error); BaseException: `except Exception` lets it by
    """A stop signal received by a command that has nothing to checkpoint: it ends the command where it is."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.name = signal.Signals(number).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.number


def _raise_stop(number: int, _frame: Any) -> None:
    for other in STOP_SIGNALS:  # a second signal while the command unwinds acts as it would without orch
        signal.signal(other, signal.default_int_handler if other == signal.SIGINT else signal.SIG_DFL)
    raise StopSignal(number)


@contextmanager
def stop_ends_command() -> Iterator[None]:
    """While open (in the main thread), a stop signal raises `StopSignal` in it; the previous handlers come back on
    exit. A command that trains replaces these handlers with its own (`recipes.runtime.stop.StopRequest`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, _raise_stop) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
