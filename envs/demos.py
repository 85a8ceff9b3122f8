"""Solver-based demonstrations: complete chat transcripts in the exact protocol, for warm-starting policies."""

from __future__ import annotations

import random
from typing import Any

from envs.episode import Episode
from envs.protocol import format_response
from envs.registry import build_config, env_class
from envs.trajectory import Message, Trajectory

SEED_RANGE = 2**31


def demonstrations(
    task: str, n: int, seed: int = 0, env_config: dict[str, Any] | None = None
) -> list[list[Message]]:
    """`n` transcripts (system, user, assistant, ...) where every reply is the env's expert move with reasoning
    that cites the facts of the current state. Episode seeds and phrasing are drawn from `seed`."""
    return [trajectory.messages for trajectory in demonstration_trajectories(task, n, seed, env_config)]


def demonstration_trajectories(
    task: str, n: int, seed: int = 0, env_config: dict[str, Any] | None = None
) -> list[Trajectory]:
    """The episodes of `demonstrations` (same arguments) as trajectories: their `messages` are the transcripts and
    `images` the frames of their image placeholders (image observations)."""
    config = build_config(task, dict(env_config or {}))
    cls = env_class(task)
    rng = random.Random(seed)
    transcripts = []
    for _ in range(n):
        env = cls(config)
        episode = Episode(env, rng.randrange(SEED_RANGE))
        while not episode.done:
            reasoning, actions = env.demonstrate(rng)
            episode.act(format_response(reasoning, actions))
        transcripts.append(episode.trajectory())
    return transcripts
