"""The process that submitit's local controller starts for a cell's job (`--cluster local`): it runs the job as
its child and keeps how that child ended, which submitit's controller forgets (it exits 0 whatever its task did).

    python -m orchestrator.local_task PYTHON -u -m submitit.core._submit FOLDER

Signals (SIGTERM from `orch cancel`, SIGUSR2 before the time limit, SIGINT) are passed on to the job. When the
job ends, its end (`killed by SIGKILL`, `exited with code 1`) is written to `<FOLDER>/<job id>_<task>_end.txt`,
which the local runner reads for a job that died without reporting (`exit_note`); the same code is returned, so
submitit's requeue code still requeues. The job dies with this process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def end_file(folder: Path, job_id: str, task: int | str = 0) -> Path:
    """Where the wrapper of task `task` of local job `job_id` writes how it ended."""
    return Path(folder) / f"{job_id}_{task}_end.txt"


def describe(code: int) -> str:
    """`killed by SIGKILL` for a negative return code, `exited with code N` otherwise."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def exit_note(folder: Path, job_id: str, task: int | str = 0) -> str | None:
    """How task `task` of local job `job_id` ended, if its wrapper wrote it."""
    try:
        return end_file(folder, job_id, task).read_text().strip() or None
    except OSError:
        return None


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the job may outlive a killed wrapper
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Run `argv` as a child, forward signals to it, record and return how it ended."""
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent)  # noqa: PLW1509 - only a prctl call
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    how = describe(code)
    if code < 0:
        print(f"orch: the job process {child.pid} was {how}", file=sys.stderr, flush=True)
    job_id = os.environ.get("SUBMITIT_LOCAL_JOB_ID")
    if job_id and argv:
        try:
            end_file(Path(argv[-1]), job_id, os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0")).write_text(how + "\n")
        except OSError as err:
            print(f"orch: could not record the job's end: {err}", file=sys.stderr)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
