"""Work done every few seconds beside the main thread, for as long as a context is open (a job's heartbeat, the
verl backend's watch for a stop request)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def every(interval_s: float, tick: Callable[[], bool | None], name: str) -> Iterator[None]:
    """Call `tick()` every `interval_s` seconds from a daemon thread while the context is open; a tick that returns
    True is the last one. The thread is stopped (and joined, up to 5 s) when the context closes."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(interval_s):
            if tick():
                return

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
