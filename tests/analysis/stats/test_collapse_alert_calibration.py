"""The collapse alert's offline calibration (analysis.stats.collapse_alert_calibration) on constructed runs whose answer is known:
the replay is the training-time alert, the rates count what they say, the choice is made on one half and reported on
the other, and the report prints the rates and the ROC."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import names
from analysis.stats import collapse_alert_calibration as ac
from analysis.stores.mlflow_store import RunData
from recipes.stats.collapse_alert import LEGACY_RULE, CollapseAlert, CollapseRule

CHANCE = 0.1
STEPS = np.array([1, 5, 10, 15, 20, 25, 30, 35, 40])


def cell(mi, acc, *, seed=0, strength=0.0, plant=None, val=(0.5, 0.5), fmt=(1.0, 1.0), task="frozenlake"):
    return ac.Cell(sweep="s", task=task, seed=seed, arm="none", strength=strength, plant_step=plant,
                   steps=STEPS[:len(mi)], mi=np.asarray(mi, float), acc=np.asarray(acc, float),
                   chance=np.full(len(mi), CHANCE), success=[0.5] * len(mi), val_success=np.asarray(val, float),
                   val_format=np.asarray(fmt, float), logged_alert=None)


FLAT = cell([2.0] * 9, [0.6] * 9)
NOISY_PEAK = cell([2.0, 3.0, 2.0, 1.9, 2.1, 1.9, 2.0, 1.8, 2.0], [0.6, 0.9, 0.6, 0.55, 0.6, 0.5, 0.6, 0.55, 0.6])
PLANTED = cell([2.0, 2.1, 1.9, 0.9, 0.6, 0.5, 0.5, 0.5, 0.5], [0.6, 0.6, 0.6, 0.3, 0.2, 0.2, 0.2, 0.2, 0.2],
               strength=0.5, plant=15)
LATE = cell([2.0, 2.1, 1.9, 2.0, 2.0, 0.6, 0.5, 0.5, 0.5], [0.6, 0.6, 0.6, 0.6, 0.6, 0.2, 0.2, 0.2, 0.2],
            strength=0.5, plant=15)


def test_the_replay_is_the_training_time_alert() -> None:
    rule = LEGACY_RULE.model_copy(update={"drop_fraction": 0.4})
    detector = CollapseAlert(rule)
    for step, mi, acc in zip(PLANTED.steps, PLANTED.mi, PLANTED.acc, strict=True):
        detector.update(int(step), mi, acc, CHANCE, 0.5)
    assert ac.replay(rule, PLANTED) == detector.alert_step == 20


def test_a_noisy_peak_fires_the_peak_rule_but_not_the_baseline_rule() -> None:
    # one high point at step 5 makes every later point 'fallen' against the running peak, not against the early mean
    peak = LEGACY_RULE
    baseline = LEGACY_RULE.model_copy(update={"reference": "baseline"})
    assert ac.replay(peak, NOISY_PEAK) is not None
    assert ac.replay(baseline, NOISY_PEAK) is None
    assert ac.replay(baseline, PLANTED) == 20


def test_honest_collapse_is_read_from_success_or_format_only() -> None:
    assert not ac.collapsed(FLAT)
    assert ac.collapsed(cell([2.0] * 9, [0.6] * 9, val=(0.4, 0.5, 0.2)))  # success halved, first to last
    assert not ac.collapsed(cell([2.0] * 9, [0.6] * 9, val=(0.4, 0.5, 0.21)))
    assert ac.collapsed(cell([2.0] * 9, [0.6] * 9, fmt=(1.0, 0.8)))  # format validity down 0.2
    assert not ac.collapsed(cell([0.1] * 9, [0.1] * 9))  # MI alone says nothing here


def test_rates_count_false_alarms_detections_and_late_firings() -> None:
    rule = LEGACY_RULE
    collapsed = cell([2.0, 3.0, 1.0, 1.0, 1.0], [0.6, 0.9, 0.3, 0.3, 0.3], val=(0.5, 0.1))
    record = ac.rates(rule, [FLAT, NOISY_PEAK, collapsed, PLANTED, LATE])
    # NOISY_PEAK fired; the collapsed run is set apart; the two plants were watched (the running-peak rule could
    # fire at step 10) without firing before their plant
    assert (record.false_alarms, record.honest) == (1, 4)
    assert record.watched_steps == 40 + 40 + 14 + 14
    assert (record.detected, record.strong) == (1, 2)  # LATE fired at 30: 15 steps after the plant
    assert record.delays == [5]
    assert record.by_strength == {0.5: (1, 2)}
    assert "false alarms 1/4 (25%" in record.text() and "1/2" in record.text()


def test_choose_on_one_half_report_on_the_other() -> None:
    even = [FLAT, NOISY_PEAK, PLANTED]
    # the odd half is not a copy of the even one: a run whose dip fires the rule the even half picks (a false alarm
    # only the held-out rates can show) and a plant found 15 steps late
    dip = cell([2.0, 2.1, 1.9, 2.0, 0.2, 0.2, 0.2, 2.0, 2.0], [0.6, 0.6, 0.6, 0.6, 0.1, 0.1, 0.1, 0.6, 0.6], seed=1)
    odd = [ac.Cell(**{**FLAT.__dict__, "seed": 1}), dip, ac.Cell(**{**LATE.__dict__, "seed": 3})]
    chosen_on, held_out = ac.split(even + odd)
    assert all(c.seed % 2 == 0 for c in chosen_on) and all(c.seed % 2 for c in held_out)
    rule, record = ac.choose(chosen_on)
    assert record.meets_target()  # no false alarm on FLAT or NOISY_PEAK, the plant found within 5 steps
    assert ac.replay(rule, dip) is not None  # the chosen rule is not fitted to the held-out half
    held = ac.rates(rule, held_out)
    assert (held.false_alarms, held.detected, held.strong) == (1, 0, 1) and held.honest >= 2
    assert not held.meets_target()
    assert ac.replay(LEGACY_RULE, NOISY_PEAK) is not None  # the old rule fails the same runs


def test_a_firing_before_the_plant_is_a_false_alarm_in_rates_choice_and_roc() -> None:
    # planted at 15, but the series already fell at step 10: the running-peak rule with patience 1 fires there
    early = cell([2.0, 2.1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], [0.6, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1],
                 strength=1.0, plant=15)
    eager = LEGACY_RULE.model_copy(update={"patience": 1, "success_tolerance": 1.0})
    assert ac.replay(eager, early) == 10
    record = ac.rates(eager, [FLAT, early])
    assert (record.false_alarms, record.honest) == (1, 2)  # the planted run counts, before its plant, as watched
    assert (record.detected, record.strong) == (0, 1)
    assert record.watched_steps == 40 + 14  # FLAT's 40 steps and the plant's 14 before it
    assert record.per_100_steps == pytest.approx(100 / 54)
    # a rule that cannot fire before the plant (an early mean of 3 computations: first at step 15) does not count
    # the planted run among the runs watched
    patient = CollapseRule()
    assert ac.replay(patient, early) == 15  # the early mean holds the fall: fires at the plant, a detection
    assert (ac.rates(patient, [FLAT, early]).honest, ac.rates(patient, [FLAT, early]).watched_steps) == (1, 40)
    # the choice sees the early firing: between the two, on these runs, it takes the rule without it
    chosen, _ = ac.choose([FLAT, early, PLANTED], [eager, patient])
    assert chosen == patient
    [(_, point)] = ac.frontier([FLAT, early], [eager])  # the ROC reads the same rates
    assert (point.false_alarms, point.honest) == (1, 2)
    assert "per 100 steps" in ac.roc_frame([FLAT, early], shipped=patient).columns


def test_the_frontier_is_monotone_and_marks_the_shipped_rule() -> None:
    cells = [FLAT, NOISY_PEAK, PLANTED, LATE]
    kept = ac.frontier(cells)
    fa = [r.false_alarm_rate for _, r in kept]
    detection = [r.detection_rate for _, r in kept]
    assert fa == sorted(fa) and detection == sorted(detection) and len(set(detection)) == len(detection)
    table = ac.roc_frame(cells, shipped=LEGACY_RULE)
    assert table["rule"].str.startswith("[shipped]").sum() == 1
    assert "strength 0.5" in table.columns


def _run_data(rule: CollapseRule) -> RunData:
    runs = pd.DataFrame([{"run_id": "r1", "tags.orch.role": "cell", "tags.task": "frozenlake", "tags.seed": "0",
                          "params.filter.name": "none", "status": "FINISHED",
                          **{f"params.diagnostics.rule.{k}": str(v) for k, v in rule.model_dump().items()}}])
    rows = []
    for step, mi, acc in zip(PLANTED.steps, PLANTED.mi, PLANTED.acc, strict=True):
        rows += [("r1", names.MI_ZSCORE_EMA, step, mi), ("r1", names.RETRIEVAL_ACC, step, acc),
                 ("r1", names.RETRIEVAL_CHANCE, step, CHANCE), ("r1", ac.ROLLOUT_SUCCESS, step, 0.5)]
    metrics = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"]).assign(timestamp=0)
    return RunData(runs=runs, metrics=metrics, tracking_uri="none", reader="archive")


def test_cells_and_rules_are_read_back_from_logged_runs() -> None:
    rule = CollapseRule(drop_fraction=0.5, patience=1, signals="retrieval", reference="baseline")
    data = _run_data(rule)
    [found] = ac.cells_from(data, "s")
    assert found.rule == rule and not found.planted  # no control params: an unplanted run
    assert np.array_equal(found.mi, PLANTED.mi) and found.success == [0.5] * 9
    assert ac.rules_used(data) == [rule]


@pytest.mark.parametrize("rule, where", [(LEGACY_RULE, "the rule before the offline choice"),
                                         (LEGACY_RULE.model_copy(update={"drop_fraction": 0.45}), "no measured error rates")])
def test_alert_lines_say_the_rates_of_the_rule_the_runs_used(rule: CollapseRule, where: str) -> None:
    entry = ac.rates_record(ac.rates(LEGACY_RULE, [FLAT, NOISY_PEAK, PLANTED]))
    record = {"rule": LEGACY_RULE.model_copy(update={"drop_fraction": 0.6}).model_dump(), "held_out": entry,
              "legacy": {"rule": LEGACY_RULE.model_dump(), "all": entry}, "sources": ["docs/results/x (3 runs)"],
              "source": "python benchmarks/bench_collapse_alert.py --record"}
    [line] = ac.alert_lines([rule], record)
    assert where in line
    if rule == LEGACY_RULE:
        assert "false alarms 1/3" in line and "docs/results/x (3 runs)" in line  # PLANTED watched before its plant
    assert "no measured error rates are recorded" in ac.alert_lines([rule], {})[0]


def test_a_run_older_than_the_new_keys_is_read_as_the_legacy_rule() -> None:
    data = _run_data(LEGACY_RULE)
    runs = data.runs.drop(columns=["params.diagnostics.rule.signals", "params.diagnostics.rule.reference"])
    old = RunData(runs=runs, metrics=data.metrics, tracking_uri="none", reader="archive")
    assert ac.rules_used(old) == [LEGACY_RULE] != [CollapseRule()]
    assert ac.cells_from(old, "s")[0].rule == LEGACY_RULE


# The drift guards: the shipped default is what the procedure picks on the archived runs, and the recorded rates
# are what the bench computes from them (recipes/stats/collapse_alert_rates.yaml; benchmarks/bench_collapse_alert.py --record).
RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"


@pytest.fixture(scope="module")
def archived() -> tuple[list[ac.Cell], list[str]]:
    return ac.archived_cells(RESULTS)


def test_the_even_seeds_choose_the_shipped_default(archived) -> None:
    cells, _ = archived
    chosen_on, _ = ac.split(cells)
    chosen, _ = ac.choose(chosen_on)
    assert chosen == CollapseRule(), (f"the even seeds choose {ac.rule_text(chosen)}: a new default is a deliberate "
                                      "identity change (docs/diagnostics.md#the-collapse-alerts-error-rates)")


def test_the_recorded_rates_are_what_the_bench_computes_from_the_archives(archived) -> None:
    cells, sources = archived
    recorded = {key: value for key, value in ac.load_record().items() if key != "source"}
    assert recorded == ac.make_record(cells, sources), "re-record: python benchmarks/bench_collapse_alert.py --record"
    assert ac.replay_fidelity(cells) == (len(cells), len(cells))


def test_record_writes_into_the_checkout_it_ran_from_and_not_before_it_can_fail(tmp_path: Path) -> None:
    bench = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_collapse_alert.py"
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(bench, tmp_path / "benchmarks")
    (tmp_path / "recipes" / "stats").mkdir(parents=True)
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "repro_long").symlink_to(RESULTS / "repro_long")
    before = ac.RECORD.read_bytes()
    script = str(tmp_path / "benchmarks" / "bench_collapse_alert.py")
    failed = subprocess.run([sys.executable, script, "--record", "--live", "nonsense"], capture_output=True,
                            text=True, timeout=120)
    assert failed.returncode != 0 and "SWEEP=URI" in failed.stderr
    assert not (tmp_path / "recipes" / "stats" / "collapse_alert_rates.yaml").exists()
    done = subprocess.run([sys.executable, script, "--record"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    written = yaml.safe_load((tmp_path / "recipes" / "stats" / "collapse_alert_rates.yaml").read_text())
    assert written["sources"] == ["docs/results/repro_long (20 runs)"]
    assert ac.RECORD.read_bytes() == before  # the installed module's copy is untouched


def test_fired_text_says_whether_where_and_on_which_side_of_successs_decline() -> None:
    data = _run_data(CollapseRule())
    leads = pd.DataFrame({"run_id": ["r1", "r2", "r3"], "alert_step": [20.0, 20.0, None],
                          "alert_lead_steps": [-10.0, -10.0, None]})
    text = ac.fired_text(data, leads)
    assert text.startswith("The collapse alert (collapse/alert) fired in 2 of 3 runs (first at step 20; by step: "
                           "20 in 2 runs)")
    assert "a median 10 steps after success declined (2 runs where both)" in text  # a negative lead: after
    none = leads.assign(alert_step=None, alert_lead_steps=None)
    assert ac.fired_text(data, none) == "The collapse alert (collapse/alert) fired in none of the 3 runs."


def test_alert_summary_says_the_alert_did_not_run_without_mi() -> None:
    """Runs without the collapse hook log success but no MI: the alert never watched them, so the terminal report
    must not say it "fired in none" of them (a predictor-grid sweep runs without the hook)."""
    data = _run_data(CollapseRule())
    watched = ac.alert_summary(data)
    assert watched[0].startswith("The collapse alert (collapse/alert) fired in")
    no_mi = data.metrics[data.metrics["key"] != names.MI_ZSCORE_EMA]
    success = no_mi[no_mi["key"] == ac.ROLLOUT_SUCCESS].assign(key=names.VAL_SUCCESS)
    blind = RunData(runs=data.runs, metrics=pd.concat([no_mi, success]), tracking_uri="none", reader="archive")
    assert ac.alert_summary(blind) == ["The collapse alert (collapse/alert) did not run: none of the 1 runs logged "
                                       f"{names.MI_ZSCORE_EMA} (the collapse hook, hooks=[collapse])."]
