"""The job of one cell: what submitit runs on the cluster (or locally, or in-process for `debug`).

    CellJob(store_url, cell_id, executor, requeue)()
      1. read the cell from the store, report `running` (attempt: job id, host, pid, log paths)
      2. load the config planned for it (the store's `cell_configs`: no Hydra composition, whatever `conf/` holds
         now), add the per-cell hosting keys (MLflow run, checkpoint folder: `TrainConfig.with_hosting`, a
         `model_copy`), check it still hashes to the cell's identity and run the host checks; a cell of a store
         written before configs were kept composes its overrides with Hydra instead, as then
      3. run the backend with `should_stop` wired to SIGUSR2 (SLURM's warning before the time limit) and SIGTERM
         (preemption, scancel): the trainer stops its current work, checkpoints its last completed step and
         returns `preempted`
      4. report the outcome; on `preempted` ask the executor to requeue this job: the next attempt resumes from the
         checkpoint into the same MLflow run. A heartbeat thread reports liveness meanwhile.

The job reports its own state because `sacct` may not exist; `orchestrator.reconcile` handles jobs that die
without reporting. Our stop handlers are installed when the job's function starts, before step 1; a signal that
arrives earlier (while Python and submitit start) is submitit's: `CellJob` is submitit-`Checkpointable`, so SIGUSR2
requeues the same callable, while a SIGTERM is only logged and the cluster kills the job `KillWait` later: its
restart then counts as a requeue the job did not report.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit

from orchestrator.states import FROM_TRAIN_STATUS, State, TransitionError
from orchestrator.store import JobContext, Store
from orchlib.background import every
from orchlib.errors import OrchError, fault_line
from orchlib.shutdown import before_exit
from recipes.runtime.stop import StopRequest

if TYPE_CHECKING:
    from recipes.config.schema import TrainConfig

HEARTBEAT_ENV = "ORCH_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 30.0
REASON_LINES = 20
# How long a job waits for the previous writer of its cell's checkpoint folder to end (an attempt cancelled or
# preempted a moment ago still checkpoints; the cluster kills it `signal_delay_s` after the signal, 300 s at most in
# the shipped sweeps). Past it the cell fails, naming the writer.
WRITER_WAIT_S = 600.0


Requeue = Callable[[str | None], None]  # an executor's `requeue_current_job`: have this job (its id) run again


class CellJob(submitit.helpers.Checkpointable):
    """The picklable callable of one cell's job (small: the store URL, the cell id, the executor's name and its
    requeue function, pickled by reference). Executors build it; the job never looks an executor up, so the edge
    between them runs one way (orchestrator.executors -> orchestrator.job)."""

    # Class defaults too: a job pickled by an older orch, before these fields existed, still unpickles whole (with
    # no submitted attempt the store checks none, as before attempts were recorded)
    attempt_id: int | None = None
    ends_process = True

    def __init__(self, store_url: str, cell_id: int, executor: str, requeue: Requeue,
                 attempt_id: int | None = None, ends_process: bool = True) -> None:
        self.store_url = store_url
        self.cell_id = cell_id
        self.executor = executor
        self.requeue = requeue
        self.attempt_id = attempt_id  # the submission (claim) this job runs: a newer one supersedes it
        self.ends_process = ends_process  # False where the job runs inside a process that goes on (debug)

    def __call__(self) -> str:
        try:
            return run_cell(self.store_url, self.cell_id, self.executor, self.requeue, self.attempt_id)
        finally:
            if self.ends_process:  # submitit's job process only stores the result and exits now
                before_exit()


def run_cell(store_url: str, cell_id: int, executor: str, requeue: Requeue,
             submitted_attempt: int | None = None) -> str:
    """Run one cell to an outcome and report it; returns the state recorded for the cell. In a multi-node
    allocation only the first task runs the cell (the verl backend starts its Ray workers on the other nodes
    itself); the others return at once."""
    rank = _task_rank()
    if rank:
        print(f"orch: task {rank} of cell {cell_id}: the cell runs from task 0 of its allocation", file=sys.stderr)
        return "secondary task"

    # The stop handlers go in before the job reports its start: a signal between the report and the trainer (an
    # operator's `scontrol requeue` the moment the cell shows running) would otherwise reach submitit's handler,
    # which only logs a SIGTERM, and the cluster would kill the job `KillWait` later without an end report.
    with StopRequest() as stop:
        return _run_cell(store_url, cell_id, executor, requeue, submitted_attempt, stop)


def _run_cell(store_url: str, cell_id: int, executor: str, requeue: Requeue, submitted_attempt: int | None,
              stop: StopRequest) -> str:
    store = Store.open(store_url, create=False)
    context = store.job_context(cell_id)
    job_id, stdout, stderr = _job_identity()
    try:
        attempt_id = store.job_started(cell_id, executor, job_id, socket.gethostname(), os.getpid(), stdout, stderr,
                                       attempt_id=submitted_attempt)
    except TransitionError as err:  # e.g. the cluster restarted the job of a cell that has ended meanwhile
        print(f"orch: not running it: {err}", file=sys.stderr)
        return "not started"
    if attempt_id is None:
        (state,) = store.cell_states([cell_id]).values()
        if state == State.CANCELLED:
            why = "was cancelled before it started"
        elif state in (State.FAILED, State.FINISHED):
            why = f"is {state}: {_reason(store, cell_id)}"
        else:
            why = f"was submitted again since this job's submission (attempt id {submitted_attempt}); the newer job runs it"
        print(f"orch: cell {context.digest} {why}; not running it", file=sys.stderr)
        return state
    print(f"orch: cell {context.digest} of sweep {context.sweep} starts on {socket.gethostname()} "
          f"(job {job_id}, attempt id {attempt_id})", file=sys.stderr, flush=True)
    try:
        with _heartbeat(store, attempt_id, cell_checkpoint_dir(context)):
            cfg = compose_cell_config(context)
            from recipes.run.progress import setup_logging
            from recipes.run.training import run_training
            from recipes.trained.evaluate import run_evaluation

            setup_logging()  # the trainer's step lines go to the job's log (`orch logs`)

            if cfg.evaluation.source is not None:  # an evaluation cell (`orch eval --sweep`): reads a checkpoint
                result = run_evaluation(cfg, should_stop=stop)
            else:
                result = run_training(cfg, should_stop=stop, wait_s=WRITER_WAIT_S,
                                      on_wait=lambda line: print(f"orch: {line}", file=sys.stderr, flush=True))
    except BaseException as err:
        reason = _failure_reason(err)
        store.job_ended(attempt_id, State.FAILED, reason=reason, exit_code=1)
        _end_mlflow_run(context, "FAILED")
        raise
    state = FROM_TRAIN_STATUS.get(result.status, State.FAILED)
    reason = result.reason or (f"stop requested by {stop.signal_name}" if stop.signal_name else None)
    if state == State.REQUEUED and context.requeues >= context.max_requeues:
        state = State.FAILED
        reason = f"preempted or timed out {context.requeues + 1} times (cluster.max_requeues={context.max_requeues})"
    recorded = store.job_ended(attempt_id, state, reason=reason, exit_code=0, steps_done=result.steps_done,
                               mlflow_run_id=result.mlflow_run_id)
    print(f"orch: cell {context.digest} {recorded} after step {result.steps_done}"
          + (f": {reason}" if reason else ""), file=sys.stderr, flush=True)
    if recorded == State.REQUEUED:
        requeue(job_id)
    else:
        _finish_sweep_if_done(store, context)
    return recorded


def compose_cell_config(context: JobContext) -> TrainConfig:
    """The cell's training config as planned, with the per-cell hosting keys, checked for this host; `OrchError`
    (one line) if it no longer hashes to the cell's identity or no longer fits this orch's config schema (a key
    removed or renamed since it was planned; a key added since takes its default)."""
    from recipes.config.resolve import load_config, resolve_cell
    from recipes.config.schema import VERL_TRAINER_BEFORE_THE_KEY

    infra = {
        "mlflow.experiment_name": context.experiment_name,
        "trainer.checkpoint_dir": str(cell_checkpoint_dir(context)),
        "trainer.progress": False,
    }
    if context.tracking_uri:
        infra["mlflow.tracking_uri"] = context.tracking_uri
    if context.mlflow_run_id:
        infra["mlflow.run_id"] = context.mlflow_run_id
    where = f"cell {context.digest} of sweep {context.sweep}"
    replan = f"`orch resume {context.sweep} --replan` plans its settings again as a new cell"
    if context.config_json is None:  # planned before configs were stored: composed with Hydra, as then, on the
        # veRL trainer of then (`verl.trainer` came later: load_config's rule)
        hosting = {"verl.trainer": VERL_TRAINER_BEFORE_THE_KEY, **infra}
        cfg = resolve_cell(overrides=context.overrides, hosting=hosting, host=True).config
        if cfg.digest() != context.digest:
            raise OrchError(f"{where}: conf/ changed since the sweep was planned (the config now hashes to "
                            f"{cfg.digest()}); {replan}")
        return cfg
    try:
        cfg = load_config(context.config_json, context.cell_json or "{}", hosting=infra)
    except OrchError as err:
        raise OrchError(f"{where}: its planned config does not fit this orch's config schema: {err}; {replan}") from None
    if cfg.digest() != context.digest:
        raise OrchError(f"{where}: its planned config hashes to {cfg.digest()} under this orch (the identity of a "
                        f"config changed since it was planned); {replan}")
    return cfg.check_host()


def _task_rank() -> int:
    """This task's rank in its submitit job (0 outside one)."""
    try:
        return int(submitit.JobEnvironment().global_rank)
    except (RuntimeError, KeyError):
        return 0


