"""Warm start: supervised fine-tuning on the task's solver demonstrations until replies are well-formed.

A random tiny model cannot produce `<think> ... </think> <answer> ... </answer>`, so RL would only ever see the
format penalty. SFT on demonstrations (loss on the assistant tokens only) runs epoch by epoch until sampled replies
on held-out seeds are both well-formed (format validity at the target) and **read their input**: the first-turn
retrieval accuracy of the MI diagnostics (`recipes.diagnostics.monitor`, in-batch cross-scoring of the held-out episodes'
first-turn reasoning under every held-out prompt) at least `TARGET_RETRIEVAL_OVER_CHANCE` times its chance level,
and more hits than an input-blind policy scores by luck (binomial p < `RETRIEVAL_SIGNIFICANCE`).
An epoch is evaluated only once its training loss has levelled off (`levelled_off`: an epoch whose loss still fell
by more than half from its first half to its second is still learning the reply format), and the last epoch always
is; each evaluation samples from a torch random stream of its own, so which epochs are evaluated changes no weights.
It also stops at the epoch cap, or once replies are well-formed but `RETRIEVAL_PATIENCE` well-formed evaluations in a
row bring no better one (a task whose reasoning the model does not learn to ground costs a few epochs, not the cap;
a warning says so). The weights kept are those of the best evaluated epoch (`evaluation_rank`: well-formed first,
then retrieval over chance, then validity), which is the last one unless training went past its best. A policy
whose reasoning never depended on its prompt has no input dependence for template
collapse to destroy (RAGEN-2, arXiv 2604.06268). The result is a Hugging Face folder cached by the hash of all
inputs (base model, task, env config, demonstrations, settings), so a sweep trains it once; `warm_start.json` in it
records the kept epoch's figures (validity, success, first-turn retrieval and its chance level), the epochs trained,
the seconds, the CPU seconds by phase (`cpu_seconds`: training, evaluations, total), every evaluation (`history`) and
every epoch's loss (`trained`). An optimiser step's gradient is the sum of `WARM_START_SHARDS` shards' (its chats
split by position), run in as many threads as the process may use, each torch op on one thread: the same weights
bit for bit on one core or two (`supervised_epoch`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recipes.policy.actor import model_mask
from recipes.policy.batch import build_batch, micro_batches
from recipes.policy.chat import ChatEncoder
from recipes.policy.models import base_model_folder, load_policy, load_tokenizer, quiet_save, text_sha
from recipes.policy.packing import pack, packed_attention, packed_forward, packs
from recipes.policy.sampler import Sampler
from recipes.policy.vision import ImageTokens
from recipes.runtime.cache import cache_root, cached_folder, input_hash
from recipes.runtime.checkpoint import restore_rng_states, rng_states
from recipes.runtime.seeds import heldout_seeds, seed_everything
from recipes.runtime.stop import StopRequested
from recipes.stats.mi import retrieval_excess, retrieval_p_value

if TYPE_CHECKING:
    from recipes.config.schema import ModelConfig, TrainConfig

log = logging.getLogger(__name__)
PARTIAL_FILE = "epoch.pt"  # the state after the last completed epoch of an interrupted warm start
REPORT_FILE = "warm_start.json"
WARM_START_FORMAT = 7  # bump when the procedure changes (4: reading means 4x chance at p < 0.001, patience 3;
# 5: a step's chats packed into one forward pass, its held-out sampling decoded by the lean step: issue 59;
# 6: an epoch evaluated only once its loss has levelled off, each evaluation on a random stream of its own: issue 59;
# 7: a step's gradient the sum of WARM_START_SHARDS shards', trained on one intra-op thread per shard: issue 59)
# Reading its input, the early stop: held-out first-turn retrieval accuracy at least this many times chance ...
TARGET_RETRIEVAL_OVER_CHANCE = 4.0
# ... and no likelier than this for an input-blind policy (recipes.stats.mi.retrieval_p_value). A warm start looks up to
# `epochs` (10) times, and at 0.05 per look up to one blind run in six would stop on luck (4 hits of 32 at chance
# 1/32, p 0.017, ten looks). 0.001 asks for 6 hits: 2 (2x chance) stopped blind Sokoban runs, and 5 (p 0.003) were
# Countdown reading only how many numbers it had.
RETRIEVAL_SIGNIFICANCE = 0.001
RETRIEVAL_PATIENCE = 3  # well-formed but not reading: evaluations without a better one before giving up
# An epoch is evaluated only once its loss has levelled off (`levelled_off`): its second half's mean loss at least this
# share of its first half's (issue 59: a FrozenLake first epoch falls from 7 to under 0.5, and its replies are not yet
# well-formed; a levelled epoch's halves differ by a few percent to a third).
LEVELLED_OFF = 0.5
EVALUATION_SEED = 0  # each held-out evaluation samples from its own torch stream (seeded by this and its epoch)
# An optimiser step's gradient is the sum of this many shards' (its chats split by position), whatever the cores: the
# shards run in as many threads as the build may use, each torch op on one thread, so the numbers never depend on the
# core count (issue 59: two intra-op threads block the kernels differently and re-roll how many epochs it takes).
WARM_START_SHARDS = 2


def heldout_figures(
    sampler: Sampler, task: str, env_config: dict[str, Any], seeds: list[int]
) -> dict[str, float]:
    """Play `seeds` with `sampler`: the share of well-formed turns, the success rate, the mean return, and the
    first-turn retrieval accuracy of the MI diagnostics with its chance level (NaN when no first turn held
    reasoning)."""
    from envs import run_episodes

    trajectories = run_episodes(task, env_config, seeds, sampler)
    turns = [turn for trajectory in trajectories for turn in trajectory.turns]
    return {
        "format_validity": sum(turn.format_valid for turn in turns) / max(1, len(turns)),
        "success": sum(trajectory.success for trajectory in trajectories) / len(trajectories),
        "mean_return": sum(trajectory.episode_return for trajectory in trajectories) / len(trajectories),
        **first_turn_retrieval(sampler, trajectories),
    }


def first_turn_retrieval(sampler: Sampler, trajectories: list[Any]) -> dict[str, float]:
    """`first_turn_retrieval`, `retrieval_chance` and `first_turn_samples`: the MI diagnostics' first-turn sample set
    of `trajectories` (every episode's first reasoning, every distinct first prompt a column) cross-scored by the
    sampler's model."""
    from recipes.diagnostics.collapse_hook import turn_encoder
    from recipes.diagnostics.monitor import DiagnosticsConfig, first_turn_set, scorer
    from recipes.stats.mi import mi_proxies

    encoder = turn_encoder(sampler.encoder, sampler.generated)
    sample_set = first_turn_set(trajectories, encoder, len(trajectories), np.random.default_rng(0))
    if sample_set is None:
        return {"first_turn_retrieval": float("nan"), "retrieval_chance": float("nan"), "first_turn_samples": 0}
    score = scorer(sampler.model, DiagnosticsConfig(), sampler.encoder.tokenizer.pad_token_id, sampler.encoder.vision)
    scores = score(sample_set.prompts, sample_set.samples)
    proxies = mi_proxies(scores.L, scores.L_sum, sample_set.column, sample_set.column_classes)
    return {"first_turn_retrieval": proxies.retrieval_acc, "retrieval_chance": proxies.retrieval_chance,
            "first_turn_samples": proxies.num_samples}


def reads_its_input(figures: dict[str, float]) -> bool:
    """Held-out first-turn retrieval at least `TARGET_RETRIEVAL_OVER_CHANCE` times its chance level, and not luck: an
    input-blind policy would do as well with probability below `RETRIEVAL_SIGNIFICANCE` (a few hits of 32 at chance
    1/32 are not reading: 6 are needed)."""
    accuracy, chance = figures["first_turn_retrieval"], figures["retrieval_chance"]
    p_value = retrieval_p_value(accuracy, chance, int(figures.get("first_turn_samples", 0)))
    return bool(retrieval_excess(accuracy, chance) >= TARGET_RETRIEVAL_OVER_CHANCE - 1.0
                and p_value < RETRIEVAL_SIGNIFICANCE)


def evaluation_rank(figures: dict[str, float], target_validity: float) -> tuple[bool, float, float]:
    """How good a held-out evaluation is, for keeping the best epoch: well-formed replies (validity >= the target)
    first, then the first-turn retrieval over its chance level (NaN -- no reasoning -- ranks lowest), then
    validity."""
    well_formed = figures["format_validity"] >= target_validity
    ratio = retrieval_excess(figures["first_turn_retrieval"], figures["retrieval_chance"]) + 1.0
    return well_formed, ratio if well_formed and ratio == ratio else float("-inf"), figures["format_validity"]


def warm_start_workers() -> int:
    """The threads a warm start's shards run in: the cores this process may run on (under SLURM, its allocation),
    at most `WARM_START_SHARDS`. A shared warm start is built by one cell while the others that need it wait for it
    (`recipes.runtime.cache`), so the build may use every core of the process, not only the cell's share."""
    return max(1, min(WARM_START_SHARDS, len(os.sched_getaffinity(0))))


@contextlib.contextmanager
def shard_threads(workers: int) -> Iterator[ThreadPoolExecutor | None]:
    """Torch on one intra-op thread inside the block (each op then runs on its calling thread, the same kernels
    whatever the cores), and a pool of `workers` threads for the shards (None for one: the caller's thread); the
    previous thread count restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if workers <= 1:
            yield None
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="warm-start-shard") as pool:
                yield pool
    finally:
        torch.set_num_threads(threads)


def shard_rows(count: int, shards: int) -> list[list[int]]:
    """A step's `count` chats (in their shuffled order) split by position into at most `shards` consecutive runs of
    near-equal length, the longer ones first: 4 chats in 2 shards are [[0, 1], [2, 3]], 3 are [[0, 1], [2]]."""
    size, extra = divmod(count, shards)
    runs, start = [], 0
    for shard in range(shards):
        end = start + size + (shard < extra)
        if end > start:
            runs.append(list(range(start, end)))
        start = end
    return runs


def shard_gradient(
    model: torch.nn.Module, params: list[torch.nn.Parameter], shard: Any, tokens: torch.Tensor
) -> tuple[float, tuple[torch.Tensor, ...]]:
    """One shard's loss and gradient: its packed summed cross-entropy (`packed_supervised_loss`) over the step's
    `tokens` loss tokens (a scalar), and its gradient w.r.t. `params` (one tensor of each parameter's shape), taken
    with `torch.autograd.grad` so that shards running at once leave `.grad` alone. Draws nothing random."""
    loss = packed_supervised_loss(model, shard) / tokens
    return loss.item(), torch.autograd.grad(loss, params)


def summed_gradients(shard_gradients: list[tuple[torch.Tensor, ...]]) -> list[torch.Tensor]:
    """The step's gradient: the shards' summed per parameter in their fixed order, ((g0 + g1) + g2) + ..., whichever
    thread finished first (float addition does not associate: another order is other numbers)."""
    summed = list(shard_gradients[0])
    for gradients in shard_gradients[1:]:
        summed = [total + gradient for total, gradient in zip(summed, gradients, strict=True)]
    return summed


def sharded_step(
    model: torch.nn.Module, step_batch: Any, tokens: torch.Tensor, shards: int, pool: ThreadPoolExecutor | None
) -> float:
    """Set `.grad` of `model`'s trainable parameters to the step's gradient, the sum of its `shards` shards'
    (`shard_rows`, `shard_gradient`, `summed_gradients`), computed in `pool`'s threads (or one after the other on
    this thread without one: the same numbers bit for bit); returns the step's loss (the shards' summed)."""
    params = [param for param in model.parameters() if param.requires_grad]
    parts = [step_batch.select(rows) for rows in shard_rows(len(step_batch), shards)]

    def gradient(part: Any) -> tuple[float, tuple[torch.Tensor, ...]]:
        return shard_gradient(model, params, part, tokens)

    with packed_attention(model):  # switched once here, not by each shard's pass: they run at once
        results = list(pool.map(gradient, parts)) if pool is not None else [gradient(part) for part in parts]
    for param, summed in zip(params, summed_gradients([grads for _, grads in results]), strict=True):
        param.grad = summed
    return sum(loss for loss, _ in results)


def supervised_epoch(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, batch_size: int, grad_clip: float,
    should_stop: Callable[[], bool] | None = None, step_losses: list[float] | None = None,
    workers: int = 1, shards: int = WARM_START_SHARDS,
) -> float:
    """One shuffled pass of next-token cross-entropy on the loss-masked tokens (token mean per optimiser step of
    `batch_size` chats); returns the mean loss, and appends each optimiser step's to `step_losses` when given.

    A step's gradient is the sum of `shards` shards' (`sharded_step`: its chats split by position, each shard's
    packed end to end into one unpadded forward pass, `recipes.policy.packing`), run in `workers` threads; torch
    runs on one intra-op thread throughout (`shard_threads`), so the weights are the same bit for bit whatever
    `workers`. A vision-language model's chats (or a step of one chat) run one per pass on this thread, their
    gradients accumulated in `.grad`. `should_stop` is polled before every optimiser step: `StopRequested` when it
    says so (the epoch's work is dropped)."""
    with shard_threads(workers) as pool:
        return _supervised_epoch(model, optimizer, batch, batch_size, grad_clip, should_stop,
                                 [] if step_losses is None else step_losses, shards, pool)


def _supervised_epoch(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, batch_size: int, grad_clip: float,
    should_stop: Callable[[], bool] | None, losses: list[float], shards: int, pool: ThreadPoolExecutor | None,
) -> float:
    """`supervised_epoch` inside its threads."""
    shuffled = batch.select(torch.randperm(len(batch)).numpy())
    for start in range(0, len(shuffled), batch_size):
        if should_stop is not None and should_stop():
            raise StopRequested("stop requested during the warm start")
        step_batch = shuffled.select(list(range(start, min(start + batch_size, len(shuffled)))))
        tokens = step_batch.loss_mask[:, 1:].sum()
        optimizer.zero_grad(set_to_none=True)
        if packs(step_batch, model):
            total = sharded_step(model, step_batch, tokens, shards, pool)
        else:
            total = 0.0
            for chat in micro_batches(step_batch, 1):
                logits = model(input_ids=chat.input_ids, attention_mask=model_mask(chat),
                               **chat.model_inputs(model)).logits[:, :-1].float()
                nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chat.input_ids[:, 1:],
                                                        reduction="none")
                loss = (nll * chat.loss_mask[:, 1:]).sum() / tokens
                loss.backward()
                total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(total)
    return sum(losses) / len(losses)


