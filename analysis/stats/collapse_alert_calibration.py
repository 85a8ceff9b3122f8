"""The collapse alert's error rates, measured offline: replay candidate rules over logged runs whose answer is known.

Every run with the `collapse` hook logs what the online rule (:class:`recipes.stats.collapse_alert.CollapseAlert`) reads
at each MI computation -- MI-ZScore-EMA, retrieval accuracy and its chance level, the success it was given -- so any
rule can be replayed over the archive afterwards, exactly as it would have run (:func:`replay`; the replay of the
rule a run used reproduces its logged `collapse/alert`, which :func:`replay_fidelity` checks).

Two kinds of runs carry known answers:

* **planted** (`control.blind_strength` > 0 from `control.blind_from_step`, sweeps/controls_graded.yaml): a share of
  each step's replies is generated from one fixed chat. A rule *detects* the plant when it fires at the plant's step
  or within :data:`DETECTION_WINDOW` steps after it. A firing before the plant is a *false alarm*: up to its plant a
  planted run is an honest one, and it counts among the runs watched with nothing to detect whenever the rule could
  fire before the plant (:meth:`CollapseRule.settled` at a computation before it; the shipped rule, which needs an
  early mean of 3 computations at steps 1, 5 and 10, first can at step 15, the plant's step);
* **honest** (no plant, or strength 0): a rule's firing is a *false alarm* unless the run collapsed by a measure that
  does not read MI (:func:`collapsed`: validation success fell to half its first value or less, or validation format
  validity fell by :data:`FORMAT_MARGIN` or more, first validation to last). Honest runs that did collapse are listed
  apart; they are neither false alarms nor detections.

:func:`choose` picks a rule on one half of the runs (even seeds) and :func:`rates` reports it on the other (odd
seeds), so the reported rates are not those the choice was fitted to. The target (issue 46): false alarms in at most
10% of the runs watched with nothing to detect, detection within 5 steps in at least 90% of runs planted at strength
>= 0.5. Runs differ in length (40 or 100 steps, a plant's 14 before it), so false alarms are also counted per 100
steps watched with nothing to detect (:attr:`Rates.per_100_steps`); :func:`choose` breaks ties on it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis import names
from analysis.stats.verdicts import wilson
from recipes.stats.collapse_alert import RATES, CollapseAlert, CollapseRule, recorded_rates, rule_text

__all__ = ["RECORD", "rule_text"]  # rule_text lives beside the rule (recipes.stats.collapse_alert); re-exported here

if TYPE_CHECKING:
    from analysis.stores.mlflow_store import RunData

DETECTION_WINDOW = 5  # steps after the plant's first step within which a firing counts as a detection
STRONG = 0.5  # plants at or above this strength are the ones the detection target is about
SUCCESS_FALL = 0.5  # honest collapse: last validation success at most this share of the first
FORMAT_MARGIN = 0.2  # honest collapse: validation format validity down this much, first to last
FALSE_ALARM_TARGET = 0.10
DETECTION_TARGET = 0.90
ROLLOUT_SUCCESS = "rollout/success_rate"


@dataclass(frozen=True)
class Cell:
    """One logged run, reduced to what the rule reads and what the answer is."""

    sweep: str
    task: str
    seed: int
    arm: str  # the filter, or "none"
    strength: float  # 0: nothing planted
    plant_step: int | None  # the plant's first step (None: nothing planted)
    steps: np.ndarray  # steps of the MI computations
    mi: np.ndarray  # MI-ZScore-EMA at each
    acc: np.ndarray  # retrieval accuracy
    chance: np.ndarray  # its chance level
    success: list[float | None]  # the success the online rule was given at each (validation, else rollout)
    val_success: np.ndarray  # validation success, in step order
    val_format: np.ndarray  # validation format validity, in step order
    logged_alert: int | None  # the step the run's own collapse alert fired at
    rule: CollapseRule = field(default_factory=CollapseRule)  # the rule the run used

    @property
    def planted(self) -> bool:
        return self.plant_step is not None

    @property
    def label(self) -> str:
        plant = f" strength {self.strength:g}" if self.planted else ""
        return f"{self.sweep} {self.task} {self.arm} seed {self.seed}{plant}"


def collapsed(cell: Cell) -> bool:
    """Whether an honest run collapsed by a measure that does not read MI (the module docstring)."""
    fell = len(cell.val_success) >= 2 and cell.val_success[-1] <= SUCCESS_FALL * cell.val_success[0]
    broke = len(cell.val_format) >= 2 and cell.val_format[0] - cell.val_format[-1] >= FORMAT_MARGIN - 1e-9
    return bool(fell or broke)


def _series(series: dict, run_id: str) -> tuple[np.ndarray, np.ndarray]:
    """One run's (steps, values) in step order, from ``RunData.series`` (copies: a cell keeps them)."""
    steps, values = series.get(run_id, (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)))
    return steps.copy(), values.copy()


