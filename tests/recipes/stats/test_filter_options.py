"""The filter ablations of Tables 6 and 7 drive a real (micro) training step: filter=quartile updates on one RV
quartile of the groups, filter=trajectory on the top-n and bottom-n trajectories of every group."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from mlflow import MlflowClient

from recipes.config.schema import compose_train_config
from recipes.run.training import run_training


def train_one_step(train_overrides: list[str], extra: list[str]) -> dict[str, float]:
    """Run one countdown step with the recorder; return the run's metrics."""
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "trainer.total_steps=1",
                 "trainer.val_every=0", "hooks=[recorder]", *extra]
    result = run_training(compose_train_config(overrides))
    assert (result.status, result.steps_done) == ("finished", 1), result.reason
    uri = next(o.split("=", 1)[1] for o in overrides if o.startswith("mlflow.tracking_uri="))
    return MlflowClient(uri).get_run(result.mlflow_run_id).data.metrics


def by_group(pairs: list[tuple]) -> dict:
    groups = defaultdict(list)
    for group, reward in pairs:
        groups[group].append(reward)
    return groups


def test_quartile_updates_on_one_quartile_of_the_groups(train_overrides, recorder) -> None:
    metrics = train_one_step(train_overrides, ["filter=quartile", "filter.value=2", "trainer.prompts_per_step=4"])
    (seen,) = recorder.seen
    groups = by_group(seen["all"])
    # 4 groups: each quartile is one group; quartile 2 = the second-highest reward std (ties: earlier group first)
    ranked = sorted(groups, key=lambda g: (-np.std(groups[g], ddof=1), list(groups).index(g)))
    assert [group for group, _ in seen["update"]] == [ranked[1]] * 2
    assert metrics["rollout/kept_groups"] == 1 and metrics["rollout/kept_ratio"] == 0.25
    assert metrics["rollout/update_trajectories"] == 2


def test_trajectory_updates_on_the_extremes_of_every_group(train_overrides, recorder) -> None:
    metrics = train_one_step(train_overrides, ["filter=trajectory", "filter.value=1", "trainer.samples_per_prompt=4"])
    (seen,) = recorder.seen
    rollout, update = by_group(seen["all"]), by_group(seen["update"])
    assert set(update) == set(rollout)  # every prompt stays
    for group, rewards in rollout.items():
        assert sorted(update[group]) == pytest.approx([min(rewards), max(rewards)])
    assert metrics["rollout/kept_groups"] == 2 and metrics["rollout/kept_samples"] == 4
    assert metrics["rollout/kept_ratio"] == 0.5 and metrics["rollout/update_trajectories"] == 4
