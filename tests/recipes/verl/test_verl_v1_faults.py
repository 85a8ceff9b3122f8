"""The V1 trainer under faults (issue 60 item 6), as the torch backend's are tested in
tests/recipes/torch_trainer/test_training_faults.py: one V1 run on CPU taken through a Ray worker killed mid-step, a
full disk at a checkpoint (a real tmpfs) and an MLflow store made unwritable mid-run (`chattr +i`: root ignores mode
bits), each attempt ending with one line, its exit code and no traceback, and the next one resuming; the last
attempt finishes the run with every step logged exactly once into its one MLflow run. On the way, a store
unwritable at the start is refused with exit 2 before anything is written. Full tier: five `orch train` processes,
416 s on 2 cores at a load average of 4-8 (docs/reliability.md, "The V1 trainer under faults"); the two unit
tests at the end (the driver's reading of Ray's errors, a store refused at the start) run in CI."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis import names
from recipes.run.tracking import PENDING_FILE
from tests.recipes.torch_trainer.test_training_faults import tmpfs
from tests.recipes.verl.test_verl_training import client, history, run_orch, wait_for_step

V1 = pytest.mark.skipif(importlib.util.find_spec("transfer_queue") is None,
                        reason="veRL's V1 trainer needs TransferQueue (transferqueue==0.1.11)")

SQLITE_REFUSES = "(?:attempt to write a readonly database|unable to open database file)"  # by where the write fails
STEPS = 40  # a step takes ~0.6 s here: each fault lands with tens of steps still to run


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def _own_tracebacks(text: str) -> list[str]:
    """The driver's tracebacks (Ray's processes' lines carry a `(Name pid=N)` prefix and are Ray's to print)."""
    return [line for line in text.splitlines() if line.startswith("Traceback")]


def _immutable(on: bool, *paths: Path) -> None:
    """`chattr +i` (root ignores mode bits: an immutable file and folder are what root cannot write)."""
    done = subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make files immutable here: {done.stderr.strip()}")


def _wait_until(predicate, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "timed out: " + log.read_text()[-3000:]
        time.sleep(0.1)


def _ended(process: subprocess.Popen, log: Path, code: int) -> str:
    assert process.wait(timeout=600) == code, log.read_text()[-3000:]
    text = log.read_text()
    assert not _own_tracebacks(text), text[-4000:]
    return _last_line(text)


@V1
@pytest.mark.slow
@pytest.mark.full
def test_v1_survives_a_killed_worker_a_full_disk_and_an_unwritable_store_and_finishes_every_step_once(
        train_overrides, tmp_path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    db = store / "mlflow.db"
    base = [o for o in train_overrides if not o.startswith(("mlflow.tracking_uri=", "trainer.checkpoint_dir="))]
    with tmpfs(tmp_path / "disk", 64 * 2 ** 20) as disk:
        overrides = [*base, f"mlflow.tracking_uri=sqlite:///{db}", f"trainer.checkpoint_dir={disk / 'run'}",
                     "backend=verl", "algorithm=grpo", "task=countdown", "filter=none", f"trainer.total_steps={STEPS}",
                     "trainer.save_every=2", "trainer.val_every=0", "mlflow.outage_s=1"]
        verl, pointer = disk / "run" / "verl", disk / "run" / "verl" / "latest_checkpointed_iteration.txt"
        mlflow = client(overrides)

        # 1. a Ray worker SIGKILLed mid-step (the colocated actor/rollout/reference worker), after a checkpoint
        log = tmp_path / "1-killed-worker.log"
        first = run_orch(overrides, log)
        wait_for_step(mlflow, 2, first, log)  # veRL checkpoints a step before it is logged
        _wait_until(pointer.is_file, first, log)
        pids = subprocess.run(["pgrep", "-s", str(first.pid), "-f", "ray::WorkerDict"], capture_output=True,
                              text=True).stdout.split()
        assert pids, log.read_text()[-3000:]
        os.kill(int(pids[0]), signal.SIGKILL)
        last = _ended(first, log, 1)
        assert re.fullmatch(rf"failed: a Ray worker died \(WorkerDict, pid {pids[0]}: killed by a signal or the OOM "
                            r"killer\) during step \d+; the checkpoint of step (\d+) is kept and the next attempt "
                            r"resumes from it \(run the same command again; a sweep cell: orch resume "
                            r"--retry-failed\) \(steps done: \d+, MLflow run \w+\)", last), last
        runs = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()])
        assert len(runs) == 1 and runs[0].info.status == "FAILED"
        run_id = runs[0].info.run_id

        # 2. the disk full at a checkpoint: room for one more checkpoint, not for two
        one = sum(path.stat().st_size for path in (verl / "global_step_2").rglob("*") if path.is_file())
        subprocess.run(["mount", "-o", f"remount,size={_used(disk) + int(one * 1.6)}",
                        str(disk)], check=True)
        log = tmp_path / "2-full-disk.log"
        last = _ended(run_orch(overrides, log), log, 1)
        full = re.fullmatch(r"orch: error: disk full: No space left on device while writing the checkpoint of step "
                            rf"(\d+) \(the checkpoint global_step_(\d+) stays the latest\): {verl}; free some space, "
                            r"then resume", last)
        assert full, last
        failed, kept = int(full.group(1)), int(full.group(2))
        assert failed == kept + 2 and pointer.read_text().strip() == str(kept)
        assert not (verl / f"global_step_{failed}").exists()  # the half-written checkpoint is removed
        subprocess.run(["mount", "-o", f"remount,size={64 * 2 ** 20}", str(disk)], check=True)

        # 3a. the store unwritable at the start: refused, exit 2, nothing written
        _immutable(True, db, store)
        try:
            refused = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", *overrides],
                                     capture_output=True, text=True, timeout=600)
        finally:
            _immutable(False, db, store)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert re.fullmatch(rf"orch: error: config key mlflow.tracking_uri: sqlite:///{db} cannot be written "
                            rf"\({SQLITE_REFUSES}\); make it writable or choose another store "
                            r"\(mlflow.tracking_uri, --tracking-uri\)", _last_line(refused.stderr)), refused.stderr

        # 3b. the store unwritable mid-run: the metrics are buffered, the run stops after mlflow.outage_s (1 s)
        # at a step's end with a checkpoint and keeps the metrics beside it
        log = tmp_path / "3-unwritable-store.log"
        third = run_orch(overrides, log)
        wait_for_step(mlflow, failed + 1, third, log)
        _immutable(True, db, store)
        try:
            last = _ended(third, log, 1)
        finally:
            _immutable(False, db, store)
        assert re.fullmatch(r"failed: tracking store unreachable \(.+\): stopped after step \d+; \d+ metrics kept in "
                            rf"{disk / 'run' / PENDING_FILE} are written when the run resumes .*", last), last
        assert (disk / "run" / PENDING_FILE).is_file()

        # 4. the next attempt finishes the run: every step logged once, into the one run
        log = tmp_path / "4-resume.log"
        _ended(run_orch(overrides, log), log, 0)
        runs = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()])
        assert [run.info.run_id for run in runs] == [run_id] and runs[0].info.status == "FINISHED"
        assert [step for step, _ in history(mlflow, run_id, names.STEP_TIME)] == list(range(1, STEPS + 1))
        assert not (disk / "run" / PENDING_FILE).exists()


def _used(folder: Path) -> int:
    stats = os.statvfs(folder)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def test_the_driver_names_a_dead_ray_worker_and_finds_a_full_disk_inside_rays_errors() -> None:
    """What `recipes.verl.backend.train` reads from the error Ray raises in the driver: a dead actor wrapped in the
    TaskRunner's `RayTaskError` (as Ray builds it: an instance of both), a checkpoint's ENOSPC from the TaskRunner,
    and neither for an error of the trainer itself (which keeps its traceback)."""
    import errno

    import ray.exceptions as rayerr

    from recipes.verl.backend import dead_worker, disk_full_in

    died = rayerr.RayTaskError("run", "tb", rayerr.ActorDiedError()).as_instanceof_cause()
    assert dead_worker(died) == "a Ray worker died (killed by a signal or the OOM killer)"
    full = rayerr.RayTaskError("run", "tb", OSError(errno.ENOSPC, "No space left on device", "/c")).as_instanceof_cause()
    assert disk_full_in(full).errno == errno.ENOSPC and dead_worker(full) is None
    bug = rayerr.RayTaskError("run", "tb", ValueError("a bug")).as_instanceof_cause()
    assert dead_worker(bug) is None and disk_full_in(bug) is None
    # an actor whose constructor raised (a missing tokenizer folder, say) is the set-up's error, not a death
    init = rayerr.ActorDiedError(rayerr.RayTaskError("RewardLoopWorker.__init__", "tb", OSError("no such folder")))
    assert init.actor_init_failed and dead_worker(rayerr.RayTaskError("run", "tb", init).as_instanceof_cause()) is None


def test_a_tracking_store_that_cannot_be_written_is_refused_in_one_line_before_a_run_starts(tmp_path) -> None:
    """Any backend's first write to MLflow (`RunTracker`): an SQLite store made immutable (what root cannot write)
    is an `OrchError` naming the key and SQLite's reason (exit 2 from `orch train`), not MLflow's traceback."""
    from mlflow import MlflowClient

    from orchlib.errors import OrchError
    from recipes.run.tracking import RunTracker

    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    RunTracker(uri, "faults", run_id=None)  # the database and one run
    _immutable(True, store / "mlflow.db", store)
    try:
        with pytest.raises(OrchError) as refused:
            RunTracker(uri, "faults", run_id=None)
    finally:
        _immutable(False, store / "mlflow.db", store)
    assert re.fullmatch(rf"config key mlflow.tracking_uri: {uri} cannot be written \({SQLITE_REFUSES}\); make it "
                        r"writable or choose another store \(mlflow.tracking_uri, --tracking-uri\)",
                        str(refused.value)), str(refused.value)
    assert len(MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()])) == 1
