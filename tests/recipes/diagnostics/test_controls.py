"""The controls of the MI diagnostics (issue 29 item 1; docs/diagnostics.md#controls), on the torch backend.

*Planted collapse*: from step 3 (`control.blind_from_step`) every reply is generated from one fixed chat while the
trajectories keep their real, distinct FrozenLake prompts, so what the policy writes cannot depend on its input.
The MI proxies (which cross-score each reply against the real prompts) must fall to chance within a binomial
tolerance, entropy must not, and the early warning must fire within two steps. A proxy that ignored the policy's
replies (scoring prompts alone, say) would not fall and fails this test; a proxy that never saw input dependence
fails the first check (before the plant the proxies must be well above chance).

*Negative control*: the same run with nothing planted (same seed) keeps its retrieval above chance beyond the same
tolerance and its MI estimate. Whether the early warning fires there is noise at this sample size: its false-alarm
rate over seeds is measured by `benchmarks/bench_controls.py` and stated in docs/diagnostics.md#controls.

*Entropy collapse* (the opposite dissociation, which the paper uses to tell the two collapses apart): the same run
with a large negative entropy coefficient (the loss rewards certainty) at a learning rate that lets it act: entropy
must fall by more than a third (to 0.43-0.56 of step 1's over seeds 0-4) while the MI proxies keep their input dependence (retrieval above chance beyond the
same tolerance, the MI estimate at least half its first steps').

The policy is the tiny model after its FrozenLake warm start (the demo's: it reads its input, first-turn retrieval
about 8x chance; docs/training.md), updated at a learning rate of 1e-6 so that the policy itself barely moves: what
changes at step 3 is the plant alone. The early warning's success guard is off (`success_tolerance` 1): a blinded
policy also loses its FrozenLake success, and the rule rightly does not call a collapse *with* falling success
template collapse; what these controls test is its MI part. (The rehearsal's smaller warm start of 64 demonstrations is not enough: whether
that model reads its input at all changed with the machine's thread count, and so did this test.)
"""

from __future__ import annotations

import math

import pytest
from mlflow import MlflowClient

from recipes.config.backends import run_training
from recipes.config.schema import compose_train_config

BLIND_FROM = 3
STEPS = 6
SAMPLES = 16  # MI samples per set: the binomial tolerance of retrieval accuracy below
CONTROL = [
    "trainer=test", "model.actor_lr=1e-6", "hooks=[collapse]", "diagnostics.rule.success_tolerance=1.0",
    "diagnostics.mi_every=1", f"diagnostics.num_samples={SAMPLES}", f"diagnostics.batch_size={SAMPLES}",
    "algorithm=grpo", "task=frozenlake", "filter=none", f"trainer.total_steps={STEPS}", "trainer.prompts_per_step=8",
    "trainer.samples_per_prompt=2", "trainer.max_response_tokens=64", "trainer.val_every=0", "trainer.save_every=0",
    "seed=0",
]
RETRIEVAL, CHANCE = "collapse/trajectory/retrieval_acc", "collapse/trajectory/retrieval_chance"
MI, EMA, ENTROPY, ALERT = ("collapse/trajectory/mi_est", "collapse/trajectory/mi_zscore_ema", "actor/entropy",
                           "collapse/alert")


ENTROPY_COLLAPSE = ["model.actor_lr=1e-4", "algorithm.entropy_coeff=-1.0"]  # later overrides win
ENTROPY_LEFT = 2 / 3  # entropy over the last two steps below this share of step 1's


def control_run(session_dir, tmp_path, monkeypatch, name: str, blind_from: int,
                extra: tuple[str, ...] = ()) -> dict[str, dict[int, float]]:
    monkeypatch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{session_dir / 'mlflow.db'}"
    cfg = compose_train_config([*CONTROL, f"control.blind_from_step={blind_from}", f"mlflow.tracking_uri={uri}",
                                f"trainer.checkpoint_dir={tmp_path / name}", *extra])
    result = run_training(cfg)
    assert result.status == "finished", result.reason
    client = MlflowClient(uri)
    return {key: {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, key)}
            for key in (RETRIEVAL, CHANCE, MI, EMA, ENTROPY, ALERT)}


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def retrieval_and_bound(seen: dict[str, dict[int, float]], steps: range | list[int]) -> tuple[float, float]:
    """(mean retrieval accuracy over `steps`, chance plus 3 binomial standard deviations, pooled over len(steps) x
    SAMPLES draws: a false failure at true chance is about 1 in 1000)."""
    chance = mean(seen[CHANCE][s] for s in steps)
    return mean(seen[RETRIEVAL][s] for s in steps), chance + 3 * math.sqrt(chance * (1 - chance) / (len(steps) * SAMPLES))