def loss_halves(step_losses: list[float]) -> tuple[float, float]:
    """The mean loss over the first and over the second half of an epoch's optimiser steps (one step: both halves)."""
    half = max(1, len(step_losses) // 2)
    return sum(step_losses[:half]) / half, sum(step_losses[-half:]) / half


def levelled_off(step_losses: list[float]) -> bool:
    """Whether an epoch's training loss has levelled off: the mean over its second half of optimiser steps at least
    `LEVELLED_OFF` of the mean over its first half. An epoch whose loss still fell faster than that is still learning
    the reply format (every such epoch measured was below the validity target: docs/training.md), so its held-out
    evaluation is skipped. One step (no halves) counts as levelled."""
    if len(step_losses) < 2:
        return True
    first, second = loss_halves(step_losses)
    return second >= LEVELLED_OFF * first


def packed_supervised_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The summed next-token cross-entropy of `batch`'s loss-masked tokens, its rows packed into one forward pass;
    the output head runs only where a loss token is predicted."""
    packed = pack(batch)
    rows, cols = torch.nonzero(batch.loss_mask[:, 1:], as_tuple=True)  # token cols + 1, predicted at cols
    hidden = packed_forward(model.base_model, packed).last_hidden_state[0, packed.index(rows, cols)]
    logits = model.get_output_embeddings()(hidden).float()
    nll = torch.nn.functional.cross_entropy(logits, batch.input_ids[rows, cols + 1], reduction="none")
    return (nll * batch.loss_mask[rows, cols + 1]).sum()


def train_warm_start(
    base_folder: Path, task: str, env_config: dict[str, Any], demos: list[list[dict[str, str]]],
    settings: dict[str, Any], device: str, out: Path, frames: list[list[Any]] | None = None,
    should_stop: Callable[[], bool] | None = None, partial: Path | None = None,
) -> dict[str, Any]:
    """SFT `base_folder` on `demos` (with `frames`: the frames of their image placeholders, for a vision-language
    model) until the held-out replies are well-formed and read their input (or stop improving); save the best
    evaluated epoch's weights to `out`.

    With `partial` (a folder of its own), the state after every epoch is kept there (model, optimiser, evaluations,
    the best weights, RNG) and a later call resumes after the last kept epoch; `should_stop` is polled between
    optimiser steps and before each evaluation, and raises `StopRequested` (the interrupted epoch is redone on
    resume), so a warm start preempted again and again still finishes."""
    seed_everything(0)
    started, started_cpu = time.perf_counter(), time.process_time()
    tokenizer = load_tokenizer(base_folder)
    model = load_policy(base_folder, "float32", device)
    encoder = ChatEncoder(tokenizer, vision=ImageTokens.from_folder(base_folder, tokenizer))
    turn_counts = [[0.0] * sum(message["role"] == "assistant" for message in demo) for demo in demos]
    batch = build_batch(demos, turn_counts, range(len(demos)), encoder, frames=frames).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings["lr"], weight_decay=0.0)
    seeds = heldout_seeds(settings["eval_episodes"])
    history = []  # the evaluated epochs' figures
    trained: list[dict[str, Any]] = []  # every epoch's loss, its halves' means, and whether it was evaluated
    best: dict[str, Any] | None = None  # the best evaluation so far (evaluation_rank) and the weights it scored
    best_state: dict[str, torch.Tensor] = {}
    stalled = 0  # well-formed evaluations since the best one
    first = 1
    if partial is not None and (partial / PARTIAL_FILE).is_file():
        kept = torch.load(partial / PARTIAL_FILE, map_location=device, weights_only=False)
        model.load_state_dict(kept["model"])
        optimizer.load_state_dict(kept["optimizer"])
        history, best, best_state, stalled = kept["history"], kept["best"], kept["best_state"], kept["stalled"]
        trained = kept["trained"]
        restore_rng_states(kept["rng"])
        first = kept["epoch"] + 1
        log.info("warm start %s: resumes after epoch %d (a stop interrupted it)", task, kept["epoch"])
    for epoch in range(first, settings["epochs"] + 1):
        epoch_start, epoch_cpu = time.perf_counter(), time.process_time()
        step_losses: list[float] = []
        loss = supervised_epoch(model, optimizer, batch, settings["batch_size"], grad_clip=1.0,
                                should_stop=should_stop, step_losses=step_losses, workers=warm_start_workers())
        first_half, second_half = loss_halves(step_losses)
        evaluated = epoch == settings["epochs"] or (epoch % settings["eval_every"] == 0 and levelled_off(step_losses))
        trained.append({"epoch": epoch, "loss": loss, "loss_first_half": first_half,
                        "loss_second_half": second_half, "evaluated": evaluated,
                        "train_seconds": time.perf_counter() - epoch_start,
                        "train_cpu_seconds": time.process_time() - epoch_cpu})
        if not evaluated:
            log.info("warm start %s epoch %d: loss %.3f (halves %.3f, %.3f), not evaluated", task, epoch, loss,
                     trained[-1]["loss_first_half"], trained[-1]["loss_second_half"])
            _keep_epoch(partial, epoch, model, optimizer, history, trained, best, best_state, stalled)
            continue
        if should_stop is not None and should_stop():
            raise StopRequested("stop requested during the warm start")
        eval_start, eval_cpu = time.perf_counter(), time.process_time()
        sampler = Sampler(model, encoder, settings["max_response_tokens"], settings["eval_temperature"], 1 << 20)
        with torch.random.fork_rng(devices=[]):  # the evaluations leave training's random stream as it was
            torch.manual_seed(EVALUATION_SEED + epoch)
            figures = heldout_figures(sampler, task, env_config, seeds)
        history.append({"epoch": epoch, "loss": loss, **figures, "train_seconds": trained[-1]["train_seconds"],
                        "eval_seconds": time.perf_counter() - eval_start,
                        "train_cpu_seconds": trained[-1]["train_cpu_seconds"],
                        "eval_cpu_seconds": time.process_time() - eval_cpu})
        log.info("warm start %s epoch %d: loss %.3f, format validity %.3f, first-turn retrieval %.3f (chance %.3f)",
                 task, epoch, loss, figures["format_validity"], figures["first_turn_retrieval"],
                 figures["retrieval_chance"])
        rank = evaluation_rank(figures, settings["target_format_validity"])
        well_formed = rank[0]
        if best is None or rank > evaluation_rank(best, settings["target_format_validity"]):
            best, stalled = history[-1], 0
            best_state = {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}
        elif well_formed:
            stalled += 1
        if well_formed and (reads_its_input(figures) or stalled >= RETRIEVAL_PATIENCE):
            break
        _keep_epoch(partial, epoch, model, optimizer, history, trained, best, best_state, stalled)
    if best is not history[-1]:
        log.info("warm start %s: keeps epoch %d, its best held-out evaluation (validity %.3f, first-turn retrieval "
                 "%.3f, chance %.3f), not the last (epoch %d)", task, best["epoch"], best["format_validity"],
                 best["first_turn_retrieval"], best["retrieval_chance"], history[-1]["epoch"])
        model.load_state_dict(best_state)
    if not reads_its_input(best):
        log.warning(
            "warm start %s: after %d epochs the held-out first-turn retrieval is %.3f against a chance level of %.3f "
            "over %d samples (target: %.0fx chance, beyond luck at p < %g): the policy's reasoning "
            "barely depends on its prompt, so the MI diagnostics have little input dependence to watch collapse",
            task, history[-1]["epoch"], best["first_turn_retrieval"], best["retrieval_chance"],
            best.get("first_turn_samples", 0), TARGET_RETRIEVAL_OVER_CHANCE, RETRIEVAL_SIGNIFICANCE)
    with quiet_save():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if encoder.vision is not None:
        encoder.vision.image_processor.save_pretrained(out)
    report = {**best, "epochs": history[-1]["epoch"], "seconds": time.perf_counter() - started,
              "demonstrations": len(demos), "heldout_episodes": len(seeds), "history": history,
              "trained": trained, "cpu_seconds": {  # this process's CPU time (all its threads), by phase
                  "total": time.process_time() - started_cpu,
                  "training": sum(entry["train_cpu_seconds"] for entry in trained),
                  "evaluations": sum(entry["eval_cpu_seconds"] for entry in history)}}
    (out / REPORT_FILE).write_text(json.dumps(report, indent=1))
    return report


def _keep_epoch(partial: Path | None, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                history: list, trained: list, best: dict | None, best_state: dict, stalled: int) -> None:
    """The warm start's state after `epoch`, written atomically into `partial` (nothing without one)."""
    if partial is None:
        return
    partial.mkdir(parents=True, exist_ok=True)
    scratch = partial / f".{PARTIAL_FILE}.tmp-{os.getpid()}"
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "history": history,
                "trained": trained, "best": best, "best_state": best_state, "stalled": stalled, "rng": rng_states()}, scratch)
    os.replace(scratch, partial / PARTIAL_FILE)


