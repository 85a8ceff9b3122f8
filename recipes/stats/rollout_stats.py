"""Statistics of a step's trajectories, the same on every trainer backend: the `rollout/*`, `response_length/*` and
`val/*` metrics, and the step's rollout-batch table (`recipes.stats.rollouts`). Lengths count the tokens the policy
generated (the replies), never the observation or template tokens between turns.

    generated: reply text -> the token ids sampled for it (`recipes.policy.sampler.Sampler.generated`, or what a veRL
               agent loop recorded), so that lengths are in tokens.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

VAL_SUCCESS = "val/success_rate"  # validation success rate in [0, 1]: the paper's headline number


def rollout_metrics(trajectories: list[Any], generated: dict[str, list[int]], cap: int) -> dict[str, float]:
    """Reward, success, format and length statistics of the (unfiltered) batch."""
    returns = np.array([t.episode_return for t in trajectories])
    lengths = np.array([sum(len(generated.get(turn.response, ())) for turn in t.turns) for t in trajectories])
    replies = [generated.get(turn.response, ()) for t in trajectories for turn in t.turns]
    turns = [turn for t in trajectories for turn in t.turns]
    return {
        "rollout/reward_mean": float(returns.mean()),
        "rollout/reward_std": float(returns.std()),
        "rollout/reward_max": float(returns.max()),
        "rollout/reward_min": float(returns.min()),
        "rollout/success_rate": float(np.mean([t.success for t in trajectories])),
        "rollout/format_validity": float(np.mean([turn.format_valid for turn in turns])),
        "rollout/num_turns_mean": float(np.mean([t.num_turns for t in trajectories])),
        "rollout/trajectories": float(len(trajectories)),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/min": float(lengths.min()),
        "response_length/clip_ratio": float(np.mean([len(reply) >= cap for reply in replies])),
    }


def rollout_frame(trajectories: list[Any], generated: dict[str, list[int]], keep: np.ndarray, step: int) -> Any:
    """The project's rollout-batch table (recipes/stats/rollouts.py) for this step: one row per trajectory."""
    import pandas as pd

    rows, seen = [], Counter()
    for trajectory, kept in zip(trajectories, keep, strict=True):
        row = trajectory.to_record()
        row.update(
            step=step,
            sample=seen[trajectory.seed],
            response_length=sum(len(generated.get(turn.response, ())) for turn in trajectory.turns),
            kept=bool(kept),
        )
        if trajectory.images:  # image observations by reference: the frames' SHA-256, never their bytes
            from recipes.policy.vision import frame_digest

            row["images"] = [frame_digest(frame) for frame in trajectory.images]
        seen[trajectory.seed] += 1
        rows.append(row)
    return pd.DataFrame(rows)


def validation_metrics(trajectories: list[Any], generated: dict[str, list[int]]) -> dict[str, float]:
    """Validation: success rate, mean return, format validity, reply length (tokens), turns per episode."""
    turns = [turn for t in trajectories for turn in t.turns]
    return {
        VAL_SUCCESS: float(np.mean([t.success for t in trajectories])),
        "val/reward_mean": float(np.mean([t.episode_return for t in trajectories])),
        "val/format_validity": float(np.mean([turn.format_valid for turn in turns])),
        "val/response_length": float(np.mean(
            [sum(len(generated.get(turn.response, ())) for turn in t.turns) for t in trajectories])),
        "val/num_turns_mean": float(np.mean([t.num_turns for t in trajectories])),
    }