def _number(row, key: str, default: float) -> float:
    value = row.get(key)
    try:
        return default if value is None or value != value else float(value)
    except (TypeError, ValueError):
        return default


def _fed_success(step: int, val_steps: np.ndarray, val: np.ndarray, rollout: dict[int, float]) -> float | None:
    """The success the online rule read at ``step``: the latest validation, which runs at a step's end (so one of an
    earlier step), else the step's own rollout success (`recipes.diagnostics.collapse_hook`)."""
    earlier = np.flatnonzero(val_steps < step)
    return float(val[earlier[-1]]) if len(earlier) else rollout.get(step)


def _rule_of(row) -> CollapseRule:
    """The rule a run logged in its params; a key it predates takes the value that reproduces the rule before it."""
    values = dict(CollapseRule.late_keys)
    for key, kind in CollapseRule.model_fields.items():
        value = row.get(f"params.diagnostics.rule.{key}")
        if value is not None and value == value:
            values[key] = value if kind.annotation is not int and kind.annotation is not float else kind.annotation(
                float(value))
    return CollapseRule(**values)


def _cell_runs(data: RunData):
    """The runs of ``data`` that are a sweep's cells (a sweep's parent run is not)."""
    runs = data.runs
    return runs[runs["tags.orch.role"] == "cell"] if "tags.orch.role" in runs.columns else runs


def cells_from(data: RunData, sweep: str) -> list[Cell]:
    """The cells of ``data`` (one sweep's runs) that computed MI, as :class:`Cell` rows."""
    runs = _cell_runs(data)
    keys = (names.MI_ZSCORE_EMA, names.RETRIEVAL_ACC, names.RETRIEVAL_CHANCE, names.VAL_SUCCESS,
            names.VAL_FORMAT_VALID, ROLLOUT_SUCCESS, names.COLLAPSE_ALERT)
    history = {key: data.series(key) for key in keys}  # per run, found once (issue 60)
    cells = []
    for _, row in runs.iterrows():
        run_id = row["run_id"]
        steps, mi = _series(history[names.MI_ZSCORE_EMA], run_id)
        if not len(steps):
            continue
        acc_steps, acc = _series(history[names.RETRIEVAL_ACC], run_id)
        _, chance = _series(history[names.RETRIEVAL_CHANCE], run_id)
        if not np.array_equal(acc_steps, steps):
            continue  # a step scored one set and not the other: not the rule's input
        val_steps, val = _series(history[names.VAL_SUCCESS], run_id)
        roll_steps, roll = _series(history[ROLLOUT_SUCCESS], run_id)
        roll_at = dict(zip(roll_steps.tolist(), roll, strict=True))
        success = [_fed_success(step, val_steps, val, roll_at) for step in steps.tolist()]
        _, fmt = _series(history[names.VAL_FORMAT_VALID], run_id)
        alert_steps, alert = _series(history[names.COLLAPSE_ALERT], run_id)
        fired = alert_steps[alert >= 0.5]
        strength = _number(row, "params.control.blind_strength", 1.0)
        plant_from = int(_number(row, "params.control.blind_from_step", 0))
        planted = plant_from > 0 and strength > 0
        cells.append(Cell(
            sweep=sweep, task=str(row.get("tags.task")), seed=int(_number(row, "tags.seed", 0)),
            arm=str(row.get("params.filter.name") or "none"), strength=strength if plant_from > 0 else 0.0,
            plant_step=plant_from if planted else None, steps=steps, mi=mi, acc=acc, chance=chance,
            success=[None if s is None else float(s) for s in success], val_success=val, val_format=fmt,
            logged_alert=int(fired[0]) if len(fired) else None, rule=_rule_of(row)))
    return cells


