"""Template-collapse diagnostics during training: MI proxies from the rollout batch, and the collapse alert.

Two sample sets are drawn from the batch **before** filtering (RAGEN-2, arXiv 2604.06268, computes its MI proxies
on the unfiltered batch):

* ``first_turn`` -- the first-turn reasoning of (up to) ``num_samples`` trajectories; the columns are the distinct
  first-turn prompts (about 8 with the paper's 8 prompts x 16 samples), so each sample's own column is its prompt.
* ``trajectory`` -- ``num_samples`` draws, each a uniformly drawn trajectory and then a uniformly drawn turn of it;
  every draw is its own column (N = num_samples), and draws with identical prompt tokens are equivalent columns.

For a turn, the *prompt* is the full chat context up to and including the opening ``<think>`` tag and the
*reasoning* is the raw text between ``<think>`` and ``</think>`` (turns without a think block are not sampled).
Every sample is scored under every column by :func:`recipes.stats.cross_scoring.cross_score`, and
:func:`recipes.stats.mi.mi_proxies` turns the matrices into the metrics ``collapse/<set>/<proxy>``, plus
``collapse/<set>/mi_zscore_ema`` from a per-set :class:`recipes.stats.mi.ZScoreEMA`. The trajectory set's MI-ZScore-EMA
and retrieval feed the :class:`recipes.stats.collapse_alert.CollapseAlert` (``collapse/alert``).

:func:`reward_variance_buckets` groups the batch's prompts by reward spread for the gradient split (the
signal-to-noise analysis of RAGEN-2). :class:`DiagnosticsConfig` is the config's ``diagnostics:`` section;
``recipes.diagnostics.collapse_hook`` runs it all inside training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator

from orchlib.fields import boolean, integer, one_of
from recipes.stats.collapse_alert import CollapseAlert, CollapseRule, CollapseStatus
from recipes.stats.cross_scoring import SCORING_METHODS, CrossScores, cross_score
from recipes.stats.filtering import group_stats
from recipes.stats.mi import ZScoreEMA, mi_proxies

log = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SAMPLE_SETS = ("first_turn", "trajectory")


@dataclass(frozen=True)
class SampleSet:
    """Token ids of N prompt columns and M reasoning samples, with each sample's column and column classes."""

    prompts: list[list[int]]
    samples: list[list[int]]
    column: np.ndarray  # (M,) int
    column_classes: np.ndarray  # (N,) int; equal labels = identical prompt tokens


def raw_reasoning(response: str) -> str | None:
    """The text between the first ``<think>`` and the following ``</think>``; None if there is no such block."""
    start = response.find(THINK_OPEN)
    if start < 0:
        return None
    end = response.find(THINK_CLOSE, start + len(THINK_OPEN))
    return None if end < 0 else response[start + len(THINK_OPEN) : end]


class TurnEncoder:
    """Token ids of a turn's prompt (chat context + generation prompt + ``<think>``) and of its reasoning.

    ``encode_context(messages) -> ids`` renders a generation context (e.g. ``ChatEncoder.encode(messages,
    add_generation_prompt=True).input_ids``); ``encode_text(text) -> ids`` tokenises plain text;
    ``encode_frames(messages, frames) -> ids`` (optional) renders a context that shows frames (image observations:
    keyed ids, ``recipes.policy.vision``).
    """

    def __init__(self, encode_context: Callable[[list[dict]], list[int]], encode_text: Callable[[str], list[int]],
                 encode_frames: Callable[[list[dict], list[Any]], list[int]] | None = None):
        self.encode_context = encode_context
        self.encode_text = encode_text
        self.encode_frames = encode_frames
        self._think = encode_text(THINK_OPEN)

    def prompt(self, messages: list[dict], frames: Sequence[Any] = ()) -> list[int]:
        """The prompt column of a turn; `frames`: the frames its image placeholders show (image observations)."""
        if frames and self.encode_frames is not None:
            return [*self.encode_frames(messages, list(frames)), *self._think]
        return [*self.encode_context(messages), *self._think]

    def reasoning(self, response: str) -> list[int] | None:
        text = raw_reasoning(response)
        ids = self.encode_text(text) if text else []
        return ids or None


def turn_frames(trajectory: Any, index: int) -> list[Any]:
    """The frames the prompt of turn `index` shows (those of turns 0..index; empty with text observations)."""
    return [turn.image for turn in trajectory.turns[: index + 1] if getattr(turn, "image", None) is not None]


def _classes(prompts: list[list[int]]) -> np.ndarray:
    """Label columns so that identical token sequences share a label."""
    labels: dict[tuple[int, ...], int] = {}
    return np.array([labels.setdefault(tuple(p), len(labels)) for p in prompts], dtype=np.int64)


