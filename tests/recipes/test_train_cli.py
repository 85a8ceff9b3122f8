"""`orch train`: Hydra overrides, config errors exit 2, SIGUSR2 checkpoints and exits with the requeue code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from recipes.runtime.checkpoint import REQUEUE_EXIT_CODE, latest_checkpoint
from tests.stops import signal_at_line


def test_print_config_and_bad_overrides() -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["train", "--print-config", "task=frozenlake", "filter.value=0.95"])
    assert shown.exit_code == 0 and "name: frozenlake" in shown.output and "value: 0.95" in shown.output
    bad = runner.invoke(app, ["train", "algorithm=reinforce"])
    assert bad.exit_code == 2
    assert "unknown algorithm option 'reinforce'; valid choices: dapo, dapo_dynamic, drgrpo, grpo, ppo" in bad.output
    strength = runner.invoke(app, ["train", "control.blind_from_step=3", "control.blind_strength=1.5"])
    assert strength.exit_code == 2 and len(strength.output.strip().splitlines()) == 1, strength.output
    assert "config key control.blind_strength: must be a number in [0, 1]" in strength.output


@pytest.mark.parametrize("number", [signal.SIGUSR2, signal.SIGINT])
def test_sigusr2_checkpoints_at_the_step_boundary_and_exits_75(train_overrides, tmp_path, number) -> None:
    """SIGUSR2 (SLURM's warning) and SIGINT (Ctrl-C) alike: a checkpoint at the step boundary, exit 75."""
    overrides = [o for o in train_overrides if not o.startswith("trainer=")]
    command = [sys.executable, "-m", "orchestrator.cli", "train", "trainer=test", *overrides, "algorithm=grpo",
               "task=countdown", "filter=none", "trainer.total_steps=500", "trainer.val_every=0",
               "trainer.save_every=0", "trainer.dump_every=0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    deadline = time.monotonic() + 300
    for line in process.stderr:
        if "step 1/500" in line:
            process.send_signal(number)
            break
        assert time.monotonic() < deadline, "the run did not reach step 1"
    rest = process.stderr.read()
    assert process.wait(timeout=300) == REQUEUE_EXIT_CODE, rest[-2000:]
    assert f"received {signal.Signals(number).name}" in rest and "Traceback" not in rest, rest[-2000:]
    checkpoint = latest_checkpoint(tmp_path / "checkpoints")
    assert checkpoint is not None and int(checkpoint.name.split("_")[1]) < 500


def test_a_second_ctrl_c_stops_at_once_with_one_line(train_overrides, monkeypatch) -> None:
    """The first SIGINT asks for a checkpointed stop; the second raises KeyboardInterrupt at once, which `orch
    train` turns into one line and exit 130. The handler is called directly: a real signal sent to this process
    may land in another of its threads and reach the handler a few bytecodes later (a race), and two sent at once
    may merge into one. The real first Ctrl-C is the subprocess test above."""
    import recipes.run.training
    from recipes.runtime.stop import StopRequest

    before = signal.getsignal(signal.SIGINT)
    with StopRequest() as stop:
        handler = signal.getsignal(signal.SIGINT)
        assert handler == stop._handle  # installed for SIGINT, as for SIGUSR2 and SIGTERM
        handler(signal.SIGINT, None)
        assert stop() and stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
    assert signal.getsignal(signal.SIGINT) == before  # restored on exit

    def interrupted(cfg, should_stop=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipes.run.training, "run_training", interrupted)
    result = CliRunner().invoke(app, ["train", *train_overrides])
    assert result.exit_code == 130, result.output
    assert result.output.strip().splitlines() == [
        "orch: interrupted (Ctrl-C twice): stopped at once, without a checkpoint of this step; the run resumes from "
        "its last checkpoint"]


def test_searchqa_trains_end_to_end(train_overrides) -> None:
    """`orch train task=searchqa trainer=test`: two steps of the micro model on the multi-turn search task."""
    from mlflow import MlflowClient

    result = CliRunner().invoke(app, ["train", *train_overrides, "task=searchqa", "algorithm=grpo", "filter=none"])
    assert result.exit_code == 0, result.output
    assert "finished" in result.output and "steps done: 2" in result.output
    run_id = result.output.rsplit("MLflow run ", 1)[1].split(")")[0]
    uri = next(o.split("=", 1)[1] for o in train_overrides if o.startswith("mlflow.tracking_uri="))
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.tags["task"] == "searchqa" and "val/success_rate" in run.data.metrics


def test_resuming_a_checkpoint_of_another_model_exits_2_with_one_line(train_overrides) -> None:
    """A checkpoint folder reused by a run of another model: one line naming the key, and the first run's MLflow
    run is left as it was (it was a traceback of size mismatches, and the old run marked FAILED)."""
    from mlflow import MlflowClient

    runner = CliRunner()
    first = runner.invoke(app, ["train", *train_overrides, "trainer.total_steps=1", "trainer.val_every=0"])
    assert first.exit_code == 0, first.output
    uri = next(o.split("=", 1)[1] for o in train_overrides if o.startswith("mlflow.tracking_uri="))
    (before,) = MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()], order_by=["attributes.start_time DESC"],
        max_results=1)
    bigger = runner.invoke(app, ["train", *train_overrides, "model.preset.hidden_size=64", "trainer.val_every=0"])
    lines = [line for line in bigger.output.splitlines() if line.startswith("orch:")]  # not the cache's progress
    assert bigger.exit_code == 2 and len(lines) == 1, bigger.output
    assert "config key trainer.checkpoint_dir" in lines[0] and "model.preset.hidden_size=32, this run has 64" in \
        lines[0], lines[0]
    assert MlflowClient(uri).get_run(before.info.run_id).info.status == "FINISHED"