def replay(rule: CollapseRule, cell: Cell) -> int | None:
    """The step at which ``rule`` fires on the cell's logged series, as the training-time alert would (None: never)."""
    alert = CollapseAlert(rule)
    for step, mi, acc, chance, success in zip(cell.steps, cell.mi, cell.acc, cell.chance, cell.success,
                                              strict=True):
        if np.isnan(mi) or np.isnan(acc):
            continue  # a step whose sample set was empty logs no proxies and feeds the alert nothing
        alert.update(int(step), float(mi), float(acc), float(chance), success)
    return alert.alert_step


def replay_fidelity(cells: list[Cell]) -> tuple[int, int]:
    """(runs whose own rule, replayed, fires at the step the run logged, runs checked)."""
    same = sum(replay(cell.rule, cell) == cell.logged_alert for cell in cells)
    return same, len(cells)


@dataclass(frozen=True)
class Rates:
    """A rule's record on a set of cells."""

    false_alarms: int  # fired in an honest cell, or in a planted cell before its plant
    honest: int  # cells watched with nothing to detect: honest ones without an MI-independent collapse, and planted
    # ones the rule could fire in before the plant
    detected: int  # planted at >= STRONG, fired within the window
    strong: int
    by_strength: dict[float, tuple[int, int]]  # strength -> (detected within the window, planted)
    delays: list[int]  # steps from the plant to the firing, detected strong cells
    watched_steps: int = 0  # training steps of those cells with nothing to detect (a planted cell's before its plant)

    @property
    def false_alarm_rate(self) -> float:
        return self.false_alarms / self.honest if self.honest else float("nan")

    @property
    def per_100_steps(self) -> float:
        """False alarms per 100 training steps watched with nothing to detect."""
        return 100 * self.false_alarms / self.watched_steps if self.watched_steps else float("nan")

    @property
    def detection_rate(self) -> float:
        return self.detected / self.strong if self.strong else float("nan")

    def meets_target(self) -> bool:
        return self.false_alarm_rate <= FALSE_ALARM_TARGET and self.detection_rate >= DETECTION_TARGET

    def text(self) -> str:
        """`false alarms 1/20 (5%, 95% CI 1-24%); detection within 5 steps at strength >= 0.5: 7/8 (...)`."""
        per_step = f", {self.per_100_steps:.2f} per 100 steps" if self.watched_steps else ""
        return (f"false alarms {_share(self.false_alarms, self.honest)} of runs with nothing to detect (honest runs "
                f"without a collapse, planted ones before the plant){per_step}; detection within {DETECTION_WINDOW} "
                f"steps at strength >= {STRONG:g}: {_share(self.detected, self.strong)}")


def _share(hits: int, n: int) -> str:
    if not n:
        return "n = 0"
    lo, hi = wilson(hits, n)
    return f"{hits}/{n} ({hits / n:.0%}, 95% CI {lo:.0%}-{hi:.0%})"


