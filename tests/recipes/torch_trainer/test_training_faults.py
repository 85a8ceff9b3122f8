"""Faults in a real torch training run (micro model, CPU): a full disk while checkpointing fails the run with
the last good checkpoint intact, and the resume that follows replays the steps logged after it, counts them in
the `resume/replayed_steps` metric and loses no step; on a real full file system (a small tmpfs) the run fails with
one line and leaves no half-written checkpoint."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from orchlib.errors import OrchError
from recipes.config.schema import compose_train_config
from recipes.run.training import run_training
from recipes.runtime.checkpoint import latest_checkpoint, load_checkpoint
from recipes.torch_trainer.state import REPLAYED_METRIC


def test_a_full_disk_while_checkpointing_then_a_resume_replays_and_counts_the_lost_steps(
        train_overrides, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "trainer.total_steps=5",
                 "trainer.save_every=2", "trainer.val_every=0"]
    real_save = torch.save

    def disk_full_at_step_4(state, path, *args, **kwargs):  # injected: torch.save writes part, then ENOSPC
        if isinstance(state, dict) and state.get("step") == 4:
            Path(path).write_bytes(b"\0" * 64)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(state, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full_at_step_4)
    with pytest.raises(OSError, match="No space left on device"):
        run_training(compose_train_config(overrides))
    monkeypatch.setattr(torch, "save", real_save)
    latest = latest_checkpoint(tmp_path / "checkpoints")
    assert latest.name == "step_000002"  # the half-written checkpoint of step 4 is never pointed at
    run_id = load_checkpoint(latest)["mlflow_run_id"]
    mlflow = MlflowClient(next(o.split("=", 1)[1] for o in overrides if o.startswith("mlflow.tracking_uri=")))
    assert mlflow.get_run(run_id).info.status == "FAILED"
    resumed = run_training(compose_train_config(overrides))
    assert (resumed.status, resumed.steps_done, resumed.mlflow_run_id) == ("finished", 5, run_id)
    replayed = [(m.step, m.value) for m in mlflow.get_metric_history(resumed.mlflow_run_id, REPLAYED_METRIC)]
    assert replayed == [(2, 2.0)]  # steps 3 and 4 were logged, then lost with their checkpoint, and run again
    steps = sorted({m.step for m in mlflow.get_metric_history(resumed.mlflow_run_id, "actor/pg_loss")})
    assert steps == [1, 2, 3, 4, 5]  # no step lost
    assert mlflow.get_run(resumed.mlflow_run_id).data.tags["orch.replayed_steps"] == "3-4"


@contextlib.contextmanager
def tmpfs(folder: Path, size: int):
    """A real, small file system at `folder` (root only; skipped where mounting is not allowed)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _train(overrides: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", *overrides], capture_output=True,
                          text=True, timeout=900, env=os.environ.copy())


def test_a_real_full_disk_fails_the_run_with_one_line_and_the_resume_finishes_it(train_overrides,
                                                                                tmp_path: Path) -> None:
    """A tmpfs 1.5 times one checkpoint: the checkpoint of step 2 fits, the one of step 4 (written beside it)
    does not. torch reports that as a C++ stream error; orch says "disk full" in one line, exits 1, removes its
    scratch folder and keeps step 2 as the latest. Once there is room the resume finishes the run, removing the
    scratch folder a writer killed mid-checkpoint left."""
    base = [o for o in train_overrides if not o.startswith("trainer.checkpoint_dir=")]
    base += ["algorithm=grpo", "task=countdown", "filter=none", "trainer.save_every=2", "trainer.val_every=0",
             "trainer.dump_every=0"]
    sizing = _train([*base, "trainer.total_steps=2", f"trainer.checkpoint_dir={tmp_path / 'sizing'}"])
    assert sizing.returncode == 0, sizing.stderr[-2000:]
    one = sum(path.stat().st_size for path in (tmp_path / "sizing" / "step_000002").rglob("*"))
    with tmpfs(tmp_path / "small", int(one * 1.5) + 64 * 1024) as folder:
        overrides = [*base, "trainer.total_steps=4", f"trainer.checkpoint_dir={folder}"]
        full = _train(overrides)
        assert full.returncode == 1, full.stderr[-3000:]
        assert "Traceback" not in full.stderr, full.stderr[-3000:]
        last = full.stderr.strip().splitlines()[-1]
        assert last.startswith("orch: error: disk full: No space left on device while writing the checkpoint of "
                               "step 4 (the checkpoint step_000002 stays the latest)"), last
        assert sorted(path.name for path in folder.iterdir() if path.name.startswith(".step")) == []
        assert latest_checkpoint(folder).name == "step_000002"
        (folder / ".step_000003.tmp-4242").mkdir()  # what a writer killed mid-checkpoint leaves
        subprocess.run(["mount", "-o", f"remount,size={one * 4}", str(folder)], check=True)
        resumed = _train(overrides)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert latest_checkpoint(folder).name == "step_000004"
        assert not (folder / ".step_000003.tmp-4242").exists()