def first_turn_set(trajectories: Sequence[Any], encoder: TurnEncoder, num_samples: int, rng) -> SampleSet | None:
    """First-turn reasoning of up to ``num_samples`` trajectories; columns = distinct first-turn prompts."""
    candidates = []
    for trajectory in trajectories:
        if not trajectory.turns:
            continue
        reasoning = encoder.reasoning(trajectory.turns[0].response)
        if reasoning is not None:
            candidates.append((encoder.prompt(trajectory.turns[0].prompt_messages, turn_frames(trajectory, 0)),
                               reasoning))
    if not candidates:
        return None
    chosen = rng.choice(len(candidates), size=min(num_samples, len(candidates)), replace=False)
    columns: dict[tuple[int, ...], int] = {}
    samples, column = [], []
    for index in sorted(chosen):
        prompt, reasoning = candidates[index]
        column.append(columns.setdefault(tuple(prompt), len(columns)))
        samples.append(reasoning)
    prompts = [list(p) for p in columns]
    return SampleSet(prompts, samples, np.array(column, dtype=np.int64), np.arange(len(prompts)))


def trajectory_set(trajectories: Sequence[Any], encoder: TurnEncoder, num_samples: int, rng) -> SampleSet | None:
    """``num_samples`` uniform draws of (trajectory, turn); every draw is its own column."""
    usable = [
        [(trajectory, index) for index, turn in enumerate(trajectory.turns)
         if encoder.reasoning(turn.response) is not None]
        for trajectory in trajectories
    ]
    usable = [turns for turns in usable if turns]
    if not usable:
        return None
    prompts, samples = [], []
    for _ in range(num_samples):
        turns = usable[rng.integers(len(usable))]
        trajectory, index = turns[rng.integers(len(turns))]
        turn = trajectory.turns[index]
        prompts.append(encoder.prompt(turn.prompt_messages, turn_frames(trajectory, index)))
        samples.append(encoder.reasoning(turn.response))
    return SampleSet(prompts, samples, np.arange(num_samples, dtype=np.int64), _classes(prompts))


SAMPLE_SET_BUILDERS = {"first_turn": first_turn_set, "trajectory": trajectory_set}