def rates(rule: CollapseRule, cells: list[Cell]) -> Rates:
    """``rule``'s false alarms on the honest cells and detections on the planted ones (the module docstring)."""
    false_alarms = honest = detected = strong = watched = 0
    by_strength: dict[float, list[int]] = {}
    delays: list[int] = []
    for cell in cells:
        fired = replay(rule, cell)
        if not cell.planted:
            if collapsed(cell):
                continue
            honest += 1
            watched += int(cell.steps[-1]) if len(cell.steps) else 0
            false_alarms += fired is not None
            continue
        before = int(np.count_nonzero(cell.steps < cell.plant_step))
        if rule.settled(before):  # the rule could fire before the plant: a run watched with nothing to detect
            honest += 1
            watched += cell.plant_step - 1
            false_alarms += fired is not None and fired < cell.plant_step
        hit = fired is not None and cell.plant_step <= fired <= cell.plant_step + DETECTION_WINDOW
        tally = by_strength.setdefault(cell.strength, [0, 0])
        tally[0] += hit
        tally[1] += 1
        if cell.strength >= STRONG:
            strong += 1
            detected += hit
            if hit:
                delays.append(fired - cell.plant_step)
    return Rates(false_alarms, honest, detected, strong, {k: (v[0], v[1]) for k, v in sorted(by_strength.items())},
                 delays, watched)


def candidate_rules() -> list[CollapseRule]:
    """The rules replayed: which signals, against which reference, how far a fall, how many computations in a row,
    the success guard on or off."""
    grid = itertools.product(("both", "mi", "retrieval", "either"), ("peak", "baseline"),
                             (0.2, 0.3, 0.4, 0.5, 0.6, 0.7), (1, 2, 3), (0.05, 1.0))
    return [CollapseRule(signals=signals, reference=reference, drop_fraction=drop, patience=patience,
                         success_tolerance=tolerance)
            for signals, reference, drop, patience, tolerance in grid]


def split(cells: list[Cell]) -> tuple[list[Cell], list[Cell]]:
    """(the cells a rule is chosen on: even seeds, the cells it is reported on: odd seeds)."""
    return [c for c in cells if c.seed % 2 == 0], [c for c in cells if c.seed % 2 == 1]


def _score(record: Rates) -> tuple:
    """Order of preference: meets the false-alarm target, then detects most, then fewest false alarms per 100 steps
    watched (runs watched differ in length: a planted run's 14 steps before its plant against an honest run's 100)."""
    fa = record.false_alarm_rate if record.honest else 1.0
    detection = record.detection_rate if record.strong else 0.0
    per_step = record.per_100_steps if record.watched_steps else float("inf")
    return (fa <= FALSE_ALARM_TARGET, detection, -per_step)


def choose(cells: list[Cell], rules: list[CollapseRule] | None = None) -> tuple[CollapseRule, Rates]:
    """The best rule on ``cells`` by :func:`_score` (ties: the earlier in ``rules``, i.e. the simpler grid point)."""
    rules = candidate_rules() if rules is None else rules
    best = max(((rule, rates(rule, cells)) for rule in rules), key=lambda pair: _score(pair[1]))
    return best


def frontier(cells: list[Cell], rules: list[CollapseRule] | None = None) -> list[tuple[CollapseRule, Rates]]:
    """The ROC frontier: the rules no other beats on both false alarms and detection (fewest false alarms per 100
    steps watched first, which compares rules whose runs watched differ in length -- a running-peak rule also watches
    the planted runs' short windows before their plants; of equal rules the earlier in ``rules``)."""
    scored = [(rule, rates(rule, cells)) for rule in (candidate_rules() if rules is None else rules)]
    kept: list[tuple[CollapseRule, Rates]] = []
    for rule, record in sorted(scored, key=lambda pair: (pair[1].per_100_steps, pair[1].false_alarm_rate,
                                                           -pair[1].detection_rate)):
        if all(record.detection_rate > other.detection_rate for _, other in kept):
            kept.append((rule, record))
    return kept


def roc_frame(cells: list[Cell], shipped: CollapseRule | None = None):
    """The ROC table `orch report` prints for a sweep with planted cells: the frontier of :func:`frontier`, plus the
    shipped rule (``shipped``, marked) wherever it sits."""
    import pandas as pd

    shipped = CollapseRule() if shipped is None else shipped
    rows = frontier(cells)
    if all(rule != shipped for rule, _ in rows):
        rows.append((shipped, rates(shipped, cells)))
    strengths = sorted({cell.strength for cell in cells if cell.planted})
    table = []
    for rule, record in rows:
        row = {"rule": ("[shipped] " if rule == shipped else "") + rule_text(rule),
               "false alarms": f"{record.false_alarms}/{record.honest}",
               "per 100 steps": record.per_100_steps,
               f"detected (>= {STRONG:g})": f"{record.detected}/{record.strong}"}
        for strength in strengths:
            hits, n = record.by_strength.get(strength, (0, 0))
            row[f"strength {strength:g}"] = f"{hits}/{n}"
        row["median delay"] = float(np.median(record.delays)) if record.delays else float("nan")
        table.append(row)
    return pd.DataFrame(table)


