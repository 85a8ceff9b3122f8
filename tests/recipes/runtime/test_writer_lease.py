"""One writer per checkpoint folder (`orchlib.lease`): a live writer refuses a second, on this host (PID and start
time) and from another (a lease renewed by a thread, so a slow writer keeps it); a dead one is taken over; of many
processes taking over one stale lease exactly one wins. `orch train` on a folder in use exits 2 with one line and
writes nothing. The sweep's case (a cell resumed while its cancelled attempt still stops) is in
`tests/orchestrator/test_sweep_executors.py`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchlib.lease import LEASE_FILE, InUseError, WriterLease, read_lease

HOLD = """
import sys, time
from pathlib import Path
from orchlib.lease import WriterLease
lease = WriterLease(Path(sys.argv[1]), lease_s=float(sys.argv[2]))
lease.acquire()
Path(sys.argv[1], "held").write_text("1")
time.sleep(float(sys.argv[3]))  # the main thread blocked (a long step): only the renewing thread runs
print("lost" if lease.lost else "kept", flush=True)
lease.release()
"""


def hold(folder: Path, lease_s: float = 120.0, for_s: float = 600.0) -> subprocess.Popen:
    """A process holding the lease on `folder`, its main thread asleep; returns once it holds it."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(lease_s), str(for_s)],
                               stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    deadline = time.monotonic() + 60
    while not (folder / "held").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the holder did not take the lease"
        time.sleep(0.05)
    return process


def test_a_live_writer_on_this_host_is_refused_by_name_and_a_dead_one_is_taken_over(tmp_path: Path) -> None:
    holder = hold(tmp_path)
    try:
        with pytest.raises(InUseError, match=rf"in use by PID {holder.pid} on {os.uname().nodename} \(since "):
            WriterLease(tmp_path, lease_s=0.1).acquire()  # its PID lives: the lease's age does not matter here
    finally:
        holder.send_signal(signal.SIGKILL)  # dies without releasing
        holder.wait()
    assert read_lease(tmp_path / LEASE_FILE)["pid"] == holder.pid
    lease = WriterLease(tmp_path)
    assert lease.acquire() and read_lease(tmp_path / LEASE_FILE)["token"] == lease.token
    lease.release()
    assert not (tmp_path / LEASE_FILE).exists()


def test_a_recycled_pid_is_not_taken_for_the_holder(tmp_path: Path) -> None:
    """A lease of this host whose PID now names another process (another start time) is stale."""
    (tmp_path / LEASE_FILE).write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid(), "start": "1",
                                                   "token": "old", "since": time.time(), "renewed": time.time()}))
    lease = WriterLease(tmp_path)
    assert lease.acquire()
    lease.release()


def test_another_hosts_lease_holds_while_renewed_and_is_taken_over_once_it_lapses(tmp_path: Path) -> None:
    now = time.time()
    record = {"host": "node-b", "pid": 4242, "token": "b", "since": now - 600, "renewed": now - 5}
    (tmp_path / LEASE_FILE).write_text(json.dumps(record))
    with pytest.raises(InUseError, match=r"in use by PID 4242 on node-b \(since .*renewed 5 s ago\)"):
        WriterLease(tmp_path, lease_s=60).acquire()
    (tmp_path / LEASE_FILE).write_text(json.dumps({**record, "renewed": now - 61}))  # node-b died a minute ago
    lease = WriterLease(tmp_path, lease_s=60)
    assert lease.acquire()
    lease.release()


HOLD_UNTIL = """
import sys, time
from pathlib import Path
from orchlib.lease import WriterLease
lease = WriterLease(Path(sys.argv[1]), lease_s=float(sys.argv[2]))
lease.acquire()
Path(sys.argv[1], "held").write_text("1")
while not Path(sys.argv[3]).exists():  # the main thread busy elsewhere (a long step): only the renewing thread runs
    time.sleep(0.05)
print("lost" if lease.lost else "kept", flush=True)
lease.release()
"""


