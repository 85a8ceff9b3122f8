"""The controls of the MI diagnostics (issue 29 item 1, issue 46; docs/diagnostics.md#controls), on the torch backend.

*Planted collapse*: from step 3 (`control.blind_from_step`) every reply is generated from one fixed chat while the
trajectories keep their real, distinct FrozenLake prompts, so what the policy writes cannot depend on its input.
The MI proxies (which cross-score each reply against the real prompts) must fall to chance within a binomial
tolerance, entropy must not, and the collapse alert must fire within two steps. A proxy that ignored the policy's
replies (scoring prompts alone, say) would not fall and fails this test; a proxy that never saw input dependence
fails the first check (before the plant the proxies must be well above chance).

*Negative control*: the same run with nothing planted (same seed) keeps its retrieval above chance beyond the same
tolerance and its MI estimate. Whether the collapse alert fires there is noise at this sample size: its false-alarm
rate over seeds is measured by `benchmarks/bench_controls.py` and stated in docs/diagnostics.md#controls.

*Graded plant* (`control.blind_strength` 0.5, issue 46): from step 3 half of each step's 16 rows are blinded. The MI
proxies must fall part way, on the same steps and prompts as the two arms above: the retrieval excess over chance
and MI-ZScore clearly below the negative control's and clearly above the total plant's (the thresholds are in
`graded_checks`, measured over seeds by `bench_controls.py --graded`). An instrument that saw only all-or-nothing
(or nothing) fails one side.

*Entropy collapse* (the opposite dissociation, which the paper uses to tell the two collapses apart): the same run
with a large negative entropy coefficient (the loss rewards certainty) at a learning rate that lets it act: entropy
must fall by more than a third (to 0.43-0.56 of step 1's over seeds 0-4) while the MI proxies keep their input
dependence (retrieval above chance beyond the same tolerance, the MI estimate at least half its first steps').

The policy is the tiny model after its FrozenLake warm start (the demo's: it reads its input, first-turn retrieval
6.5-9x chance by warm start; docs/training.md), updated at a learning rate of 1e-6 so that the policy itself barely moves: what
changes at step 3 is the plant alone. The collapse alert's rule is the one every archived cell ran with (`LEGACY_RULE`,
passed explicitly: a change of the default rule does not move these tests) with its success guard off
(`success_tolerance` 1): a blinded policy also loses its FrozenLake success, and the rule rightly does not call a
collapse *with* falling success template collapse; what these controls test is its MI part. (The rehearsal's smaller
warm start of 64 demonstrations is not enough: whether that model reads its input at all changed with the machine's
thread count, and so did this test.)

Cost (issue 46: the three controls were the costliest file of a CI run). The warm start is paid once per session
(the session cache). The negative, planted and graded arms differ only from step 3 on, and a run's steps before its
plant do not depend on the plant (it acts at steps >= `blind_from_step`; every step is seeded by (seed, step)), so
they share one run of steps 1-2 (`ControlRuns.prefix`, which checkpoints at its end) and each arm resumes a copy of it
(checkpoint folder and MLflow store) with its own `control.*`: what an uninterrupted run of the arm computes
(`tests/recipes/torch_trainer/test_training.py::test_resume_equals_an_uninterrupted_run`; at seed 0 the three arms'
metrics equalled the uninterrupted runs' at every step, 2026-11-28; `bench_controls.py --straight` runs
the arms uninterrupted). The entropy arm changes the learning rate, which a resume would not (the
optimiser's state restores the checkpoint's), so it is a run of its own. Each arm runs once per module
(`runs`, a module fixture) whichever tests read it: 2 + 3 x 3 + 6 = 17 steps, where the three tests before the graded
arm ran 3 x 6 = 18.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import pytest
from mlflow import MlflowClient

from recipes.config.schema import compose_train_config
from recipes.run.training import run_training
from recipes.stats.collapse_alert import LEGACY_RULE

BLIND_FROM = 3
STEPS = 5  # steps 1-2 unplanted, 3-5 planted (3 planted steps: the alert's two-step window, and one to spare)
SAMPLES = 16  # MI samples per set: the binomial tolerance of retrieval accuracy below
GRADED = 0.5  # the graded arm's control.blind_strength: 8 of each step's 16 rows blinded
# The collapse alert's rule, pinned: the legacy rule (whose rates bench_controls.py recorded) without its success guard
RULE = [f"diagnostics.rule.{key}={value}" for key, value in {**LEGACY_RULE.model_dump(), "success_tolerance": 1.0}.items()]
CONTROL = [
    "trainer=test", "model.actor_lr=1e-6", "hooks=[collapse]", *RULE,
    "diagnostics.mi_every=1", f"diagnostics.num_samples={SAMPLES}", f"diagnostics.batch_size={SAMPLES}",
    "algorithm=grpo", "task=frozenlake", "filter=none", f"trainer.total_steps={STEPS}", "trainer.prompts_per_step=8",
    "trainer.samples_per_prompt=2", "trainer.max_response_tokens=64", "trainer.val_every=0", "trainer.save_every=0",
    "seed=0",
]
ENTROPY_COLLAPSE = ["model.actor_lr=1e-4", "algorithm.entropy_coeff=-1.0"]  # later overrides win
ENTROPY_LEFT = 2 / 3  # entropy over the last two steps below this share of step 1's
# The entropy arm's steps: the collapse needs them. Its last two steps' entropy over step 1's, seeds 0-4: 0.43-0.56 at
# 6 steps; 0.43-0.64 at 5 and 0.53-0.68 at 4 (`bench_controls.py --entropy --steps N`), too near ENTROPY_LEFT.
ENTROPY_STEPS = 6
# The arms: overrides after CONTROL's. The first three resume the shared prefix (steps 1 to BLIND_FROM - 1).
ARMS = {
    "negative": [],
    "planted": [f"control.blind_from_step={BLIND_FROM}"],
    "graded": [f"control.blind_from_step={BLIND_FROM}", f"control.blind_strength={GRADED}"],
    "entropy": ENTROPY_COLLAPSE,
}
BRANCHES = ("negative", "planted", "graded")

RETRIEVAL, CHANCE = "collapse/trajectory/retrieval_acc", "collapse/trajectory/retrieval_chance"
MI, ZSCORE, EMA, ENTROPY, ALERT = ("collapse/trajectory/mi_est", "collapse/trajectory/mi_zscore",
                                   "collapse/trajectory/mi_zscore_ema", "actor/entropy", "collapse/alert")
RESUMED = "resume/replayed_steps"  # logged once, at the checkpoint's step, by a resumed run
KEYS = (RETRIEVAL, CHANCE, MI, ZSCORE, EMA, ENTROPY, ALERT, RESUMED)


class ControlRuns:
    """The control arms at one seed in `folder`, each trained once, on first use, and kept (`arm`). The branches
    (`BRANCHES`) resume a copy of the prefix run (`prefix`: steps 1 to BLIND_FROM - 1, nothing planted); `straight`
    runs them uninterrupted instead (what the branches stand for; the bench's `--straight`). `extra`: overrides after
    the arm's (the bench's task, backend); `cache`: the ORCH_CACHE_DIR the runs use (None: the environment's)."""

    def __init__(self, folder: Path, seed: int = 0, steps: int = STEPS, entropy_steps: int = ENTROPY_STEPS,
                 extra: Sequence[str] = (), cache: Path | None = None, straight: bool = False) -> None:
        self.folder, self.seed, self.extra = folder, seed, list(extra)
        self.steps, self.entropy_steps = steps, entropy_steps
        self.cache, self.straight = cache, straight
        self.seen: dict[str, dict[str, dict[int, float]]] = {}
        self.seconds: dict[str, float] = {}  # wall seconds of each run (the prefix's under "prefix")

    def prefix(self) -> Path:
        """The shared prefix run's folder (its checkpoint at step BLIND_FROM - 1, its MLflow store), run once."""
        where = self.folder / "prefix"
        if "prefix" not in self.seen:
            self.seen["prefix"] = self._train("prefix", [f"trainer.total_steps={BLIND_FROM - 1}"])
        return where

    def arm(self, name: str) -> dict[str, dict[int, float]]:
        """Metric histories ({key: {step: value}}, `KEYS`) of arm `name` (`ARMS`), trained on first use."""
        if name not in self.seen:
            if name in BRANCHES and not self.straight:
                prefix, where = self.prefix(), self.folder / name
                shutil.copytree(prefix / "checkpoints", where / "checkpoints")
                with closing(sqlite3.connect(prefix / "mlflow.db")) as source, \
                        closing(sqlite3.connect(where / "mlflow.db")) as copy:
                    source.backup(copy)
            steps = self.entropy_steps if name == "entropy" else self.steps
            seen = self._train(name, [f"trainer.total_steps={steps}", *ARMS[name]])
            if name in BRANCHES and not self.straight:  # it resumed the prefix's checkpoint, replaying nothing
                assert seen[RESUMED] == {BLIND_FROM - 1: 0.0}, (name, seen[RESUMED])
            self.seen[name] = seen
        return self.seen[name]

    def _train(self, name: str, overrides: list[str]) -> dict[str, dict[int, float]]:
        where = self.folder / name
        where.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite:///{where / 'mlflow.db'}"
        cfg = compose_train_config([*CONTROL, f"seed={self.seed}", *overrides, *self.extra,
                                    f"mlflow.tracking_uri={uri}", f"trainer.checkpoint_dir={where / 'checkpoints'}"])
        started = time.perf_counter()
        with pytest.MonkeyPatch.context() as patch:
            if self.cache is not None:
                patch.setenv("ORCH_CACHE_DIR", str(self.cache))
            patch.chdir(self.folder)  # MLflow's artifacts (./mlruns)
            result = run_training(cfg)
        self.seconds[name] = time.perf_counter() - started
        assert result.status == "finished", (name, result.reason)
        client = MlflowClient(uri)
        return {key: {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, key)} for key in KEYS}


