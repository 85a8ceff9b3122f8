"""Evaluation of a trained policy (`orch eval SOURCE`): the training run's environments, chat protocol and sampler,
on validation seeds (disjoint from every training prompt, `recipes.runtime.seeds.validation_seeds`), into a new MLflow run
linked to its source.

    policy = load_source("0123abcd...", tracking_uri, task=None)     # a run id, checkpoint, or Hugging Face folder
    result = evaluate(policy, EvalSettings(episodes=16, samples=4, pass_k=4))

Metrics (`eval/`): success rate, mean episode return, pass@k (`eval/pass_at_K`) (the unbiased estimator of Chen et al. 2021,
"Evaluating Large Language Models Trained on Code": 1 - C(n-c, k) / C(n, k) per problem with c successes among its n
samples, averaged over problems), reply length in tokens, format validity, turns. The trajectories are logged as a
rollout batch (`rollouts/step_NNNN.parquet`, N the checkpoint's step), so `orch predict-filter-gain --run` and
`orch rollouts` read it. Rollouts run on the torch sampler (`recipes.policy.sampler`, batched, KV reuse across turns), or
with `engine="vllm"` (`orch eval --engine vllm`) on vLLM's offline engine (`recipes.trained.vllm_sampler`: the same chat
protocol and contexts, text observations), where vLLM is installed.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError

EVAL_SUFFIX = ".eval"  # `orch eval --sweep S`: the evaluation cells of sweep S form sweep S.eval


def eval_sweep_name(name: str) -> str:
    """The evaluation sweep (and MLflow experiment) of training sweep `name`."""
    return f"{name}{EVAL_SUFFIX}"


@dataclass(frozen=True)
class EvalSettings:
    episodes: int = 16  # validation seeds (problems)
    samples: int = 1  # samples per problem (n of pass@k)
    temperature: float | None = None  # None: the run's trainer.val_temperature
    pass_k: int = 1
    seed: int = 0
    engine: str = "torch"  # torch | vllm (recipes.trained.vllm_sampler)


ENGINES = ("torch", "vllm")


def check_engine(engine: str) -> None:
    """OrchError (one line) unless `engine` is one of `ENGINES` and, for vllm, vLLM is importable here."""
    if engine not in ENGINES:
        raise OrchError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if engine == "vllm":
        from recipes.trained.vllm_sampler import require_vllm

        require_vllm()


@dataclass
class Policy:
    """What an evaluation runs: the config it plays under, the model folder its tokenizer comes from, the model,
    and where it came from."""

    cfg: Any
    folder: Path
    model: Any
    source: str
    source_run: str | None = None
    step: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    weights_in_folder: bool = False  # `folder` holds the evaluated weights (a Hugging Face source, a merged veRL one)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with `c` successes among `n` samples (n >= k)."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def load_source(source: str, tracking_uri: str | None, task: str | None = None) -> Policy:
    """The policy `source` names: an MLflow run id or a checkpoint folder (torch backend; a veRL checkpoint is merged
    by veRL's model merger first) under its run's config, or a Hugging Face folder under the default config with
    `task`. OrchError (one line) for a source that is none of these."""
    from recipes.config.resolve import resolve_cell
    from recipes.policy.models import load_policy
    from recipes.runtime.hf_folder import hf_folder_problems
    from recipes.trained.export import RUN_ID, load_trained, resolve_checkpoint

    path = Path(source).expanduser()
    if path.is_dir() and (path / "config.json").is_file():  # a Hugging Face folder
        problems = hf_folder_problems(path)
        if problems:
            raise OrchError(problems[0])
        if task is None:
            raise OrchError(f"{source}: a Hugging Face folder carries no task: give --task")
        cfg = resolve_cell(overrides=["model=hf", f"model.path={path}", f"task={task}"]).config
        return Policy(cfg, path, load_policy(path, "float32", "cpu").eval(), source, weights_in_folder=True)
    checkpoint = resolve_checkpoint(source, tracking_uri)
    run = source if RUN_ID.match(source) and not path.exists() else None
    if checkpoint.name == "actor":  # veRL: merged into a Hugging Face folder first
        if task is None:
            raise OrchError(f"{source}: give --task for a veRL checkpoint")
        merged, model, step, state_run = merged_verl_policy(checkpoint)
        cfg = resolve_cell(overrides=["model=hf", f"model.path={merged}", f"task={task}"]).config
        return Policy(cfg, merged, model, source, run or state_run, step, weights_in_folder=True)
    cfg, folder, model, state = load_trained(checkpoint)
    if task is not None and task != cfg.task.name:
        cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"name": task, "env": {}})})
    return Policy(cfg, folder, model.eval(), source, run or state.get("mlflow_run_id"), int(state.get("step", 0)))


def evaluate(policy: Policy, settings: EvalSettings, progress: Any = None) -> tuple[dict[str, float], Any]:
    """Play `settings.samples` episodes on each of `settings.episodes` validation seeds; (metrics, rollout frame)."""
    import numpy as np

    from recipes.policy.chat import ChatEncoder
    from recipes.policy.models import load_tokenizer
    from recipes.policy.sampler import Sampler
    from recipes.runtime.seeds import seed_everything, validation_seeds
    from recipes.stats.rollout_stats import rollout_frame, validation_metrics
    from recipes.torch_trainer.trainer import play

    if settings.samples < settings.pass_k:
        raise OrchError(f"--pass-k {settings.pass_k} needs --samples >= {settings.pass_k} (got {settings.samples})")
    check_engine(settings.engine)
    cfg = policy.cfg
    temperature = settings.temperature if settings.temperature is not None else cfg.trainer.val_temperature
    seed_everything(settings.seed, 0, 2)
    encoder = ChatEncoder(load_tokenizer(policy.folder))
    if settings.engine == "vllm":
        sampler = vllm_sampler(policy, encoder, temperature, settings.seed)
    else:
        sampler = Sampler(policy.model, encoder, cfg.trainer.max_response_tokens, temperature,
                          cfg.trainer.max_context_tokens)
    trajectories = play(cfg, sampler, validation_seeds(settings.episodes), settings.samples)
    if progress:
        progress(len(trajectories))
    metrics = {key.replace("val/", "eval/"): value
               for key, value in validation_metrics(trajectories, sampler.generated).items()}
    by_seed: dict[int, list[bool]] = {}
    for trajectory in trajectories:
        by_seed.setdefault(trajectory.seed, []).append(bool(trajectory.success))
    metrics[f"eval/pass_at_{settings.pass_k}"] = float(np.mean(  # MLflow names take no "@"
        [pass_at_k(len(wins), sum(wins), settings.pass_k) for wins in by_seed.values()]))
    frame = rollout_frame(trajectories, sampler.generated, np.ones(len(trajectories), dtype=bool), policy.step)
    return metrics, frame


def vllm_sampler(policy: Policy, encoder: Any, temperature: float, seed: int, logprobs: bool = False) -> Any:
    """A `recipes.trained.vllm_sampler.VllmSampler` over the policy's weights: its folder when that holds them, else a
    Hugging Face copy written for this evaluation (removed at exit)."""
    from recipes.policy.models import load_tokenizer
    from recipes.trained.vllm_sampler import TEXT_ONLY, VllmSampler

    if encoder.vision is not None or policy.cfg.task.env.get("observation") == "image":
        raise OrchError(TEXT_ONLY)  # before writing anything
    folder = policy.folder
    if not policy.weights_in_folder:
        scratch = Path(tempfile.mkdtemp(prefix="orch-eval-vllm-"))
        atexit.register(shutil.rmtree, scratch, True)
        folder = scratch / "model"
        policy.model.save_pretrained(folder, safe_serialization=True)
        load_tokenizer(policy.folder).save_pretrained(folder)
    cfg = policy.cfg
    return VllmSampler(folder, encoder, cfg.trainer.max_response_tokens, temperature, cfg.trainer.max_context_tokens,
                       seed, logprobs)


def evaluation_checkpoint(cfg: Any) -> Path:
    """The checkpoint an evaluation config names (`evaluation.source`, `evaluation.checkpoint`): `kept_checkpoint`."""
    return kept_checkpoint(Path(cfg.evaluation.source), cfg.evaluation.checkpoint)


def kept_checkpoint(source: Path, which: str) -> Path:
    """The checkpoint of kind `which` that a run's checkpoint folder `source` kept: the newest complete one in its
    `best/` folder (`best`), or its latest; a torch-backend `step_N` folder or a veRL actor folder
    (`global_step_N/actor`). `OrchError` (one line) when there is none."""
    from recipes.runtime.checkpoint import BEST_DIR
    from recipes.trained.export import resolve_checkpoint

    folder = source / BEST_DIR if which == "best" else source
    try:
        return resolve_checkpoint(str(folder))
    except OrchError:
        why = ("no best/ checkpoint in it (the trainers keep one when they validate: trainer.val_every > 0)"
               if which == "best" else "no complete checkpoint")
        raise OrchError(f"config key evaluation.source {str(source)!r}: {why}") from None


def merged_verl_policy(actor: Path) -> tuple[Path, Any, int, str | None]:
    """A veRL actor checkpoint (`global_step_N/actor`) merged by veRL's model merger into a scratch Hugging Face
    folder that lives as long as this process: (folder, its policy, N, the MLflow run id orch's state beside the actor
    names, if any)."""
    import json

    from recipes.policy.models import load_policy
    from recipes.runtime.checkpoint import VERL_STATE_FILE
    from recipes.trained.export import export_hf

    scratch = Path(tempfile.mkdtemp(prefix="orch-eval-merged-"))
    atexit.register(shutil.rmtree, scratch, True)
    merged = scratch / "model"
    export_hf(actor, merged)
    state_file = actor.parent / VERL_STATE_FILE
    run = json.loads(state_file.read_text()).get("mlflow_run_id") if state_file.is_file() else None
    step = int(actor.parent.name.removeprefix("global_step_"))
    return merged, load_policy(merged, "float32", "cpu").eval(), step, run


def run_evaluation(cfg: Any, should_stop: Any = None) -> Any:
    """An evaluation cell (`evaluation.source` set; `orch eval --sweep S --best`): evaluate the source's checkpoint
    under this config (the source run's own, plus `evaluation.*`) into the cell's MLflow run, at the checkpoint's
    step, tagged with its source; the trajectories as its rollout batch. Returns a `TrainResult` (finished, 1 step).
    A stop request before it starts returns `preempted`; once playing, it runs to its end (minutes at most)."""
    from recipes.run.tracking import tracked_run
    from recipes.runtime.result import TrainResult
    from recipes.trained.export import load_trained

    if should_stop is not None and should_stop():
        return TrainResult("preempted", 0, str(cfg.infra.mlflow.run_id or ""), "stop requested before evaluating")
    checkpoint = evaluation_checkpoint(cfg)
    if checkpoint.name == "actor":  # a veRL cell's: merged by veRL's model merger, played under the cell's config
        folder, model, step, run = merged_verl_policy(checkpoint)
        policy = Policy(cfg, folder, model, str(checkpoint), run, step, weights_in_folder=True)
    else:
        _, folder, model, state = load_trained(checkpoint)
        step = int(state.get("step", 0))
        policy = Policy(cfg, folder, model.eval(), str(checkpoint), state.get("mlflow_run_id"), step)
    ev = cfg.evaluation
    settings = EvalSettings(episodes=ev.episodes, samples=ev.samples, temperature=ev.temperature, pass_k=ev.pass_k,
                            seed=ev.seed)

    def play(tracker: Any) -> Any:
        tracker.set_tags({"orch.eval.source": str(checkpoint), "orch.eval.source_run": policy.source_run or "",
                          "orch.eval.step": str(step), "orch.eval.checkpoint": ev.checkpoint,
                          "orch.eval.source_cell": cfg.training_digest()})
        tracker.log_run_config(cfg, Path(ev.source))
        metrics, frame = evaluate(policy, settings)
        tracker.log_metrics(metrics, step=step)
        tracker.log_frame(frame, "rollouts", f"step_{step:04d}.parquet")
        return TrainResult("finished", 1, tracker.run_id,
                           f"evaluated the {ev.checkpoint} checkpoint (step {step}) on {ev.episodes} problems")

    return tracked_run(cfg.infra, None, None, play)
