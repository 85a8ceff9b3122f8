"""TEST-ONLY: registers the `orch-test` backend in job subprocesses (tests put this folder on PYTHONPATH).

ORCH_TEST_START_GATE names a file: a job that has reported its start (`Store.job_started`) waits until that file
exists before it goes on to its trainer, so a test can land a signal in that window by events, not by timing."""

import os
import time
from pathlib import Path

import orch_test_backend  # noqa: F401

if os.environ.get("ORCH_TEST_START_GATE"):
    from orchestrator.store import Store

    _job_started = Store.job_started

    def _job_started_then_wait(self, *args, **kwargs):
        attempt = _job_started(self, *args, **kwargs)
        gate, deadline = Path(os.environ["ORCH_TEST_START_GATE"]), time.monotonic() + 300
        while not gate.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"orch-test: the start gate {gate} was never opened")
            time.sleep(0.02)
        return attempt

    Store.job_started = _job_started_then_wait
