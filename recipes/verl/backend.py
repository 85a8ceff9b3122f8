"""The `verl` trainer backend: veRL's own PPO trainer (Ray, FSDP2 workers, vLLM or HF rollouts) driving orch's
environments, with SNR-Aware Filtering, the MI diagnostics and orch's metrics plugged in (recipes.verl.trainer).

`run(cfg, should_stop)`, in the job's process:

    1 the cell's MLflow run (attached, or the checkpoint's, or new): params, tags, both configs as artifacts
    2 the model: the Hugging Face folder `model.path`, or the preset (warm-started when enabled, as the torch
      backend: the same cached folder), and its tokenizer in a folder of its own
    3 the prompts (recipes.verl.data) and veRL's config (recipes.verl.config_map)
    4 a Ray cluster of its own (recipes.verl.cluster: local, or the nodes of a multi-node SLURM cell)
    5 the TaskRunner (recipes.verl.task_runner) trains; `should_stop` (SIGUSR2/SIGTERM in a job) becomes a stop file
      the trainer reads at every step boundary: it checkpoints the last completed step and ends (`preempted`)

Checkpoints are veRL's own, in `<checkpoint_dir>/verl` (`trainer.checkpoint_dir`); a run started again with the
same folder resumes after its last checkpoint, into the same MLflow run.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchlib.background import every
from orchlib.errors import OrchError
from recipes.config.schema import TrainConfig
from recipes.run.tracking import RunTracker, default_tracking_uri, tracked_run
from recipes.runtime.result import TrainResult
from recipes.runtime.stop import StopRequested

log = logging.getLogger("orch.verl")
RUN_FILE = "orch_run.json"  # in the checkpoint folder: the MLflow run its checkpoints belong to
STOP_FILE = "STOP"
STARTED_FILE = "LOOP_STARTED"  # written by the trainer as its loop begins (a stop before it needs no checkpoint)
POLL_S = 0.25
TRAINER_FILE = "orch_trainer.txt"  # in veRL's checkpoint folder: which veRL trainer wrote it (keep_trainer)


def run(cfg: TrainConfig, should_stop: Callable[[], bool] | None = None) -> TrainResult:
    """Train `cfg` on veRL (see the module docstring)."""
    from recipes.verl.patches import check_version

    check_version()
    if cfg.trainer.device != "cpu" and not cfg.infra.verl.gpus_per_node:
        _gpus_per_node()  # OrchError before anything is written when this job sees no GPU
    infra = cfg.infra
    checkpoint_dir = Path(infra.checkpoint_dir) if infra.checkpoint_dir else None
    run_file = checkpoint_dir / RUN_FILE if checkpoint_dir else None
    resumed = None
    if run_file and run_file.is_file() and infra.resume == "auto":
        resumed = json.loads(run_file.read_text())["mlflow_run_id"]
    asked = should_stop or (lambda: False)
    return tracked_run(infra, resumed, checkpoint_dir, lambda tracker: train(
        cfg, tracker, checkpoint_dir or Path("checkpoints") / tracker.run_id,
        lambda: asked() or tracker.store_down))


def train(cfg: TrainConfig, tracker: RunTracker, checkpoint_dir: Path,
          should_stop: Callable[[], bool]) -> TrainResult:
    """Prepare the inputs, start Ray, train in the TaskRunner, tear Ray down."""
    import time

    import ray

    from recipes.verl.cluster import ray_cluster
    from recipes.verl.task_runner import OrchTaskRunner, OrchTaskRunnerV1

    started_at = time.time()  # `trainer.time_limit` counts from here, as on the torch backend
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    (checkpoint_dir / RUN_FILE).write_text(json.dumps({"mlflow_run_id": tracker.run_id}))
    stop_file, started_file = checkpoint_dir / STOP_FILE, checkpoint_dir / STARTED_FILE
    stop_file.unlink(missing_ok=True)
    started_file.unlink(missing_ok=True)
    logged = tracker.last_logged_step("timing_s/step")
    resume = resume_step(checkpoint_dir / "verl", logged) if cfg.infra.resume == "auto" else None
    keep_trainer(checkpoint_dir / "verl", cfg.infra.verl.trainer, resume)

    def preempted(reason: str) -> TrainResult:  # stopped before veRL's loop began: the checkpoint it resumed from
        return TrainResult(status="preempted", steps_done=resume or 0, mlflow_run_id=tracker.run_id, reason=reason)

    try:
        job, plan, figures = prepare(cfg, checkpoint_dir, resume, should_stop)
    except StopRequested as stop:  # in the warm start: its completed epochs are kept, the next attempt resumes them
        return preempted(f"{stop}; its completed epochs are kept")
    config = build_config(cfg, job, {"run_id": tracker.run_id, "stop_file": str(stop_file),
                                     "started_file": str(started_file),
                                     "tracking_uri": default_tracking_uri(cfg.infra.mlflow.tracking_uri),
                                     "logged_until": logged or 0, "started_at": started_at})
    if resume is not None and logged is not None and logged > resume:
        log.warning("steps %d..%d were logged after the last checkpoint: they are re-run, not logged again",
                    resume + 1, logged)
        tracker.set_tags({"orch.replayed_steps": f"{resume + 1}-{logged}"})
    tracker.log_run_config(cfg, checkpoint_dir)
    # what preflight's cost model calibrates on (recipes.verl.cost.calibration): the GPUs this run's step time used
    from recipes.verl.cost import DEVICE_TAG, WORLD_TAG

    tracker.set_tags({WORLD_TAG: str(job.nnodes * job.gpus_per_node), DEVICE_TAG: cfg.trainer.device})
    tracker.log_text(_config_yaml(config), "verl_config.yaml")
    if resume is None:
        tracker.log_metrics(figures, step=0)
    if should_stop():  # asked during the set-up above: Ray need not start
        return preempted("stop requested during the set-up (nothing to keep)")
    try:
        with ray_cluster(plan, should_stop), _stop_file_when(should_stop, stop_file):
            runner = (OrchTaskRunnerV1 if cfg.infra.verl.trainer == "v1" else OrchTaskRunner).remote()
            summary = _unless_stopped_before_the_loop(runner, runner.run.remote(config), should_stop, started_file)
    except StopRequested as stop:  # while Ray started (recipes.verl.cluster): nothing of this attempt to keep
        return preempted(str(stop))
    except ray.exceptions.RayError as err:
        logged_now = tracker.last_logged_step("timing_s/step")
        saved = resume_step(checkpoint_dir / "verl", logged_now) or 0
        if should_stop():
            # SIGTERM (preemption, scancel) reaches Ray's processes too and ends them before the trainer can
            # checkpoint: the next attempt resumes from the last periodic checkpoint (trainer.save_every).
            return TrainResult(status="preempted", steps_done=saved, mlflow_run_id=tracker.run_id,
                               reason=f"stopped by a signal that also ended Ray's processes; resumes after step {saved}")
        full = disk_full_in(err)
        if full is not None:  # the trainer's checkpoint (OrchTrainerBase.writing_checkpoint): one line, exit 1
            raise full from None
        died = dead_worker(err)
        if died is None:
            raise
        kept = (f"the checkpoint of step {saved} is kept and the next attempt resumes from it" if saved else
                "no checkpoint of a logged step yet: the next attempt starts afresh")
        return TrainResult(status="failed", steps_done=saved, mlflow_run_id=tracker.run_id,
                           reason=f"{died} during step {(logged_now or 0) + 1}; {kept} (run the same command again; "
                                  "a sweep cell: orch resume --retry-failed)")
    if summary is None:
        return preempted("stop requested while veRL's workers started (nothing to keep); "
                         + (f"resumes after step {resume}" if resume else "starts afresh"))
    tracker.adopt(summary.get("pending") or [], summary.get("outage_error", ""))  # kept by tracked_run
    return TrainResult(status=summary["status"], steps_done=int(summary["steps_done"]),
                       mlflow_run_id=tracker.run_id, reason=summary["reason"])


def _chain(err: BaseException) -> list[BaseException]:
    """`err`, its causes and contexts, and the errors Ray wrapped (`RayTaskError.cause`: a task's own error)."""
    seen: list[BaseException] = []
    todo: list[Any] = [err]
    while todo:
        exc = todo.pop()
        if isinstance(exc, BaseException) and all(exc is not other for other in seen):
            seen.append(exc)
            todo += [exc.__cause__, exc.__context__, getattr(exc, "cause", None)]
    return seen


def disk_full_in(err: BaseException) -> OSError | None:
    """The full disk's `OSError` a Ray task raised (a checkpoint's write: `OrchTrainerBase.writing_checkpoint`)."""
    from orchlib.errors import DISK_FULL_ERRNOS

    return next((exc for exc in _chain(err) if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS), None)


def dead_worker(err: BaseException) -> str | None:
    """`a Ray worker died (WorkerDict, pid 123: killed by a signal or the OOM killer)` when one of the run's Ray
    processes (an actor: the FSDP workers, the rollout, TransferQueue) or its node died under the trainer, else
    None (an error of the trainer itself keeps its traceback)."""
    import re

    import ray.exceptions as rayerr

    dead = (rayerr.RayActorError, rayerr.WorkerCrashedError, rayerr.NodeDiedError, rayerr.OutOfMemoryError,
            rayerr.LocalRayletDiedError)
    chain = _chain(err)
    if any(getattr(exc, "actor_init_failed", False) or "error raised in its creation task" in str(exc)
           for exc in chain if isinstance(exc, rayerr.RayActorError)):
        return None  # an actor whose constructor raised: an error of the set-up, with its traceback, not a death
    exc = next((exc for exc in chain if isinstance(exc, dead)), None)
    if exc is None:
        return None
    text = str(exc)
    name = re.search(r"class_name: (\S+)", text)
    pid = re.search(r"\bpid: (\d+)", text)
    who = ", ".join(part for part in (name and name.group(1).rsplit(".", 1)[-1], pid and f"pid {pid.group(1)}")
                    if part)
    how = "out of memory" if isinstance(exc, rayerr.OutOfMemoryError) else (
        "its node died" if isinstance(exc, rayerr.NodeDiedError) else "killed by a signal or the OOM killer")
    return f"a Ray worker died ({who + ': ' if who else ''}{how})"


def keep_trainer(folder: Path, trainer: str, resume: int | None) -> None:
    """Issue 50 item 3: a cell resumes only on the veRL trainer that wrote its checkpoints (`verl.trainer` is
    hosting, so a changed default or a requeue with other settings must not switch it silently). The trainer is
    recorded in `folder/TRAINER_FILE` when a run starts afresh; checkpoints from before the record are legacy's."""
    record = folder / TRAINER_FILE
    if resume is None:
        folder.mkdir(parents=True, exist_ok=True)
        record.write_text(trainer)
        return
    wrote = record.read_text().strip() if record.is_file() else "legacy"
    if wrote != trainer:
        raise OrchError(f"config key verl.trainer: {trainer}, but this cell's checkpoints in {folder} were written "
                        f"by veRL's {wrote} trainer; resume it with verl.trainer={wrote} (or a new checkpoint_dir)")


def _unless_stopped_before_the_loop(runner: Any, result: Any, should_stop: Callable[[], bool],
                                    started_file: Path) -> dict[str, Any] | None:
    """The TaskRunner's summary (`ray.get(result)`); but a stop requested before the trainer's loop began
    (`started_file` not yet written: Ray's workers, the models and the rollout engine still loading, minutes on a GPU
    node) kills the runner at once and returns None: nothing of this attempt is there to keep. Once the loop runs,
    the stop file ends it at its next poll (docs/reliability.md)."""
    import ray

    while True:
        done, _ = ray.wait([result], timeout=POLL_S)
        if done:
            return ray.get(result)
        if should_stop() and not started_file.exists():
            ray.kill(runner)
            return None


def resume_step(folder: Path, logged: int | None) -> int | None:
    """The checkpoint to resume from: the newest complete one (not past veRL's `latest_checkpointed_iteration`)
    whose step was logged to MLflow, so that no step is lost (checkpointed, killed before its metrics were
    logged) nor logged twice (steps logged after it are re-run but not logged again). None: start afresh."""
    from recipes.runtime.checkpoint import VERL_ITERATION_FILE

    latest = folder / VERL_ITERATION_FILE
    if not latest.is_file() or not logged:
        return None
    newest = min(int(latest.read_text().strip()), logged)
    steps = [int(path.name.removeprefix("global_step_")) for path in folder.glob("global_step_*")
             if path.name.removeprefix("global_step_").isdigit()]
    usable = [step for step in steps if step <= newest]
    return max(usable) if usable else None


def prepare(cfg: TrainConfig, checkpoint_dir: Path, resume: int | None = None,
            should_stop: Callable[[], bool] | None = None) -> tuple[Any, Any, dict[str, float]]:
    """The model and tokenizer folders, the prompt files, the Ray cluster plan: (`VerlJob`, `ClusterPlan`, setup
    figures for step 0). A stop asked for during the warm start raises `StopRequested` (its epochs are kept, as on
    the torch backend)."""
    import time

    from recipes.policy.models import count_parameters_in, load_tokenizer
    from recipes.run.progress import ProgressFile
    from recipes.torch_trainer.warmstart import model_folder
    from recipes.verl.cluster import ClusterPlan, slurm_nodes, srun_launcher
    from recipes.verl.config_map import VerlJob, worker_env
    from recipes.verl.data import prompt_budget, write_prompt_files

    started = time.perf_counter()
    ProgressFile(checkpoint_dir, cfg.trainer.total_steps).update(
        phase="warm start" if cfg.model.warm_start.enabled else "setup")
    folder, warm_start = model_folder(cfg, should_stop)
    tokenizer = load_tokenizer(folder)
    tokenizer_folder = checkpoint_dir / "inputs" / "tokenizer"  # apart from config.json: transformers would
    tokenizer.save_pretrained(tokenizer_folder)                   # otherwise pick the model's tokenizer class
    files = write_prompt_files(cfg, checkpoint_dir / "inputs")
    hosting = cfg.infra.verl
    cpu = cfg.trainer.device == "cpu"
    nodes = slurm_nodes()[: hosting.nnodes] if hosting.nnodes else slurm_nodes()
    gpus = 1 if cpu else hosting.gpus_per_node or _gpus_per_node()
    env = worker_env(cfg)
    job = VerlJob(model_path=str(folder), tokenizer_path=str(tokenizer_folder), train_file=str(files["train"]),
                  val_file=str(files["val"]), checkpoint_dir=str(checkpoint_dir / "verl"),
                  prompt_length=prompt_budget(cfg, tokenizer), nnodes=len(nodes), gpus_per_node=gpus, env=env,
                  extra_file=str(files["extra"]) if "extra" in files else None, resume_step=resume)
    plan = ClusterPlan(nodes=nodes, gpus_per_node=gpus, logical_gpus=cpu, cpus=hosting.ray_cpus if cpu else None,
                       env=env, join_timeout_s=hosting.ray_join_timeout_s,
                       launcher=srun_launcher(len(nodes) - 1, nodes[0]) if len(nodes) > 1 else ())
    figures = {"setup/policy_parameters": float(count_parameters_in(folder)),
               "timing_s/setup": time.perf_counter() - started,
               **{f"warm_start/{k}": float(v) for k, v in warm_start.items() if isinstance(v, int | float)}}
    return job, plan, figures


def build_config(cfg: TrainConfig, job: Any, run: dict[str, Any]) -> Any:
    """veRL's config for `cfg` on `job`, with where the trainer reports (`orch.run`: the MLflow run, its tracking
    URI, the stop file, and the last step already logged)."""
    from omegaconf import OmegaConf, open_dict

    from recipes.verl.config_map import verl_config

    config = verl_config(cfg, job)
    with open_dict(config):
        config.orch.run = OmegaConf.create(run)
    return config


def describe(cfg: TrainConfig) -> str:
    """veRL's config for `cfg` as YAML, as a run would build it (`orch train backend=verl --print-config`). The
    prompt files go to a scratch folder; the model is the base folder (a warm start would be trained at run
    time); the MLflow run is a placeholder."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="orch-verl-config-") as scratch:
        cold = cfg.model_copy(update={"model": cfg.model.model_copy(update={
            "warm_start": cfg.model.warm_start.model_copy(update={"enabled": False})})})
        job, _, _ = prepare(cold, Path(scratch))
        config = build_config(cfg, job, {"run_id": "<the cell's MLflow run>", "stop_file": "<checkpoint dir>/STOP",
                                         "tracking_uri": default_tracking_uri(cfg.infra.mlflow.tracking_uri),
                                         "logged_until": 0})
        return _config_yaml(config)


def _gpus_per_node() -> int:
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = os.environ.get(name, "").split(":")[-1]
        if value.isdigit():
            return int(value)
    import torch

    if not torch.cuda.is_available():
        raise OrchError("config key trainer.device: cuda, but no GPU is visible to this job")
    return torch.cuda.device_count()


def _config_yaml(config: Any) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(config, resolve=True)


def _stop_file_when(should_stop: Callable[[], bool], stop_file: Path) -> Any:
    """Create `stop_file` once `should_stop()` turns true (polled while the trainer runs)."""

    def check() -> bool:
        if should_stop():
            stop_file.touch()
            return True
        return False

    return every(POLL_S, check, "orch-stop-watch")
