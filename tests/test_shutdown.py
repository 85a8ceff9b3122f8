"""A process that is done skips the interpreter's shutdown collections (`orchlib.shutdown.before_exit`): `orch`'s
console script and a cell's job in its own process freeze the collector as their last act, a job run inside a
process that goes on (the debug executor) leaves it alone. Checked in fresh interpreters, where an atexit handler
(which runs after the entry point returns) reads the freeze count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AT_EXIT = "import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"


def frozen_at_exit(body: str) -> tuple[bool, str]:
    done = subprocess.run([sys.executable, "-c", AT_EXIT + body], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("frozen ")]
    return line == "frozen True", done.stdout + done.stderr


def test_the_console_script_freezes_the_collector_as_it_ends_even_on_an_error() -> None:
    for argv in (["orch", "--help"], ["orch", "status", "--store", "nowhere:///x"]):
        frozen, output = frozen_at_exit(f"import sys; sys.argv = {argv!r}\nfrom orchestrator.cli import main\nmain()")
        assert frozen, output


@pytest.mark.parametrize("ends_process", [True, False])
def test_a_cell_job_freezes_the_collector_only_where_it_ends_its_process(ends_process: bool) -> None:
    body = f"""
import orchestrator.job as job
def failing(*args):
    raise RuntimeError("the cell failed")
job.run_cell = failing
try:
    job.CellJob("sqlite:///x.db", 1, "local", print, ends_process={ends_process})()
except RuntimeError:
    pass
"""
    frozen, output = frozen_at_exit(body)
    assert frozen is ends_process, output


def test_a_cell_job_pickled_before_its_fields_existed_still_ends_its_process() -> None:
    """A job submitted by an older orch (no `ends_process`, no `attempt_id` in its pickle) and run, or requeued, by
    this one: it ends its process, and claims no particular attempt."""
    import pickle

    from orchestrator.job import CellJob

    old = CellJob("sqlite:///x.db", 1, "slurm", print)
    del old.__dict__["ends_process"], old.__dict__["attempt_id"]
    loaded = pickle.loads(pickle.dumps(old))
    assert loaded.ends_process is True and loaded.attempt_id is None
