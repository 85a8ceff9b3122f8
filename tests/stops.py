"""Signalling a real `orch` process at a moment its log names (the stop tests of both backends)."""

from __future__ import annotations

import signal
import subprocess
import time


def signal_at_line(process: subprocess.Popen, text: str, number: int = signal.SIGTERM,
                   timeout_s: float = 600.0) -> float:
    """Read `process`'s stderr line by line until one contains `text`, then send it `number`; returns when
    (`time.monotonic()`). AssertionError naming `text` when it never came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for line in process.stderr:
        if text in line:
            sent = time.monotonic()
            process.send_signal(number)
            return sent
        assert time.monotonic() < deadline, f"the process never logged {text!r}"
    raise AssertionError(f"the process ended (exit {process.wait()}) without logging {text!r}")