def _job_identity() -> tuple[str | None, str | None, str | None]:
    """(job id, stdout path, stderr path) of the running submitit job, or Nones outside one."""
    try:
        environment = submitit.JobEnvironment()
        paths = environment.paths
        return str(environment.job_id), str(paths.stdout), str(paths.stderr)
    except (RuntimeError, KeyError):
        return None, None, None


def cell_checkpoint_dir(context: JobContext) -> Path:
    """Where a cell's trainer keeps its checkpoints (and its progress file)."""
    return checkpoint_dir_of(context.run_dir, context.digest)


def checkpoint_dir_of(run_dir: str, digest: str) -> Path:
    """The checkpoint folder of cell `digest` of the sweep whose folder is `run_dir`."""
    return Path(run_dir) / "checkpoints" / digest


def _heartbeat(store: Store, attempt_id: int, progress_dir: Path) -> Any:
    """Report liveness every `$ORCH_HEARTBEAT_S` seconds (default 30) from a daemon thread, with the progress the
    trainer wrote last (`recipes.run.progress`: step k of N, phase, success) when it changed."""
    from recipes.run.progress import read_progress

    sent: list[Any] = [None]

    def beat() -> None:
        progress = read_progress(progress_dir)
        try:
            store.heartbeat(attempt_id, progress if progress != sent[0] else None)
            sent[0] = progress
        except Exception as err:  # a store hiccup must not kill the training run
            print(f"orch: heartbeat failed: {err}", file=sys.stderr)

    return every(float(os.environ.get(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)), beat, "orch-heartbeat")