def test_a_run_with_a_time_limit_checkpoints_and_stops_before_it(train_overrides, tmp_path) -> None:
    """`trainer.time_limit` (issue 26 item 2, NeMo-RL's idea): before a step that would overrun the limit (the
    longest step so far x 1.5 plus a checkpoint), the run checkpoints and stops as on a stop signal."""
    import re

    from recipes.config.schema import compose_train_config
    from recipes.run.training import run_training

    cfg = compose_train_config([*train_overrides, "algorithm=grpo", "task=countdown", "filter=none",
                                "trainer.total_steps=100000", "trainer.val_every=0", "trainer.save_every=0",
                                "trainer.dump_every=0", "trainer.time_limit=15"])
    result = run_training(cfg)
    assert result.status == "preempted" and result.reason.startswith("time limit: "), result.reason
    left = float(re.match(r"time limit: (-?\d+) s of trainer.time_limit=15 left", result.reason).group(1))
    # It stopped by the estimate, with time to spare (about 5 s here); the bound allows a step that stalls well past
    # 1.5x the longest one so far on a loaded machine, which no estimate can foresee.
    assert left >= -10, result.reason
    assert 1 <= result.steps_done < 100000
    assert latest_checkpoint(tmp_path / "checkpoints").name == f"step_{result.steps_done:06d}"


def test_a_stop_in_the_warm_start_ends_within_seconds_and_the_next_run_resumes_its_epochs(train_overrides,
                                                                                         tmp_path) -> None:
    """Issue 26 item 2: SIGTERM while the warm start trains ends the run within seconds (it is read between
    optimiser steps), exit 75, the completed epochs kept; the next run resumes the warm start after them."""
    overrides = [o for o in train_overrides if not o.startswith(("trainer=", "model.warm_start."))]
    cache = tmp_path / "own-cache"  # this test's own warm start, never a cached one
    command = [sys.executable, "-m", "orchestrator.cli", "train", "trainer=test", *overrides, "task=countdown",
               "algorithm=grpo", "filter=none", "model.warm_start.enabled=true", "model.warm_start.demos=256",
               "model.warm_start.epochs=6", "model.warm_start.eval_episodes=2", "model.warm_start.batch_size=2",
               "model.warm_start.max_response_tokens=16", f"model.cache_dir={cache}", "trainer.total_steps=1",
               "trainer.val_every=0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    signalled = signal_at_line(process, "warm start countdown epoch 1:")
    rest = process.stderr.read()
    assert process.wait(timeout=300) == REQUEUE_EXIT_CODE, rest[-2000:]
    assert time.monotonic() - signalled < 30, "the stop took longer than 30 s"  # measured: a few seconds
    assert "received SIGTERM" in rest and "Traceback" not in rest, rest[-2000:]
    kept = list(cache.glob("warm-start/*.partial/epoch.pt"))
    assert len(kept) == 1
    again = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(), timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "warm start countdown: resumes after epoch" in again.stderr
    assert not list(cache.glob("warm-start/*.partial"))  # gone once the warm start is complete
