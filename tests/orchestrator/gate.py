"""A step gate for the TEST-ONLY `orch-test` backend: the test, not the clock, decides when each step may run.

The backend reads `ORCH_TEST_GATE` (a JSON file `{run id or "*": highest step allowed}`) before every step and
waits until its run (or `"*"`) allows that step, still honouring a stop request while it waits. A test holds cells
at a known step, acts on them (kill, cancel, prune), then opens the gate: no sleep races the machine's speed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OPEN = 1_000_000


class Gate:
    """Writes the gate file atomically (the backend never reads half a file)."""

    def __init__(self, path: Path, allowed: int = 0) -> None:
        self.path = path.resolve()  # jobs may run in another working directory
        self.allowed: dict[str, int] = {}
        self.allow("*", allowed)

    def allow(self, run: str, step: int) -> None:
        """Let `run` (an MLflow run id, or "*" for every run without its own entry) run up to `step`."""
        self.allowed[run] = step
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.allowed))
        os.replace(tmp, self.path)

    def open(self) -> None:
        """Every run may run to its end."""
        self.allowed = {}
        self.allow("*", OPEN)

    def install(self, monkeypatch) -> Gate:
        """Jobs started from now on wait at this gate."""
        monkeypatch.setenv("ORCH_TEST_GATE", str(self.path))
        return self