def test_a_cell_that_ran_out_of_disk_has_the_one_line_as_its_reason() -> None:
    """`orch status` shows a cell's reason: for a full disk, the line `orch train` prints, not a traceback."""
    from orchestrator.job import _failure_reason

    err = OSError(errno.ENOSPC, "No space left on device while writing the checkpoint of step 4", "/ckpt")
    assert _failure_reason(err) == ("disk full: No space left on device while writing the checkpoint of step 4: "
                                    "/ckpt; free some space, then resume")
    assert _failure_reason(OSError(errno.EIO, "I/O error")).endswith("OSError: [Errno 5] I/O error")  # as before


def test_a_checkpoint_folder_without_room_for_one_checkpoint_is_refused_before_any_work(train_overrides,
                                                                                       tmp_path: Path) -> None:
    """Issue 26 item 1: a file system with less room than one checkpoint refuses the run at once, one line naming
    the key, before the lease, the MLflow run or any folder is written."""
    from recipes.policy.models import base_model_folder, count_parameters_in
    from recipes.runtime.checkpoint import checkpoint_bytes

    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "trainer.total_steps=1",
                 "trainer.val_every=0"]
    need = checkpoint_bytes(count_parameters_in(base_model_folder(compose_train_config(overrides).model)), False)
    with tmpfs(tmp_path / "tiny", need // 2) as folder:
        cfg = compose_train_config([*overrides, f"trainer.checkpoint_dir={folder / 'run'}"])
        with pytest.raises(OrchError, match=r"config key trainer.checkpoint_dir .*MiB free on its file system, but "
                                            r"one checkpoint needs about"):
            run_training(cfg)
        assert list(folder.iterdir()) == []


def test_a_database_that_finds_its_disk_full_is_one_line_in_every_command(tmp_path, monkeypatch) -> None:
    """A store or MLflow database whose disk fills while a command runs (`orch sweep --wait` reconciling, here
    SQLAlchemy's real error from SQLite on a full tmpfs): one line, exit 1, no traceback (it was a 40-line
    traceback from `orch resume --wait` when this machine's disk filled under a long sweep)."""
    import sqlalchemy
    from typer.testing import CliRunner

    import orchestrator.sweep_cli
    from orchestrator.cli import app
    from orchlib.errors import fault_line

    with tmpfs(tmp_path / "small", 256 * 1024) as folder:
        engine = sqlalchemy.create_engine(f"sqlite:///{folder / 'store.db'}")
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("CREATE TABLE t (x TEXT)"))
        with contextlib.suppress(OSError), open(folder / "fill", "wb") as fill:  # the rest of the disk
            while True:
                fill.write(b"\0" * 65536)
                fill.flush()
        with pytest.raises(sqlalchemy.exc.OperationalError) as caught, engine.begin() as connection:
            for _ in range(1000):
                connection.execute(sqlalchemy.text("INSERT INTO t VALUES (:x)"), {"x": "x" * 4096})
        engine.dispose()
    full = caught.value
    assert fault_line(full) == ("disk full: a database could not be written (database or disk is full); free some "
                                "space, then resume")
    wrapped = RuntimeError("reconcile failed")
    wrapped.__cause__ = full
    assert fault_line(wrapped) == fault_line(full)  # found down the chain
    assert fault_line(RuntimeError("something else")) is None

    def fails(*args, **kwargs):
        raise full

    monkeypatch.setattr(orchestrator.sweep_cli, "_open_store", fails)
    done = CliRunner().invoke(app, ["status", "any"])
    assert done.exit_code == 1 and done.output.strip() == f"orch: error: {fault_line(full)}", done.output