def _reason(store: Store, cell_id: int) -> str:
    attempts = store.attempts(cell_id)
    return (attempts[-1].reason or "") if attempts else ""


def _failure_reason(err: BaseException) -> str:
    """The error's message, or the last lines of its traceback."""
    if isinstance(err, OrchError):
        return str(err)
    line = fault_line(err)
    if line:
        return line
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__)).strip()
    return "\n".join(text.splitlines()[-REASON_LINES:])


def _finish_sweep_if_done(store: Store, context: JobContext) -> None:
    """End the sweep's parent MLflow run when this was its last active cell (best effort)."""
    from orchestrator.states import ACTIVE

    counts = store.counts(context.sweep_id)
    if context.parent_run_id and context.tracking_uri and not any(counts.get(state) for state in ACTIVE):
        try:
            from orchestrator.tracking import end_runs

            end_runs(context.tracking_uri, [context.parent_run_id], "FINISHED")
        except Exception as err:  # results are in the child runs; the parent's status is cosmetic
            print(f"orch: could not end the sweep's parent run: {err}", file=sys.stderr)


def _end_mlflow_run(context: JobContext, status: str) -> None:
    """End the cell's MLflow run after a failure outside the trainer (best effort)."""
    if not context.mlflow_run_id or not context.tracking_uri:
        return
    try:
        from orchestrator.tracking import end_runs

        end_runs(context.tracking_uri, [context.mlflow_run_id], status)
    except Exception as err:  # the store already holds the failure; MLflow is secondary here
        print(f"orch: could not end MLflow run {context.mlflow_run_id}: {err}", file=sys.stderr)