def warm_start_folder(
    model_cfg: ModelConfig, base_folder: Path, task: str, env_config: dict[str, Any], device: str,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """The cached warm-started model folder for (base model, task, env config, settings) and its report. Building
    it polls `should_stop` and keeps its epochs beside the cache entry (`<hash>.partial`), so a stopped build
    resumes there; the partial state goes once the folder is complete."""
    from envs import demonstration_trajectories

    settings = model_cfg.warm_start.model_dump(exclude={"enabled"})
    trajectories = demonstration_trajectories(task, settings["demos"], seed=0, env_config=env_config)
    demos = [trajectory.messages for trajectory in trajectories]
    frames = [trajectory.images for trajectory in trajectories] if any(t.images for t in trajectories) else None
    inputs = {
        "base": str(base_folder.resolve()),
        "task": task,
        "env": env_config,
        "demos_sha256": text_sha([json.dumps(demo, sort_keys=True) for demo in demos]),
        "settings": settings,
        "format": WARM_START_FORMAT,
    }
    root = cache_root(model_cfg.cache_dir)
    partial = root / "warm-start" / f"{input_hash(inputs)}.partial"
    folder = cached_folder(
        "warm-start", inputs,
        lambda out: train_warm_start(base_folder, task, env_config, demos, settings, device, out, frames,
                                     should_stop, partial),
        root, should_stop,
    )
    shutil.rmtree(partial, ignore_errors=True)
    return folder, json.loads((folder / REPORT_FILE).read_text())


def model_folder(cfg: TrainConfig, should_stop: Callable[[], bool] | None = None) -> tuple[Path, dict[str, Any]]:
    """The folder the policy starts from (warm-started when enabled) and the warm start's report; a stop requested
    while the warm start trains raises `StopRequested` (see `warm_start_folder`)."""
    base = base_model_folder(cfg.model)
    if not cfg.model.warm_start.enabled:
        return base, {}
    return warm_start_folder(cfg.model, base, cfg.task.name, cfg.task.env, cfg.trainer.device, should_stop)