def rates_record(record: Rates) -> dict:
    """``record`` as plain data for the recorded rates file."""
    return {"false_alarms": record.false_alarms, "honest": record.honest, "watched_steps": record.watched_steps,
            "detected": record.detected, "strong": record.strong,
            "by_strength": {float(k): list(v) for k, v in record.by_strength.items()}}


def rates_from_record(entry: dict) -> Rates:
    """The inverse of :func:`rates_record` (delays are not kept)."""
    return Rates(int(entry["false_alarms"]), int(entry["honest"]), int(entry["detected"]), int(entry["strong"]),
                 {float(k): (int(v[0]), int(v[1])) for k, v in (entry.get("by_strength") or {}).items()}, [],
                 int(entry.get("watched_steps") or 0))


RECORD = RATES  # recipes/stats/collapse_alert_rates.yaml: beside the rule, where the training-time alert reads it too


def archived_cells(results: Path, live: dict[str, RunData] | None = None) -> tuple[list[Cell], list[str]]:
    """The finished cells of every sweep archived under ``results`` (docs/results/: one folder per sweep, one archive
    per session inside; a sweep named in ``live`` is read from that loaded data instead) and a line per source,
    named relative to ``results``' parent."""
    import dataclasses

    from analysis.stores.archive import evidence_sessions, read_archives

    cells, sources = [], []
    for sweep_dir in sorted(path for path in results.iterdir() if path.is_dir()):
        sweep = sweep_dir.name
        if live and sweep in live:
            data, where = live[sweep], f"{sweep} (live store)"
        else:
            sessions = evidence_sessions(sweep_dir)  # the rehearsal's archives are generated data, not plants
            if not sessions:
                continue
            data, _ = read_archives(sessions, sweep)
            where = f"{results.parent.name}/{results.name}/{sweep}"
        data = dataclasses.replace(data, runs=data.runs[data.runs["status"] == "FINISHED"])  # whole runs only
        found = cells_from(data, sweep)
        cells += found
        if found:
            sources.append(f"{where} ({len(found)} runs)")
    return cells, sources


def make_record(cells: list[Cell], sources: list[str], shipped: CollapseRule | None = None) -> dict:
    """The recorded rates file's content (without its date line): the shipped rule's rates held out (odd seeds),
    over every run and per task, and the legacy rule's over every run."""
    from recipes.stats.collapse_alert import LEGACY_RULE

    shipped = CollapseRule() if shipped is None else shipped
    _, held_out = split(cells)
    return {
        "rule": shipped.model_dump(),
        "held_out": rates_record(rates(shipped, held_out)),
        "all": rates_record(rates(shipped, cells)),
        "legacy": {"rule": LEGACY_RULE.model_dump(), "all": rates_record(rates(LEGACY_RULE, cells))},
        "by_task": {task: rates_record(rates(shipped, [c for c in cells if c.task == task]))
                    for task in sorted({c.task for c in cells})},
        "controls": controls_record(cells, shipped),
        # the decline rule dates whole runs: its rate over the honest runs (a plant's one computation before it
        # would dilute a per-run rate)
        "decline": {"rule": decline_rule().model_dump(),
                    "all": rates_record(rates(decline_rule(), [c for c in cells if not c.planted]))},
        "sources": sources,
    }