@pytest.fixture(scope="module")
def runs(session_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ControlRuns:
    """Seed 0's arms, each trained by the first test that reads it (the warm start: the session cache's)."""
    return ControlRuns(tmp_path_factory.mktemp("controls"), cache=session_dir / "cache")


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def measured(seen: dict[str, dict[int, float]], steps: range | list[int]) -> list[int]:
    """The steps of `steps` whose MI proxies were computed. A step none of whose replies holds a complete <think>
    block logs none (the monitor logs num_samples 0 and says so): seen at the first planted step of a total plant (its
    80 blinded replies, all from the one fixed chat), on a loaded 2-core machine, at older commits too."""
    return [s for s in steps if s in seen[CHANCE]]


def retrieval_and_bound(seen: dict[str, dict[int, float]], steps: range | list[int]) -> tuple[float, float]:
    """(mean retrieval accuracy over `steps`, chance plus 3 binomial standard deviations, pooled over len(steps) x
    SAMPLES draws: a false failure at true chance is about 1 in 1000)."""
    chance = mean(seen[CHANCE][s] for s in steps)
    return mean(seen[RETRIEVAL][s] for s in steps), chance + 3 * math.sqrt(chance * (1 - chance) / (len(steps) * SAMPLES))


def excess(seen: dict[str, dict[int, float]], steps: range | list[int]) -> float:
    """The mean retrieval excess over chance (accuracy minus chance) over `steps`."""
    return mean(seen[RETRIEVAL][s] - seen[CHANCE][s] for s in steps)


def entropy_collapse_checks(seen: dict[str, dict[int, float]], steps: int = ENTROPY_STEPS) -> dict[str, bool]:
    """The entropy-collapse control's three checks (this test's, and `bench_controls.py --entropy`'s per seed)."""
    first, after, late = range(1, BLIND_FROM), range(BLIND_FROM, steps + 1), range(steps - 1, steps + 1)
    retrieval, bound = retrieval_and_bound(seen, after)
    return {"entropy fell": mean(seen[ENTROPY][s] for s in late) < ENTROPY_LEFT * seen[ENTROPY][1],
            "retrieval above chance": retrieval > bound,
            "MI held": mean(seen[MI][s] for s in after) > 0.5 * mean(seen[MI][s] for s in first)}


def graded_figures(negative, graded, planted, steps: int = STEPS) -> dict[str, float]:
    """The MI proxies of the three arms over their planted steps (steps BLIND_FROM to `steps`: the same steps and
    prompts; each arm's measured ones, `measured`): per proxy (`excess`: retrieval's excess over chance; `zscore`:
    MI-ZScore) each arm's mean, the graded arm's `share` of the negative arm's (0: none of its input dependence
    left, 1: all of it) and its `position` between the total plant (0) and nothing planted (1)."""
    after = range(BLIND_FROM, steps + 1)
    figures = {}
    for proxy, value in (("excess", excess), ("zscore", lambda seen, s: mean(seen[ZSCORE][t] for t in s))):
        arms = {name: value(seen, measured(seen, after))
                for name, seen in (("negative", negative), ("graded", graded), ("planted", planted))}
        figures.update({f"{proxy}_{name}": figure for name, figure in arms.items()})
        figures[f"{proxy}_share"] = arms["graded"] / arms["negative"]
        figures[f"{proxy}_position"] = (arms["graded"] - arms["planted"]) / (arms["negative"] - arms["planted"])
    return figures


def graded_checks(figures: dict[str, float]) -> dict[str, bool]:
    """The graded control's checks on `graded_figures` (this test's, and `bench_controls.py --graded`'s per seed).

    Half the rows blinded leaves about half the input dependence, and the retrieval excess shows it: over seeds 0-5
    (`bench_controls.py --graded`) it kept 0.48-0.61 of the negative arm's and sat 0.46-0.62 of the way up from the
    total plant's with the warm start of 2026-11-28, and 0.31-0.57 and 0.31-0.58 with the two-core warm start of
    2026-12-02 (`WARM_START_FORMAT` 7; seed 0, CI's: 0.54 and 0.58). Its thresholds leave at least 0.11 to the nearest
    seed: it must have lost a fifth of its unplanted level (more than the binomial noise of a 48-draw retrieval
    accuracy, about 0.07, on levels of 0.56-0.73) and kept a fifth of the way up from the total plant's. A proxy blind
    to a partial plant fails the first; one that fell as far for half the rows as for all of them (an all-or-nothing
    instrument) fails the second.

    MI-ZScore, whose denominator (the marginal std) moves with the plant too, is asked only the second: its share of
    the negative arm's under a half plant is not stable enough for one seed to test. It was 0.33-0.55 over seeds 0-5
    with the 2026-11-28 warm start, but 0.21-0.85 with the 2026-12-02 one (seeds 0 and 2: 0.85 and 0.84; its
    unplanted level +1.4..+2.5, against +2.6..+4.0 before). Its position, 0.48-0.75 and 0.40-0.91, kept above a
    fifth on all twelve. The references must be apart (retrieval excess 0.55-0.74 and MI-ZScore 1.9-7.0 between the
    negative and total plants over those seeds), or the shares and positions would mean nothing (tests (a) and (b)
    say so too, each on its own arm).

    With the 2026-11-28 warm start, seed 0's graded arm read its first planted step as unplanted (retrieval 0.81,
    excess +0.71): its blinded replies, like the total plant's there, held no complete think block, so the monitor
    drew only the unblinded rows' turns; steps 4 and 5 read +0.28 and +0.10."""
    return {
        "references apart": (figures["excess_negative"] - figures["excess_planted"] > 0.3
                             and figures["zscore_negative"] - figures["zscore_planted"] > 1.5
                             and figures["zscore_negative"] > 1.0),
        "retrieval excess fell": figures["excess_share"] < 0.8,
        "retrieval excess above the total plant's": figures["excess_position"] > 0.2,
        "MI-ZScore above the total plant's": figures["zscore_position"] > 0.2,
    }


@pytest.mark.slow
def test_a_planted_collapse_drops_the_mi_proxies_to_chance_but_not_entropy_and_fires_the_warning(runs) -> None:
    assert_planted_collapse(runs.arm("planted"))


def assert_planted_collapse(seen: dict[str, dict[int, float]]) -> None:
    """The planted arm's checks (this test's; tests/recipes/verl/test_verl_v1_ports.py's on veRL's V1 trainer)."""
    before, after = range(1, BLIND_FROM), range(BLIND_FROM, STEPS + 1)
    # the proxies saw the input dependence while it was there ...
    assert mean(seen[RETRIEVAL][s] for s in before) > mean(seen[CHANCE][s] for s in before) + 0.1, seen
    # ... and see it gone: retrieval over the planted steps at chance within 3 binomial standard deviations, MI near
    # zero, on the planted steps the monitor measured (`measured`: all but one at least)
    planted = measured(seen, after)
    assert len(planted) >= len(after) - 1, (sorted(seen[CHANCE]), after)
    retrieval, bound = retrieval_and_bound(seen, planted)
    assert retrieval <= bound, (seen[RETRIEVAL], seen[CHANCE])
    assert max(seen[MI][s] for s in planted) < 0.25 * mean(seen[MI][s] for s in before), seen[MI]
    assert seen[EMA][planted[-1]] < 0.5 * max(seen[EMA].values()), seen[EMA]
    # entropy does not see it
    assert mean(seen[ENTROPY][s] for s in after) > 0.9 * mean(seen[ENTROPY][s] for s in before), seen[ENTROPY]
    # the collapse alert (the pinned rule) fires within two steps of the plant
    fired = [step for step, value in sorted(seen[ALERT].items()) if value]
    assert fired and BLIND_FROM <= fired[0] <= BLIND_FROM + 2, seen[ALERT]


@pytest.mark.slow
def test_with_nothing_planted_the_mi_proxies_stay_above_chance(runs) -> None:
    seen = runs.arm("negative")
    after = range(BLIND_FROM, STEPS + 1)
    assert measured(seen, after) == list(after), sorted(seen[CHANCE])
    retrieval, bound = retrieval_and_bound(seen, after)
    assert retrieval > bound, (seen[RETRIEVAL], seen[CHANCE])
    assert mean(seen[MI][s] for s in after) > 0.5 * mean(seen[MI][s] for s in range(1, BLIND_FROM)), seen[MI]
    # The alert is not asserted: at 16 samples per set the rule's false-alarm rate is far from zero
    # (benchmarks/bench_controls.py; docs/diagnostics.md#controls), so whether it fires at one seed is noise.


@pytest.mark.slow
def test_a_half_plant_drops_the_mi_proxies_part_way(runs) -> None:
    graded = runs.arm("graded")
    assert len(measured(graded, range(BLIND_FROM, STEPS + 1))) >= STEPS - BLIND_FROM, sorted(graded[CHANCE])
    figures = graded_figures(runs.arm("negative"), graded, runs.arm("planted"))
    checks = graded_checks(figures)
    assert all(checks.values()), (checks, figures)


@pytest.mark.slow
def test_an_entropy_collapse_drops_entropy_but_not_the_mi_proxies(runs) -> None:
    seen = runs.arm("entropy")
    checks = entropy_collapse_checks(seen)
    assert all(checks.values()), (checks, seen[ENTROPY], seen[RETRIEVAL], seen[CHANCE], seen[MI])
