"""A job's stop signal reaches every process of the job (SLURM signals the whole job step; a Ctrl-C the terminal's
foreground group); the short helper processes a job starts -- `orchlib.sqlurl`'s look at an SQLite file -- run to
their end through it (`orchlib.signals.held_by_children`), and the job still receives it. Issue 31, loaded CI run L1:
a SIGUSR2 that landed while the SLURM job looked at its MLflow store killed the look, and the cell failed with
"unknown error" instead of checkpointing and requeueing."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchlib import sqlurl
from orchlib.errors import OrchError
from orchlib.signals import STOP_SIGNALS, held_by_children


def database(tmp_path: Path) -> Path:
    path = tmp_path / "mlflow.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE runs (id TEXT)")
        conn.commit()
    return path


@pytest.fixture
def signalled_at_start(monkeypatch) -> list[subprocess.Popen]:
    """Every process `orchlib.sqlurl` starts gets the three stop signals the moment it exists (before its Python
    has run a line): the worst moment, on any machine's speed."""
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        process = real(*args, **kwargs)
        for number in STOP_SIGNALS:
            os.kill(process.pid, number)
        started.append(process)
        return process

    monkeypatch.setattr(sqlurl.subprocess, "Popen", popen)
    return started


def test_the_look_at_an_sqlite_file_runs_to_its_end_through_a_stop_signal(tmp_path, signalled_at_start):
    assert sqlurl.sqlite_tables(database(tmp_path), "mlflow.tracking_uri") == {"runs"}
    (look,) = signalled_at_start
    assert look.returncode == 0


def test_without_the_shield_the_signal_kills_the_look(tmp_path, signalled_at_start, monkeypatch):
    # the control: the same signals, the look started unshielded, dies of them -- the failure of run L1
    monkeypatch.setattr(sqlurl, "held_by_children", contextlib.nullcontext)
    with pytest.raises(OrchError, match=r"mlflow.tracking_uri: the look at .*mlflow.db ended with exit status -"):
        sqlurl.sqlite_tables(database(tmp_path), "mlflow.tracking_uri")
    (look,) = signalled_at_start
    assert look.returncode < 0


def test_the_process_that_holds_the_signals_still_receives_its_own():
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda number, frame: received.append(number))
    try:
        with held_by_children():
            child = subprocess.Popen([sys.executable, "-I", "-c", "import signal, sys; "
                                      "sys.exit(0 if signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, []) else 3)"])
            os.kill(os.getpid(), signal.SIGUSR2)
        assert child.wait(timeout=60) == 0  # the child started with the stop signals blocked
        deadline = time.monotonic() + 30
        while not received:  # delivered to another thread meanwhile, or on leaving the context
            assert time.monotonic() < deadline, "the signal sent to this process was lost"
            time.sleep(0.01)
        assert received == [signal.SIGUSR2]
        assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the mask is back as it was
    finally:
        signal.signal(signal.SIGUSR2, previous)


@pytest.mark.parametrize("number", STOP_SIGNALS)
def test_a_stop_signal_ends_a_command_that_trains_nothing_through_its_cleanup(number: int) -> None:
    """Issue 45 item 2: in `orch eval`, `orch export`, `orch sweep --preflight`, ... a stop signal raises `StopSignal`
    where the command is, so its `finally` blocks run (a scratch folder removed, a child process killed), and the
    handlers in place before come back; a second signal while it unwinds acts as without orch."""
    from orchlib.signals import StopSignal, stop_ends_command

    before = {n: signal.getsignal(n) for n in STOP_SIGNALS}
    cleaned = []
    with pytest.raises(StopSignal) as stopped, stop_ends_command():
        try:
            os.kill(os.getpid(), number)
            time.sleep(5)  # the handler runs at the next bytecode: the sleep is cut short
        finally:
            cleaned.append(signal.getsignal(signal.SIGTERM))
    assert stopped.value.number == number and stopped.value.exit_code == 128 + number
    assert cleaned == [signal.SIG_DFL]  # a second SIGTERM while unwinding kills at once
    assert {n: signal.getsignal(n) for n in STOP_SIGNALS} == before