def test_a_slow_but_alive_writer_keeps_its_lease_past_its_length(tmp_path: Path) -> None:
    """The holder's main thread is held until the test has seen its renewing thread renew the lease three times,
    the last one past the lease's length; meanwhile a process on another host (which can only judge by age) is
    refused throughout, and the holder ends with its lease.

    Driven by events, not by the ratio of two sleeps: the test waits for renewals it sees in the lease file, and
    the other host judges with a lease of 60 s, so only a holder frozen for a minute could lose it here. (With one
    lease length for both, any stall of the holder longer than the lease is a legitimate take-over: that is what a
    lease means, and loaded CI runs saw 6 s stalls. A lapsed lease being taken over is the next tests' subject.)"""
    lease_s = 2.0
    release = tmp_path / "release"
    process = subprocess.Popen([sys.executable, "-c", HOLD_UNTIL, str(tmp_path), str(lease_s), str(release)],
                               stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    other = WriterLease(tmp_path, lease_s=60.0, host="node-b")
    renewals: set[float] = set()
    refused = 0
    past_length = False
    deadline = time.monotonic() + 300
    try:
        while not (past_length and len(renewals) >= 3):
            assert process.poll() is None and time.monotonic() < deadline, "the holder stopped renewing"
            record = read_lease(tmp_path / LEASE_FILE) if (tmp_path / "held").exists() else None
            if record is not None and record["renewed"] != record["since"]:
                renewals.add(record["renewed"])
                past_length = record["renewed"] - record["since"] > lease_s
            if record is not None:
                with pytest.raises(InUseError):
                    other.acquire()
                refused += 1
            time.sleep(0.05)
    finally:
        release.touch()
    out, _ = process.communicate(timeout=120)
    assert refused >= 3 and out.strip() == "kept"


def test_a_writer_whose_lease_was_taken_knows_it_lost_it(tmp_path: Path) -> None:
    lease = WriterLease(tmp_path)
    lease.acquire()
    record = read_lease(tmp_path / LEASE_FILE)
    (tmp_path / LEASE_FILE).write_text(json.dumps({**record, "token": "someone else"}))
    assert lease.renew() is False and lease.lost
    lease.release()
    assert read_lease(tmp_path / LEASE_FILE)["token"] == "someone else"  # not ours to remove


CONTEND = """
import sys, time
from pathlib import Path
from orchlib.lease import InUseError, WriterLease
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
try:
    print(WriterLease(Path(sys.argv[1])).acquire(), flush=True)
except InUseError:
    print(False, flush=True)
while not Path(sys.argv[3]).exists():  # a winner that exited would leave a stale lease for a late contender
    time.sleep(0.05)
"""


def test_of_many_processes_taking_over_one_stale_lease_exactly_one_wins(tmp_path: Path) -> None:
    folder, go = tmp_path / "folder", tmp_path / "go"
    folder.mkdir()
    (folder / LEASE_FILE).write_text(json.dumps({"host": os.uname().nodename, "pid": 2 ** 22 + 7, "token": "dead",
                                                 "since": 0, "renewed": 0}))
    root = Path(__file__).resolve().parents[3]
    done = tmp_path / "done"
    workers = [subprocess.Popen([sys.executable, "-c", CONTEND, str(folder), str(go), str(done)],
                                stdout=subprocess.PIPE, text=True, cwd=root) for _ in range(4)]
    time.sleep(1.0)  # not a race: any order of arrival must give one winner; this only makes arrivals close
    go.write_text("")
    outcomes = [worker.stdout.readline().strip() for worker in workers]  # every one answered; the winner lives
    done.write_text("")
    for worker in workers:
        worker.wait(timeout=120)
    assert sorted(outcomes) == ["False", "False", "False", "True"]


def test_orch_train_on_a_checkpoint_folder_in_use_exits_2_and_writes_nothing(train_overrides, micro_folder,
                                                                             tmp_path) -> None:
    """(`micro_folder`: the session's model preset is built before, as it is when the whole suite runs, so that its
    first build's progress lines are not taken for the command's output when this test runs alone.)"""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    holder = hold(folder)
    try:
        result = CliRunner().invoke(app, ["train", *train_overrides, "trainer.total_steps=1"])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "trainer.checkpoint_dir" in lines[0] and f"in use by PID {holder.pid} on" in lines[0]
    assert sorted(path.name for path in folder.iterdir()) == sorted([LEASE_FILE, "held"])  # no step, no rollout
