"""TEST-ONLY: registers the `orch-test` backend in job subprocesses (tests put this folder on PYTHONPATH)."""

import orch_test_backend  # noqa: F401