def decline_rule() -> CollapseRule:
    """The rule `analysis.stats.early_warning` dates a series' decline with (its ``DEFAULT_RULE``'s drop, patience, points
    and reference), as an alert on MI-ZScore-EMA alone without a success guard: what `decline_onset` reads of the MI
    series. Its replayed rates (the record's ``decline``) are how often "MI declined" is said of runs with nothing to
    detect."""
    from analysis.stats.early_warning import DEFAULT_RULE

    return DEFAULT_RULE.model_copy(update={"signals": "mi", "success_tolerance": 1.0})


def decline_rates(record: dict | None = None) -> Rates | None:
    """The decline rule's recorded rates over every calibration run (None when not recorded)."""
    record = load_record() if record is None else record
    entry = (record.get("decline") or {}).get("all")
    return rates_from_record(entry) if entry else None


CONTROL_SWEEP = "controls_graded"  # the archived sweep whose total plants and strength-0 runs are the controls


def controls_record(cells: list[Cell], rule: CollapseRule) -> dict[str, dict]:
    """Per task, the MI instrument's controls (`analysis.stats.controls`) re-derived from archived runs under ``rule``:
    the total plants (strength 1) of :data:`CONTROL_SWEEP` detected within the window, and its strength-0 runs
    (nothing planted; those that collapsed by success or format set apart, as in :func:`rates`) that fired."""
    entries = {}
    for task in sorted({c.task for c in cells if c.sweep == CONTROL_SWEEP}):
        runs = [c for c in cells if c.sweep == CONTROL_SWEEP and c.task == task and c.strength in (0.0, 1.0)]
        record = rates(rule, runs)
        planted = [c for c in runs if c.planted]
        if not planted:
            continue
        negative = [c for c in runs if not c.planted]
        kept = [c for c in negative if not collapsed(c)]
        plant = planted[0]
        entries[task] = {
            "detected": record.detected, "planted": record.strong,
            "false_alarms": sum(replay(rule, c) is not None for c in kept), "negative": len(kept),
            "setting": (f"the shipped alert rule replayed over archived runs of sweeps/{CONTROL_SWEEP}.yaml: "
                        f"{len(planted)} with every row blinded from step {plant.plant_step}, {len(negative)} with "
                        f"nothing planted ({len(negative) - sum(not collapsed(c) for c in negative)} of them set "
                        f"apart: success or format collapsed), {int(plant.steps[-1])} steps, detection within "
                        f"{DETECTION_WINDOW} steps of the plant"),
            "source": f"docs/results/{CONTROL_SWEEP}, python benchmarks/bench_collapse_alert.py --record",
        }
    return entries


def load_record(path: Path = RECORD) -> dict:
    """The recorded rates of the shipped rule ({} when none are recorded)."""
    return recorded_rates(path)


def alert_lines(used: list[CollapseRule], record: dict | None = None) -> list[str]:
    """What a report prints beside the collapse alert: the measured error rates of the rule the runs used, with
    their source (the recorded shipped rule's, or the legacy rule's when the runs used that one)."""
    record = load_record() if record is None else record
    if not record:
        return ["collapse alert: no measured error rates are recorded (python benchmarks/bench_collapse_alert.py "
                "--record); read its firings as unvalidated"]
    shipped = CollapseRule(**record["rule"])
    legacy = CollapseRule(**record["legacy"]["rule"])
    lines = []
    for rule in sorted(set(used), key=rule_text):
        if rule == shipped:
            measured = rates_from_record(record["held_out"])
            where = "on runs held out from its choice"
        elif rule == legacy:
            measured = rates_from_record(record["legacy"]["all"])
            where = "the rule before the offline choice, replayed over the same runs"
        else:
            lines.append(f"collapse alert ({rule_text(rule)}): a rule with no measured error rates; replay it with "
                         "analysis.stats.collapse_alert_calibration to get them")
            continue
        lines.append(f"collapse alert ({rule_text(rule)}), measured {where}: {measured.text()} "
                     f"({'; '.join(record.get('sources', []))}; {record.get('source', '')})")
    return lines


