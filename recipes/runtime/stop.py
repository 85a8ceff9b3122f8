"""The one stop signal of a training run: SIGUSR2 (SLURM's warning before the time limit), SIGTERM (preemption,
`scancel`, `orch cancel`) or SIGINT (Ctrl-C) asks the trainer to stop its current work, checkpoint its last completed
step and exit. A second SIGINT stops at once, without a checkpoint (`KeyboardInterrupt`; `orch train` says so in one
line).

    with StopRequest() as stop:
        result = backend(cfg, should_stop=stop)     # polled between steps, and inside phases (below)
    stop.signal_name                                # "SIGUSR2", "SIGTERM" or None

Inside a step, the phases that leave the model as it was (rollout, scoring, diagnostics, validation) run inside
`interruptible(should_stop)`; their loops call `poll()` between decoded tokens and micro-batches, which raises
`StopRequested` once a stop is asked for, so the phase ends within a fraction of a second and the trainer discards
the unfinished step. The update changes the model: the torch trainer keeps a copy of the models and optimisers
while it runs and puts it back when a stop ends it (`recipes.runtime.update_undo.UpdateUndo`).

`orch train` and the sweep job both use it. Handlers can only be installed in the main thread; elsewhere (a debug
executor running cells in a thread) the signals keep their handlers and `stop()` stays false.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from orchlib.signals import STOP_SIGNALS


class StopRequested(Exception):  # noqa: N818 (a request, not an error)
    """Raised by a phase that polls the stop request inside itself (the warm start, between optimiser steps) once it
    has kept what it can, or by `poll()`; the trainer turns it into status `preempted`. The message says what was
    kept; `phase` names the phase it interrupted, where the trainer knows it."""

    phase: str | None = None


_ARMED: ContextVar[Callable[[], bool] | None] = ContextVar("orch_stop_poll", default=None)


@contextmanager
def interruptible(should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """While the block runs, `poll()` raises `StopRequested` once `should_stop()` is true (None: never)."""
    token = _ARMED.set(should_stop)
    try:
        yield
    finally:
        _ARMED.reset(token)


def poll() -> None:
    """Raise `StopRequested` if a stop was asked for inside an `interruptible` block (a no-op elsewhere)."""
    should_stop = _ARMED.get()
    if should_stop is not None and should_stop():
        raise StopRequested("stop requested")


class StopRequest:
    """A flag set by the stop signals while the context is open (the previous handlers come back on exit)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        return self.signal_name is not None

    def request(self, signal_name: str) -> None:
        """Ask for a stop (what a signal does)."""
        self.signal_name = signal_name

    def _handle(self, number: int, _frame: Any) -> None:
        name = signal.Signals(number).name
        if number == signal.SIGINT and self.signal_name is not None:  # Ctrl-C again: stop now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        again = " (Ctrl-C again: stop at once, without a checkpoint)" if number == signal.SIGINT else ""
        print(f"orch: received {name}: the trainer will stop its current work, checkpoint its last completed step "
              f"and exit{again}",
              file=sys.stderr, flush=True)
        self.request(name)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}
