"""What orch adds to both of veRL's trainers, once: `OrchTrainerBase`, the mixin `recipes.verl.trainer.OrchPPOTrainer`
(the legacy `RayPPOTrainer`) and `recipes.verl.v1.OrchV1Trainer` (V1's `PPOTrainerSync`) inherit before veRL's class.

    state            orch's fields beside veRL's (`__init__`): the run's config, MLflow run, hooks, time limit, empty
                     steps, latest validation, best checkpoint, the step's metrics and tags, the pending stop
    the loop         `run_fit`: veRL's loop with the progress file, ended by a `Stop` into a summary of how it ended
    the step         `filtered_step`: orch's step on a rollout (statistics, hooks, the filter, the rollout table, the
                     empty step); `scaled_advantages`, `turn_scores`: the two numbers both paths put into veRL's batch
    stops            `stop_at_step_end` (the stop file, the time limit, a decided stop checkpoint the step),
                     `_stop_inside_step` (a stop before the update drops the step, rewound to `resume_point`)
    checkpoints      orch's state file beside veRL's checkpoint (`write_state`, `restore_state`), the best checkpoint
                     (`keep_if_best`: `keep_best`, `kept_best`), a full disk while one is written (`writing_checkpoint`)
    cross-scoring    `cross_score`: the MI diagnostics' scores through the actor workers
    metrics          `log_step`: what one veRL log call puts into the cell's MLflow run (`logged_metrics`), names made
                     MLflow-safe (`metric_name`), values made floats (`scalar`)

Each trainer keeps only what its veRL class asks differently (where the step's hand-over sits, how a validation is
seen, how the batch shrinks), so retiring the legacy trainer is deleting recipes/verl/trainer.py and its tests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recipes.run.progress import ProgressFile, report, reporting
from recipes.run.tracking import PEAK_MEMORY_METRIC
from recipes.runtime.checkpoint import VERL_ITERATION_FILE as ITERATION_FILE
from recipes.runtime.checkpoint import VERL_STATE_FILE as STATE_FILE
from recipes.runtime.time_limit import TimeLimit
from recipes.verl.agent_loop import train_config

log = logging.getLogger("orch.verl")
SCORE_ROWS = 256  # (prompt, sample) pairs per actor-worker call when cross-scoring naively
BEST_RECORD = "best.json"


class Stop(Exception):  # noqa: N818  (a control-flow signal, not an error)
    """Ends `fit` at a step boundary: `status` preempted (a stop was requested) or stopped (the run decided)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class OrchTrainerBase:
    """orch's state and rules on a veRL trainer (the module docstring); listed before veRL's class in the bases.

    `orch` (a mapping): run_id and tracking_uri of the cell's MLflow run, stop_file (its existence requests a stop),
    started_file (written as the loop begins), logged_until (the last step already in MLflow: steps re-run after a
    resume are not logged again), started_at (the driver's start, wall-clock seconds: `trainer.time_limit` counts
    from it).
    """

    TRAINER = ""  # `verl.trainer` ("legacy", "v1"), written into orch's state file

    def __init__(self, *args: Any, orch: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # veRL's trainer
        from recipes.diagnostics.registry import build_hooks
        from recipes.run.tracking import RunTracker

        self.cfg = train_config(self.config)
        self.orch = orch
        # `trainer.time_limit`, counted from the driver's start (before the warm start and Ray's start-up)
        self.time_limit = TimeLimit(self.cfg.infra.time_limit, time.time() - orch.get("started_at", time.time()))
        self.tracker = RunTracker(orch["tracking_uri"], self.cfg.infra.mlflow.experiment_name, run_id=orch["run_id"],
                                  outage_s=self.cfg.infra.mlflow.outage_s)
        self.hooks = build_hooks(self.cfg.hooks, self.cfg)
        self.empty_steps = 0
        self.validation: dict[str, float] = {}
        self.best: dict[str, float] = {}  # {"step", "success"} of the checkpoint kept in <checkpoint_dir>/best
        self.step_metrics: dict[str, float] = {}  # orch's metrics of the step, logged over veRL's of the same name
        self.step_tags: dict[str, str] = {}
        self.pending_stop: Stop | None = None
        self.step_end: dict[str, Any] = {}  # the state at the end of the last step (`resume_point`)
        self.loader_state: Any = None  # the dataloader state a rewound checkpoint saves instead of the current one
        self.skip_update = False
        self.advantage_scale = 1.0
        self._step_started = 0.0
        self.validation_pending = False  # a stop cut this step's validation short: the resume runs it first

    # -- the loop ------------------------------------------------------------------------------------------------

    def run_fit(self, loop: Callable[[], Any]) -> dict[str, Any]:
        """veRL's loop (`loop`) with the progress file; returns how the run ended."""
        folder = Path(self.config.trainer.default_local_dir).parent  # orch's checkpoint folder (veRL's is verl/)
        if self.orch.get("started_file"):  # from here a stop is read by the loop (before it, the driver ends Ray)
            Path(self.orch["started_file"]).touch()
        try:
            with reporting(ProgressFile(folder, self.cfg.trainer.total_steps)):
                loop()
        except Stop as stop:
            return {"status": stop.status, "reason": stop.reason, "steps_done": int(self.global_steps),
                    **self.unwritten_metrics()}
        return {"status": "finished", "reason": f"completed {self.cfg.trainer.total_steps} steps",
                "steps_done": int(self.global_steps) - 1,  # fit counts one past its last step
                **self.unwritten_metrics()}

    def unwritten_metrics(self) -> dict[str, Any]:
        """The metrics this trainer's tracker still holds because the tracking store could not be written (a
        read-only or locked database, a server gone), tried once more: `{"pending": rows, "outage_error": why}` for
        the driver, whose tracker keeps them beside the checkpoint (`RunTracker.adopt`, then `tracked_run`), or {}."""
        if self.tracker.flush():
            return {}
        return {"pending": [[m.key, m.value, m.timestamp, m.step] for m in self.tracker.pending],
                "outage_error": self.tracker.outage_error}

    # -- stops ---------------------------------------------------------------------------------------------------

    def stop_at_step_end(self) -> bool:
        """At a step's end: a stop requested (the stop file) or a step that would end past `trainer.time_limit` (as
        the torch trainer reads it) becomes the pending stop, and a pending stop checkpoints the step if veRL did not.
        Whether it saved the checkpoint."""
        from recipes.step.phases import boundary_stop

        step = int(self.global_steps)
        # the stop file, or a tracking store unwritable for `mlflow.outage_s` (the driver then fails the run with
        # the metrics kept beside the checkpoint, as on the torch backend: `tracked_run`)
        requested = self.pending_stop is None and (Path(self.orch["stop_file"]).exists() or self.tracker.store_down)
        self.time_limit.took(time.perf_counter() - self._step_started)
        if self.pending_stop is None:  # a requested stop before the time limit (the torch loop asks the clock first)
            reason = boundary_stop(step, requested, None if requested else self.time_limit.would_overrun())
            if reason:
                self.pending_stop = Stop("preempted", reason)
        if self.pending_stop is not None and self._checkpointed_step() != step:
            self._save_checkpoint()
            return True
        return False

    def resume_point(self) -> dict[str, Any]:
        """What a step dropped by a stop rewinds to: the step count, the dataloader's position and orch's state
        (empty steps, latest validation, hook states) as they are now, between steps."""
        import copy

        return {"step": int(self.global_steps), "loader": self.train_dataloader.state_dict(),
                "empty_steps": self.empty_steps, "validation": dict(self.validation),
                "hooks": {name: copy.deepcopy(hook.state_dict()) for name, hook in self.hooks.items()}}

    def _stop_inside_step(self, phase: str) -> None:
        """A stop requested (the stop file) inside a step, before its update: the step is dropped. orch's state is
        rewound to the previous step's end (`step_end`), that step is checkpointed if it was not (with the
        dataloader's position of then, so that the resumed run draws the dropped step's prompts again), and the
        run ends `preempted` at it (`Stop`). Nothing of the dropped step is logged."""
        if not Path(self.orch["stop_file"]).exists():
            return
        step, point = int(self.global_steps), self.step_end
        self.empty_steps, self.validation = point["empty_steps"], dict(point["validation"])
        for name, hook in self.hooks.items():
            hook.load_state_dict(point["hooks"][name])
        self.global_steps = point["step"]
        if point["step"] > 0 and self._checkpointed_step() != point["step"]:
            self.loader_state = point["loader"]
            self._save_checkpoint()
        where = f"checkpoint at step {point['step']}" if point["step"] > 0 else "no step done, nothing to checkpoint"
        raise Stop("preempted", f"stop requested during the {phase} of step {step}; {where}")

    # -- checkpoints: orch's state file, the best checkpoint -----------------------------------------------------

    def _checkpointed_step(self) -> int | None:
        tracker = Path(self.config.trainer.default_local_dir) / ITERATION_FILE
        return int(tracker.read_text().strip()) if tracker.is_file() else None

    @contextlib.contextmanager
    def writing_checkpoint(self) -> Iterator[None]:
        """Around veRL's checkpoint of the current step (both trainers' `_save_checkpoint`): a write that ran out of
        disk (ENOSPC from a worker, or torch's C++ stream error with under 16 MiB left, judged as the torch backend's
        `save_checkpoint` does) removes the step's half-written folder, keeps veRL's pointer at the previous
        checkpoint, and raises one `OSError(ENOSPC)` naming the step and the checkpoint that stays the latest (the
        driver prints it as one line: `recipes.verl.backend.train`)."""
        from ray.exceptions import RayError

        from recipes.runtime.checkpoint import _disk_full

        root = Path(self.config.trainer.default_local_dir)
        previous, step = self._checkpointed_step(), int(self.global_steps)
        try:
            yield
        except (OSError, RuntimeError, RayError) as err:
            cause = getattr(err, "cause", None)  # a worker's error, as Ray hands it over
            if not (_disk_full(err, root) or (isinstance(cause, BaseException) and _disk_full(cause, root))):
                raise
            if previous != step:  # the step's own folder is half-written: free its space
                shutil.rmtree(root / f"global_step_{step}", ignore_errors=True)
            pointer = root / ITERATION_FILE
            if previous is not None and (not pointer.is_file() or pointer.read_text().strip() != str(previous)):
                with contextlib.suppress(OSError):  # truncated by a failed write: point it back
                    pointer.write_text(str(previous))
            kept = f"the checkpoint global_step_{previous} stays the latest" if previous else "no earlier checkpoint"
            raise OSError(errno.ENOSPC, f"No space left on device while writing the checkpoint of step {step} "
                                        f"({kept})", str(root)) from None

    def write_state(self, folder: Path) -> None:
        """orch's own state beside veRL's checkpoint of a step (empty steps, latest validation, hook states, and
        whether a stop cut the step's validation short); both trainers write it (V1: `OrchCheckpointCallback`)."""
        state = {"empty_steps": self.empty_steps, "validation": self.validation, "mlflow_run_id": self.tracker.run_id,
                 "hooks": {name: hook.state_dict() for name, hook in self.hooks.items()},
                 "validation_pending": self.validation_pending, "trainer": self.TRAINER}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / STATE_FILE).write_text(json.dumps(state, default=_jsonable))

    def restore_state(self) -> None:
        """orch's state of the checkpoint veRL resumed at (`global_steps`), and the best checkpoint kept; both
        trainers call it once veRL has loaded its own (V1: `OrchV1Trainer.on_init_end`)."""
        if self.global_steps:
            state_file = Path(self.config.trainer.default_local_dir) / f"global_step_{int(self.global_steps)}" / STATE_FILE
            if state_file.is_file():
                state = json.loads(state_file.read_text())
                self.empty_steps, self.validation = state["empty_steps"], state["validation"]
                for name, hook in self.hooks.items():
                    hook.load_state_dict(state["hooks"].get(name, {}))
                if state.get("validation_pending"):  # veRL's validation before training runs it, at this step
                    from omegaconf import open_dict

                    self.validation_pending = True
                    with open_dict(self.config):
                        self.config.trainer.val_before_train = True
        self.best = kept_best(self.best_dir)

    @property
    def best_dir(self) -> Path:
        from recipes.runtime.checkpoint import BEST_DIR

        return Path(self.config.trainer.default_local_dir).parent / BEST_DIR

    def keep_if_best(self) -> None:
        """After a validation at step N >= 1: if its success beats every earlier one of the run, keep the actor's
        checkpoint of step N in `<checkpoint_dir>/best` (`keep_best`; the step's regular checkpoint is saved first if
        it had none), where `orch eval --best` and `orch export` find it, tagged as on the torch backend: the paper
        reports each run's peak validation success."""
        from recipes.stats.rollout_stats import VAL_SUCCESS

        step, success = int(self.global_steps), self.validation.get(VAL_SUCCESS)
        if step < 1 or success is None or success <= self.best.get("success", -math.inf):
            return
        saved = Path(self.config.trainer.default_local_dir) / f"global_step_{step}"
        if not (saved / "actor").is_dir():
            self._save_checkpoint()
        self.best = {"step": step, "success": float(success)}
        keep_best(saved, self.best_dir, self.best)
        self.tracker.set_tags({"orch.best_step": str(step), "orch.best_success": f"{success:.6g}"})

    # -- cross-scoring through the actor workers (the MI diagnostics) --------------------------------------------

    def cross_score(self, prompts: list[list[int]], samples: list[list[int]]) -> Any:
        """`recipes.stats.cross_scoring.CrossScores` of every sample under every prompt column, teacher-forced under the
        current policy in the actor workers. `diagnostics.method=prefix` (the default): the workers'
        `orch_cross_score` (recipes.verl.workers), each prompt encoded once and the samples scored on its cache, the
        distinct prompts split in blocks over the actor's ranks. `naive`: the reference N x M method through the fit
        loop's own old-log-prob path (`score_pairs`, the legacy trainer's), each (prompt, sample) pair of distinct
        token sequences one row. Either way identical prompts or samples are scored once and their columns or rows
        copied."""
        from recipes.stats.cross_scoring import CrossScores, distinct_rows

        distinct_prompts, prompt_of = distinct_rows(prompts)
        distinct_samples, sample_of = distinct_rows(samples)
        if self.cfg.diagnostics.method == "prefix":
            order = sorted(range(len(distinct_prompts)), key=lambda j: distinct_prompts[j])  # neighbours share prefixes
            pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            blocks = self.actor_rollout_wg.orch_cross_score([distinct_prompts[j] for j in order], distinct_samples,
                                                            self.cfg.diagnostics.batch_size, pad_id,
                                                            self.orch.get("stop_file"))
            if any(block is None for block in blocks):  # the ranks stopped together: the stop file appeared
                self._stop_inside_step("diagnostics")
            L_sum = np.empty((len(distinct_samples), len(distinct_prompts)))
            L_sum[:, order] = np.concatenate([block for block, _ in blocks], axis=1)
            tokens = sum(fed for _, fed in blocks)
        else:  # naive: every (prompt, sample) pair one row of the log-prob path (stop checks between its blocks)
            pairs = [(prompt, sample) for sample in distinct_samples for prompt in distinct_prompts]
            sums: list[float] = []
            for start in range(0, len(pairs), SCORE_ROWS):
                self._stop_inside_step("diagnostics")
                sums += [float(np.sum(values)) for values in self.score_pairs(pairs[start:start + SCORE_ROWS])]
            L_sum = np.array(sums, dtype=np.float64).reshape(len(distinct_samples), len(distinct_prompts))
            tokens = sum(len(prompt) + len(sample) for prompt, sample in pairs)
        L_sum = L_sum[sample_of][:, prompt_of]
        lengths = np.array([len(sample) for sample in samples], dtype=np.float64)[:, None]
        return CrossScores(L=L_sum / lengths, L_sum=L_sum, tokens_processed=tokens)

    # -- metrics -------------------------------------------------------------------------------------------------

    def logged_metrics(self, metrics: dict[str, float], in_step: bool) -> dict[str, float]:
        """What both trainers log for one veRL log call: a step's log gets orch's step metrics (over veRL's of the
        same name), the step's wall time and the largest actor worker's peak memory (Table 5's memory column; veRL's
        loops do not log it); names made MLflow-safe, values not finite dropped."""
        if in_step:
            metrics.update(self.step_metrics)
            metrics["timing_s/step"] = time.perf_counter() - self._step_started
            metrics["timing_s/diagnostics_share"] = metrics.get("timing_s/diagnostics", 0.0) / metrics["timing_s/step"]
            metrics[PEAK_MEMORY_METRIC] = max(self.actor_rollout_wg.orch_peak_memory_gb())
        return {metric_name(key): value for key, value in metrics.items() if value is not None and math.isfinite(value)}

    def log_step(self, metrics: dict[str, float], step: int, in_step: bool) -> None:
        """One veRL log call (`metrics` already floats) into the cell's MLflow run: a step's log (`in_step`) with
        orch's step metrics over veRL's, unless the step was logged before a resume (a re-run step keeps its first
        metrics); the hooks' tags; for a step, one line in the job's log, and the run ends here once a pending stop's
        step is logged."""
        metrics = self.logged_metrics(metrics, in_step)
        if not in_step or not 0 < step <= self.orch["logged_until"]:
            self.tracker.log_metrics(metrics, step=step)
        if self.step_tags:
            self.tracker.set_tags(self.step_tags)
            self.step_tags = {}
        if in_step:
            report(step=step, done=step, phase="logging", success=metrics.get("rollout/success_rate"))
            log.info("step %d/%d: success %.3f, kept %.2f, %.1fs", step, self.cfg.trainer.total_steps,
                     metrics.get("rollout/success_rate", float("nan")), metrics.get("rollout/kept_ratio", 1.0),
                     metrics["timing_s/step"])
            if self.pending_stop is not None:  # checkpointed at the step's end, now logged: end here
                raise self.pending_stop


