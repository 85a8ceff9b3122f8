"""Text environments for agentic RL (Sokoban, FrozenLake, Countdown, MetaMathQA, WebShop), the multi-turn chat protocol,
the batch driver and solver-based demonstrations.

Names are resolved on first use (PEP 562) so that `import envs` (and the `orch` CLI) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Env": "envs.base",
    "EnvConfig": "envs.base",
    "GridEnv": "envs.grid",
    "make_env": "envs.registry",
    "list_envs": "envs.registry",
    "env_config_class": "envs.registry",
    "register_env": "envs.registry",
    "parse_response": "envs.protocol",
    "ParsedResponse": "envs.protocol",
    "format_response": "envs.protocol",
    "Episode": "envs.episode",
    "run_episodes": "envs.driver",
    "Trajectory": "envs.trajectory",
    "Turn": "envs.trajectory",
    "demonstrations": "envs.demos",
    "demonstration_trajectories": "envs.demos",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'envs' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
