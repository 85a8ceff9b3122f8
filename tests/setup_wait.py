"""Set-up that `scripts/test.sh` runs in the background while the suite runs (downloads and unpacking that need the
network more than the cores): each job writes `$ORCH_SETUP_DIR/NAME.log`, then `NAME.rc` with its exit code. A test
that needs one waits here for it; run without test.sh (no ORCH_SETUP_DIR), it finds nothing to wait for and the
test does or checks its own set-up."""

from __future__ import annotations

import os
import time
from pathlib import Path

WAIT_S = 1800.0


def wait_for_setup(name: str, timeout_s: float = WAIT_S) -> bool:
    """Wait for the background set-up job `name` to end; True if test.sh started it (it then must have succeeded:
    AssertionError with its log's last lines otherwise), False when there is no such job to wait for."""
    folder = os.environ.get("ORCH_SETUP_DIR")
    if not folder or not (Path(folder) / f"{name}.log").exists():
        return False
    rc, log = Path(folder) / f"{name}.rc", Path(folder) / f"{name}.log"
    deadline = time.monotonic() + timeout_s
    while not rc.exists() and time.monotonic() < deadline:
        time.sleep(2)
    assert rc.exists(), f"background set-up {name} still running after {timeout_s:.0f} s: {log.read_text()[-2000:]}"
    assert rc.read_text().strip() == "0", f"background set-up {name} failed: {log.read_text()[-2000:]}"
    return True