class DiagnosticsConfig(BaseModel):
    """The ``diagnostics:`` config section (defaults: the paper's reference setting, MI at step 1 and every 5 steps
    on 64 samples per set)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mi_every: Annotated[int, integer(0, "steps between MI computations; 0 disables")] = 5  # also at step 1
    num_samples: Annotated[int, integer(1, "reasoning samples per set")] = 64
    sets: list[str] = list(SAMPLE_SETS)
    method: Annotated[str, one_of(lambda: SCORING_METHODS, "cross-scoring method")] = "prefix"
    batch_size: Annotated[int, integer(1, "sequences per cross-scoring forward pass")] = 32
    rule: CollapseRule = CollapseRule()
    stop_on_collapse: Annotated[bool, boolean()] = False
    grad_every: Annotated[int, integer(0, "steps between gradient splits; 0 disables")] = 0  # at step 1, 1 + N, ...
    grad_buckets: Annotated[int, integer(1, "reward-variance buckets")] = 6

    @field_validator("sets", mode="before")
    @classmethod
    def _known_sets(cls, sets: Any) -> Any:
        if not isinstance(sets, list | tuple) or not sets:
            raise ValueError(f"must be a non-empty list such as [{', '.join(SAMPLE_SETS)}], got {sets!r}")
        for name in sets:
            if name not in SAMPLE_SET_BUILDERS:
                raise ValueError(f"unknown MI sample set {name!r}; valid choices: {', '.join(SAMPLE_SETS)}")
        return list(sets)

    def due(self, step: int) -> bool:
        """Computed at step 1 and every ``mi_every`` steps."""
        return self.mi_every > 0 and (step == 1 or step % self.mi_every == 0)

    def grad_due(self, step: int) -> bool:
        """The gradient split runs at step 1 and every ``grad_every`` steps after it -- 1, 1 + N, 1 + 2N -- as RAGEN's
        gradient analysis does (agent_trainer.py:1436-1446: ``(global_step - 1) % every == 0``); never when 0."""
        return self.grad_every > 0 and (step - 1) % self.grad_every == 0


Scorer = Callable[[list[list[int]], list[list[int]]], CrossScores]


def scorer(model: Any, config: DiagnosticsConfig, pad_id: int, vision: Any = None) -> Scorer:
    """Cross-scoring with a causal LM in this process (`recipes.stats.cross_scoring.cross_score`, the configured method
    and batch size); with `vision` (`recipes.policy.vision.ImageTokens`) prompts may show frames (keyed ids), scored by
    `recipes.stats.vision_scoring.cross_score_images`."""
    if vision is not None:
        from recipes.stats.vision_scoring import cross_score_images

        return lambda prompts, samples: cross_score_images(model, vision, prompts, samples, method=config.method,
                                                           batch_size=config.batch_size, pad_id=pad_id)
    return lambda prompts, samples: cross_score(model, prompts, samples, method=config.method,
                                                batch_size=config.batch_size, pad_id=pad_id)


class CollapseMonitor:
    """Holds the EMA trackers and the collapse alert across steps; their state travels with checkpoints."""

    def __init__(self, config: DiagnosticsConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.emas = {name: ZScoreEMA() for name in config.sets}
        self.alert = CollapseAlert(config.rule)
        self.last_status: CollapseStatus | None = None
        self.warned: set[str] = set()  # sets already reported empty in this process (one warning per set per run)

    def compute(
        self, step: int, score: Scorer, encoder: TurnEncoder, trajectories: Sequence[Any], success: float | None
    ) -> dict[str, float]:
        """MI proxies of every configured sample set for this step's batch (call when ``config.due(step)``).

        ``score(prompts, samples)`` cross-scores the sets (:func:`scorer` for a model in this process; the veRL
        backend scores through its actor workers)."""
        rng = np.random.default_rng([self.seed, step])
        metrics: dict[str, float] = {}
        for name in self.config.sets:
            sample_set = SAMPLE_SET_BUILDERS[name](trajectories, encoder, self.config.num_samples, rng)
            metrics[f"collapse/{name}/num_samples"] = 0.0 if sample_set is None else float(len(sample_set.samples))
            if sample_set is None:
                self.warn_empty(name, step, trajectories)
                continue
            scores = score(sample_set.prompts, sample_set.samples)
            proxies = mi_proxies(scores.L, scores.L_sum, sample_set.column, sample_set.column_classes)
            metrics.update(proxies.to_metrics(f"collapse/{name}"))
            metrics[f"collapse/{name}/mi_zscore_ema"] = self.emas[name].update(proxies)
            metrics[f"collapse/{name}/scored_tokens"] = float(scores.tokens_processed)
        watched = "trajectory" if "trajectory" in self.config.sets else self.config.sets[0]
        if f"collapse/{watched}/mi_zscore_ema" in metrics:
            self.last_status = self.alert.update(
                step,
                metrics[f"collapse/{watched}/mi_zscore_ema"],
                metrics[f"collapse/{watched}/retrieval_acc"],
                metrics[f"collapse/{watched}/retrieval_chance"],
                success,
            )
            metrics["collapse/alert"] = float(self.last_status.alert)
            metrics["collapse/mi_drop"] = self.last_status.mi_drop
        return metrics

    def warn_empty(self, name: str, step: int, trajectories: Sequence[Any]) -> None:
        """Say once per set why it has no MI proxies (`collapse/<set>/num_samples` is 0 at every such step)."""
        if name in self.warned:
            return
        self.warned.add(name)
        turns = [turn for t in trajectories for turn in (t.turns[:1] if name == "first_turn" else t.turns)]
        log.warning(
            "step %d: MI diagnostics, sample set %r: none of the %d %s of the batch holds reasoning (a complete "
            "%s...%s block with text in it), so its MI proxies are not computed; collapse/%s/num_samples logs 0 "
            "at every such step",
            step, name, len(turns), "first-turn replies" if name == "first_turn" else "replies", THINK_OPEN,
            THINK_CLOSE, name)

    def state_dict(self) -> dict[str, Any]:
        return {
            "emas": {name: ema.state_dict() for name, ema in self.emas.items()},
            "detector": self.alert.state_dict(),  # the key checkpoints have always carried
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, ema_state in state["emas"].items():
            self.emas.setdefault(name, ZScoreEMA()).load_state_dict(ema_state)
        self.alert.load_state_dict(state["detector"])


@dataclass(frozen=True)
class RewardVarianceBucket:
    """The trajectories of the prompt groups whose within-prompt reward std lies in ``[rv_min, rv_max]``."""

    rows: np.ndarray  # (t,) int: indices into the step's trajectories
    rv_min: float
    rv_max: float


def reward_variance_buckets(returns: Any, group_ids: Any, num_buckets: int) -> list[RewardVarianceBucket]:
    """Prompt groups sorted by within-prompt reward std (``recipes.stats.filtering.group_stats``: unbiased std of the
    episode returns) and split into ``num_buckets`` buckets of equal group counts (sizes differ by at most one),
    lowest reward variance first. With fewer groups than buckets every bucket holds one group.

    Args:
        returns: (T,) episode returns.
        group_ids: (T,) prompt id of each trajectory (every group needs >= 2 trajectories).
    """
    stats = group_stats(returns, group_ids)
    order = np.argsort(stats.std, kind="stable")
    return [
        RewardVarianceBucket(
            rows=np.flatnonzero(np.isin(stats.inverse, groups)),
            rv_min=float(stats.std[groups].min()),
            rv_max=float(stats.std[groups].max()),
        )
        for groups in np.array_split(order, min(num_buckets, order.size))
    ]