def filtered_step(trainer: OrchTrainerBase, trajectories: list, generated: dict[str, list[int]],
                  policy: Any) -> np.ndarray:
    """orch's step on a rollout, one body for both of veRL's trainers (`OrchPPOTrainer._orch_step`,
    `recipes.verl.v1.OrchV1Trainer.after_rollout`): rollout statistics, the step hooks (the MI diagnostics) through
    `policy`, a stop inside the step, SNR-Aware Filtering (`recipes.stats.filtering.filter_step`), the rollout table,
    and the empty-step bookkeeping. Writes into `trainer.step_metrics` / `step_tags`; sets `advantage_scale`,
    `skip_update`, `empty_steps` and `pending_stop`. Returns the keep-mask over `trajectories` (all False: an empty
    step, whose rows the caller still passes through veRL's phases without an update)."""
    from recipes.diagnostics.hooks import StepContext
    from recipes.stats.rollout_stats import rollout_metrics
    from recipes.step import phases

    step, cfg, out = int(trainer.global_steps), trainer.cfg, trainer.step_metrics
    out.update(rollout_metrics(trajectories, generated, cfg.trainer.max_response_tokens))

    # hooks: the MI diagnostics on the unfiltered batch, then a stop requested meanwhile drops the step
    started = time.perf_counter()
    report(phase="diagnostics")
    context = StepContext(step=step, cfg=cfg, policy=policy, encoder=trainer.encoder, trajectories=trajectories,
                          group_ids=np.array([t.seed for t in trajectories]), generated=generated, metrics=out,
                          validation=trainer.validation)
    phases.run_hooks(trainer.hooks, context)
    trainer.step_tags.update(context.tags)
    if context.stop_reason:
        trainer.pending_stop = Stop("stopped", context.stop_reason)
    out["timing_s/diagnostics"] = time.perf_counter() - started
    trainer._stop_inside_step("diagnostics")

    # filter, rollout table, empty step (timed together as timing_s/filter)
    started = time.perf_counter()
    report(phase="filter")
    keep, loss_scale = phases.filter_rollout(context)
    phases.dump_rollouts(context, keep, trainer.tracker)
    trainer.empty_steps = phases.count_empty(context, keep, trainer.empty_steps, log)
    if keep.any():
        trainer.advantage_scale = loss_scale
        out["rollout/loss_scale"] = float(loss_scale)
    else:
        trainer.skip_update = True
        reason = phases.empty_steps_stop(cfg, trainer.empty_steps)
        if reason:  # over a hook's stop reason (the torch loop keeps the hook's)
            trainer.pending_stop = Stop("stopped", reason)
    out["timing_s/filter"] = time.perf_counter() - started
    return keep


