"""The batch driver: B episodes of one task played in lock-step against a batched policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from envs.episode import Episode
from envs.registry import build_config, env_class
from envs.trajectory import Message, Trajectory
from orchestrator.errors import OrchError

Policy = Callable[[list[list[Message]]], list[str]]


def run_episodes(
    task: str,
    env_config: dict[str, Any],
    seeds: Sequence[int],
    policy: Policy,
    max_turns: int | None = None,
) -> list[Trajectory]:
    """Play one episode per seed. Each round, `policy` receives the chat histories of the episodes still
    running (in seed order) and returns one reply per history. Returns the trajectories in seed order."""
    config = build_config(task, dict(env_config))
    cls = env_class(task)
    episodes = [Episode(cls(config), seed, max_turns) for seed in seeds]
    while active := [episode for episode in episodes if not episode.done]:
        replies = policy([list(episode.messages) for episode in active])
        if len(replies) != len(active):
            raise OrchError(f"policy returned {len(replies)} replies for {len(active)} chat histories")
        for episode, reply in zip(active, replies, strict=True):
            episode.act(reply)
    return [episode.trajectory() for episode in episodes]
