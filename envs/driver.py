"""The batch driver: B episodes of one task played in lock-step against a batched policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envs.episode import Episode
from envs.registry import build_config, env_class
from envs.trajectory import Message, Trajectory
from orchlib.errors import OrchError

Policy = Callable[[list[list[Message]]], list[str]]


def run_episodes(
    task: str,
    env_config: dict[str, Any],
    seeds: Sequence[int],
    policy: Policy,
    max_turns: int | None = None,
    dynamics_seeds: Sequence[int] | None = None,
) -> list[Trajectory]:
    """Play one episode per seed. Each round, `policy` receives the chat histories of the episodes still
    running (in seed order) and returns one reply per history. Returns the trajectories in seed order. With image
    observations, a policy whose `takes_images` is true is called `policy(histories, frames)`: per history, the
    frames of its image placeholders in order. A policy whose `takes_rows` is true is also told which episodes it is
    asked about, `rows=`: per history, its episode's index in `seeds` (the planted control,
    `recipes.policy.sampler.BlindSampler`, blinds some episodes and not others).

    `dynamics_seeds` (one per seed, optional) decorrelates stochastic dynamics between episodes that share a seed,
    e.g. the K samples of one prompt (see `Env.reset`)."""
    if dynamics_seeds is not None and len(dynamics_seeds) != len(seeds):
        raise OrchError(f"dynamics_seeds has {len(dynamics_seeds)} entries for {len(seeds)} seeds; they must match")
    config = build_config(task, dict(env_config))
    cls = env_class(task)
    per_episode = dynamics_seeds if dynamics_seeds is not None else [None] * len(seeds)
    episodes = [
        Episode(cls(config), seed, max_turns, dynamics) for seed, dynamics in zip(seeds, per_episode, strict=True)
    ]
    with_frames = config.observation == "image" and bool(getattr(policy, "takes_images", False))
    with_rows = bool(getattr(policy, "takes_rows", False))
    while rows := [row for row, episode in enumerate(episodes) if not episode.done]:
        active = [episodes[row] for row in rows]
        histories = [list(episode.messages) for episode in active]
        asked = {"rows": rows} if with_rows else {}
        replies = (policy(histories, [episode.images for episode in active], **asked) if with_frames
                   else policy(histories, **asked))
        if len(replies) != len(active):
            raise OrchError(f"policy returned {len(replies)} replies for {len(active)} chat histories")
        for episode, reply in zip(active, replies, strict=True):
            episode.act(reply)
    return [episode.trajectory() for episode in episodes]