def keep_best(saved: Path, best_dir: Path, best: dict[str, float]) -> None:
    """`best_dir` becomes a veRL checkpoint folder holding only `saved` (a `global_step_N` folder: its actor and
    orch's state), made of hard links (no disk space; veRL's rotation removing `saved` later leaves them), with veRL's
    iteration pointer and `best.json` ({"step", "success"}). The new step is in place before the pointer moves to it
    and the previous best is removed last, so a reader always finds a whole checkpoint."""
    import os
    import shutil

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:  # a file system without hard links
            shutil.copy2(source, target)

    target = best_dir / saved.name
    scratch = best_dir / f".{saved.name}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    shutil.copytree(saved / "actor", scratch / "actor", copy_function=link)
    if (saved / STATE_FILE).is_file():
        link(str(saved / STATE_FILE), str(scratch / STATE_FILE))
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)
    for name, text in ((ITERATION_FILE, str(best["step"])), (BEST_RECORD, json.dumps(best))):
        (best_dir / f".{name}.tmp").write_text(text)
        (best_dir / f".{name}.tmp").replace(best_dir / name)
    for old in best_dir.glob("global_step_*"):
        if old.name != saved.name:
            shutil.rmtree(old, ignore_errors=True)


def kept_best(best_dir: Path) -> dict[str, float]:
    """The {"step", "success"} of the best checkpoint kept in `best_dir` (`keep_best`), or {} when none is."""
    record = best_dir / BEST_RECORD
    return json.loads(record.read_text()) if record.is_file() else {}