def entropy_collapse_checks(seen: dict[str, dict[int, float]], steps: int = STEPS) -> dict[str, bool]:
    """The entropy-collapse control's three checks (this test's, and `bench_controls.py --entropy`'s per seed)."""
    first, after, late = range(1, BLIND_FROM), range(BLIND_FROM, steps + 1), range(steps - 1, steps + 1)
    retrieval, bound = retrieval_and_bound(seen, after)
    return {"entropy fell": mean(seen[ENTROPY][s] for s in late) < ENTROPY_LEFT * seen[ENTROPY][1],
            "retrieval above chance": retrieval > bound,
            "MI held": mean(seen[MI][s] for s in after) > 0.5 * mean(seen[MI][s] for s in first)}


@pytest.mark.slow
def test_a_planted_collapse_drops_the_mi_proxies_to_chance_but_not_entropy_and_fires_the_warning(
        session_dir, tmp_path, monkeypatch) -> None:
    seen = control_run(session_dir, tmp_path, monkeypatch, "planted", BLIND_FROM)
    before, after = range(1, BLIND_FROM), range(BLIND_FROM, STEPS + 1)
    # the proxies saw the input dependence while it was there ...
    assert mean(seen[RETRIEVAL][s] for s in before) > mean(seen[CHANCE][s] for s in before) + 0.1, seen
    # ... and see it gone: retrieval over the planted steps at chance within 3 binomial standard deviations, MI near
    # zero. A planted step none of whose blinded replies holds a complete <think> block has no MI proxies (the
    # monitor logs num_samples 0 and says so): seen on a loaded 2-core machine at the first planted step, at this
    # session's start commit too; the others must be measured.
    measured = [s for s in after if s in seen[CHANCE]]
    assert len(measured) >= len(after) - 1, (sorted(seen[CHANCE]), after)
    retrieval, bound = retrieval_and_bound(seen, measured)
    assert retrieval <= bound, (seen[RETRIEVAL], seen[CHANCE])
    assert max(seen[MI][s] for s in measured) < 0.25 * mean(seen[MI][s] for s in before), seen[MI]
    assert seen[EMA][STEPS] < 0.5 * max(seen[EMA].values()), seen[EMA]
    # entropy does not see it
    assert mean(seen[ENTROPY][s] for s in after) > 0.9 * mean(seen[ENTROPY][s] for s in before), seen[ENTROPY]
    # the early warning fires within two steps of the plant
    fired = [step for step, value in sorted(seen[ALERT].items()) if value]
    assert fired and BLIND_FROM <= fired[0] <= BLIND_FROM + 2, seen[ALERT]


@pytest.mark.slow
def test_with_nothing_planted_the_mi_proxies_stay_above_chance(
        session_dir, tmp_path, monkeypatch) -> None:
    seen = control_run(session_dir, tmp_path, monkeypatch, "negative", 0)
    after = range(BLIND_FROM, STEPS + 1)
    retrieval, bound = retrieval_and_bound(seen, after)
    assert retrieval > bound, (seen[RETRIEVAL], seen[CHANCE])
    assert mean(seen[MI][s] for s in after) > 0.5 * mean(seen[MI][s] for s in range(1, BLIND_FROM)), seen[MI]
    # The alert is not asserted: at 16 samples per set the rule's false-alarm rate is far from zero
    # (benchmarks/bench_controls.py; docs/diagnostics.md#controls), so whether it fires at one seed is noise.


@pytest.mark.slow
def test_an_entropy_collapse_drops_entropy_but_not_the_mi_proxies(session_dir, tmp_path, monkeypatch) -> None:
    seen = control_run(session_dir, tmp_path, monkeypatch, "entropy", 0, tuple(ENTROPY_COLLAPSE))
    checks = entropy_collapse_checks(seen)
    assert all(checks.values()), (checks, seen[ENTROPY], seen[RETRIEVAL], seen[CHANCE], seen[MI])