def fired_text(data: RunData, leads) -> str:
    """Whether the trainer's collapse alert fired in the runs of ``leads`` (:func:`analysis.stats.early_warning.
    early_warning`'s rows), and where: the step of each firing (the metric's history, else the run's
    `collapse_alert_step` tag), with the median lead over success's decline where both happened."""
    import pandas as pd

    alerts = leads["alert_step"].copy()
    column = f"tags.{names.TAG_COLLAPSE_ALERT_STEP}"
    if column in data.runs.columns:  # runs whose metric history lacks the alert but whose tag has it
        tagged = data.runs.set_index("run_id")[column].reindex(leads["run_id"]).to_numpy()
        alerts = alerts.fillna(pd.Series(pd.to_numeric(tagged, errors="coerce"), index=leads.index).round())
    fired = alerts.dropna()
    n = len(leads)
    if not len(fired):
        return f"The collapse alert ({names.COLLAPSE_ALERT}) fired in none of the {n} runs."
    at = pd.Series(fired.astype(int)).value_counts().sort_index()
    where = ", ".join(f"{step} in {count} run{'s' if count > 1 else ''}" for step, count in at.items())
    text = (f"The collapse alert ({names.COLLAPSE_ALERT}) fired in {len(fired)} of {n} runs (first at step "
            f"{int(fired.min())}; by step: {where})")
    warned = leads["alert_lead_steps"].dropna()
    if len(warned):
        median = float(warned.median())
        when = "before" if median >= 0 else "after"  # the lead is success's decline step minus the alert's
        return text + f", a median {abs(median):.0f} steps {when} success declined ({len(warned)} runs where both)."
    return text + "."


def alert_summary(data: RunData) -> list[str]:
    """For the terminal `orch report`: whether the alert fired, where, and its measured rates (:func:`fired_text`
    over every run that logged the MI diagnostics, then :func:`alert_lines`); [] when no run did."""
    from analysis.stats.early_warning import early_warning

    leads = early_warning(data)
    watched = leads[leads["mi_peak_step"].notna()]  # the alert reads MI: a run without it was never watched
    if watched.empty:
        if leads.empty:
            return []
        return [f"The collapse alert ({names.COLLAPSE_ALERT}) did not run: none of the {len(leads)} runs logged "
                f"{names.MI_ZSCORE_EMA} (the collapse hook, hooks=[collapse])."]
    return [fired_text(data, watched), *alert_lines(rules_used(data) or [CollapseRule()])]


def rules_used(data: RunData) -> list[CollapseRule]:
    """The distinct rules the runs of ``data`` ran the alert with (from their params)."""
    runs = _cell_runs(data)
    key = "params.diagnostics.rule.drop_fraction"
    if key not in runs.columns:
        return []
    return list({_rule_of(row) for _, row in runs[runs[key].notna()].iterrows()})


def decline_rule_line(record: dict | None = None, brief: bool = False) -> str:
    """The decline rule in words, beside every ordering verdict (issue 56): which rule dates the declines, why it is
    not the alert's shipped rule, and how often it says "MI declined" of runs with nothing to detect
    (:func:`decline_rates`: the rule replayed on MI-ZScore-EMA alone over the calibration runs)."""
    from analysis.stats.early_warning import DEFAULT_RULE

    rule = (f"a series at or below {1 - DEFAULT_RULE.drop_fraction:.0%} of its running peak on "
            f"{DEFAULT_RULE.patience} logged points in a row")
    rates = decline_rates(record)
    if brief:
        share = (f": on MI it fires in {rates.false_alarms}/{rates.honest} calibration runs with nothing to detect"
                 if rates else "")
        return f"declines dated by the legacy rule ({rule}){share}"
    text = (f"Declines are dated by the collapse alert's legacy rule ({rule}; recipes.stats.collapse_alert.LEGACY_RULE), "
            "applied to MI and to success on their own: the findings were declared with it, so it stays theirs; the "
            "alert now ships another rule, chosen offline (issue 46)")
    if rates:
        text += (f". On MI-ZScore-EMA it says \"declined\" in {_share(rates.false_alarms, rates.honest)} of the "
                 "calibration runs with nothing to detect (recipes/stats/collapse_alert_rates.yaml, decline): a decline it "
                 "dates may be noise")
    return text + "."