def turn_scores(width: int, ends: Any, rewards: Any) -> torch.Tensor:
    """One trajectory's `rm_scores` (float32, `width` response positions): each turn's reward on the last token of
    its reply (`ends`, response positions), 0 elsewhere; the one placement of both veRL paths (`place_turn_rewards`
    in recipes.verl.trainer and recipes.verl.v1)."""
    scores = torch.zeros(width, dtype=torch.float32)
    for end, reward in zip(ends, rewards, strict=True):
        scores[end] += float(reward)
    return scores


def scaled_advantages(advantages: torch.Tensor, scale: float) -> torch.Tensor:
    """The advantages the actor update takes after SNR-Aware Filtering: veRL's advantages x the filter's loss scale
    (`filter.loss_scaling`), the one place both veRL paths apply it (the `_update_actor` overrides)."""
    return advantages * scale


def scalar(value: Any) -> float | None:
    """A logged value as a float (a one-element tensor, a number), or None (what is not logged)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool | int | float | np.integer | np.floating):
        return float(value)
    return None


def metric_name(key: str) -> str:
    """MLflow accepts letters, digits, `_ - . / ` and spaces in metric names."""
    return "".join(char if char.isalnum() or char in "_-./ " else "_" for char in key)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} into {STATE_FILE}")
