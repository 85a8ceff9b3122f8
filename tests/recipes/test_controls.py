"""The controls of the MI diagnostics (issue 29 item 1; docs/diagnostics.md#controls), on the torch backend.

*Planted collapse*: from step 3 (`control.blind_from_step`) every reply is generated from one fixed chat while the
trajectories keep their real, distinct FrozenLake prompts, so what the policy writes cannot depend on its input.
The MI proxies (which cross-score each reply against the real prompts) must fall to chance within a binomial
tolerance, entropy must not, and the early warning must fire within two steps. A proxy that ignored the policy's
replies (scoring prompts alone, say) would not fall and fails this test; a proxy that never saw input dependence
fails the first check (before the plant the proxies must be well above chance).

*Negative control*: the same run with nothing planted (same seed) keeps its MI above chance and raises no alert.
Its false-alarm rate over seeds is measured by `benchmarks/bench_controls.py` (docs/diagnostics.md#controls); CI
uses seed 0.

The policy is the tiny model after the rehearsal's small warm start (it reads its FrozenLake input: retrieval
about 3x chance), updated at a learning rate of 1e-6 so that the policy itself barely moves: what changes at step 3
is the plant alone.
"""

from __future__ import annotations

import math

import pytest
from mlflow import MlflowClient

from recipes.backends import run_training
from recipes.config import compose_train_config

BLIND_FROM = 3
STEPS = 6
SAMPLES = 16  # MI samples per set: the binomial tolerance of retrieval accuracy below
CONTROL = [
    "trainer=test", "model.warm_start.demos=64", "model.warm_start.epochs=3", "model.warm_start.eval_episodes=8",
    "model.warm_start.target_format_validity=0.5", "model.actor_lr=1e-6", "hooks=[collapse]",
    "diagnostics.mi_every=1", f"diagnostics.num_samples={SAMPLES}", f"diagnostics.batch_size={SAMPLES}",
    "algorithm=grpo", "task=frozenlake", "filter=none", f"trainer.total_steps={STEPS}", "trainer.prompts_per_step=8",
    "trainer.samples_per_prompt=2", "trainer.max_response_tokens=64", "trainer.val_every=0", "trainer.save_every=0",
    "seed=0",
]
RETRIEVAL, CHANCE = "collapse/trajectory/retrieval_acc", "collapse/trajectory/retrieval_chance"
MI, EMA, ENTROPY, ALERT = ("collapse/trajectory/mi_est", "collapse/trajectory/mi_zscore_ema", "actor/entropy",
                           "collapse/alert")


def control_run(session_dir, tmp_path, monkeypatch, name: str, blind_from: int) -> dict[str, dict[int, float]]:
    monkeypatch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{session_dir / 'mlflow.db'}"
    cfg = compose_train_config([*CONTROL, f"control.blind_from_step={blind_from}", f"mlflow.tracking_uri={uri}",
                                f"trainer.checkpoint_dir={tmp_path / name}"])
    result = run_training(cfg)
    assert result.status == "finished", result.reason
    client = MlflowClient(uri)
    return {key: {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, key)}
            for key in (RETRIEVAL, CHANCE, MI, EMA, ENTROPY, ALERT)}


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


@pytest.mark.slow
def test_a_planted_collapse_drops_the_mi_proxies_to_chance_but_not_entropy_and_fires_the_warning(
        session_dir, tmp_path, monkeypatch) -> None:
    seen = control_run(session_dir, tmp_path, monkeypatch, "planted", BLIND_FROM)
    before, after = range(1, BLIND_FROM), range(BLIND_FROM, STEPS + 1)
    # the proxies saw the input dependence while it was there ...
    assert mean(seen[RETRIEVAL][s] for s in before) > mean(seen[CHANCE][s] for s in before) + 0.1, seen
    # ... and see it gone: retrieval at chance within a binomial tolerance at every step, MI near zero
    for step in after:
        chance = seen[CHANCE][step]
        tolerance = 3 * math.sqrt(chance * (1 - chance) / SAMPLES)
        assert seen[RETRIEVAL][step] <= chance + tolerance, (step, seen[RETRIEVAL], seen[CHANCE])
    assert mean(seen[RETRIEVAL][s] - seen[CHANCE][s] for s in after) < 0.1, seen
    assert max(seen[MI][s] for s in after) < 0.25 * mean(seen[MI][s] for s in before), seen[MI]
    assert seen[EMA][STEPS] < 0.5 * max(seen[EMA].values()), seen[EMA]
    # entropy does not see it
    assert mean(seen[ENTROPY][s] for s in after) > 0.9 * mean(seen[ENTROPY][s] for s in before), seen[ENTROPY]
    # the early warning fires within two steps of the plant
    fired = [step for step, value in sorted(seen[ALERT].items()) if value]
    assert fired and BLIND_FROM <= fired[0] <= BLIND_FROM + 2, seen[ALERT]


@pytest.mark.slow
def test_with_nothing_planted_the_mi_proxies_stay_above_chance_and_no_warning_fires(
        session_dir, tmp_path, monkeypatch) -> None:
    seen = control_run(session_dir, tmp_path, monkeypatch, "negative", 0)
    after = range(BLIND_FROM, STEPS + 1)
    assert mean(seen[RETRIEVAL][s] - seen[CHANCE][s] for s in after) > 0.1, seen
    assert seen[EMA][STEPS] >= 0.5 * max(seen[EMA].values()), seen[EMA]
    assert not any(seen[ALERT].values()), seen[ALERT]
