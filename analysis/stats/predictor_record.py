"""The Std(RV)/Mean(RV) predictor's own hit rate, held out: how often its verdict (:mod:`analysis.stats.predictor`) matched
the filter gain orch measured, over every archived sweep with both filter arms (``docs/results/<sweep>/<session>/``).
The paper's three reference points cannot take part: the shipped thresholds were set on them.

The rule below was declared before any number of the predictor grid (``sweeps/predictor_grid.yaml``) was looked at.

**Conditions.** A *condition* is a (sweep, task, variant) with one filter setting: the predictor's reading of its
baseline (filter-off) runs' rollout batches against its *filter gain*, filter-on minus filter-off final validation
success in points over seeds, with its 95% bootstrap interval (:func:`analysis.stats.science.filter_effect`).

**Readings.** The predictor reads, per baseline run, its first dumped batch (``first``) and, separately, the mean
ratio over its first :data:`EARLY_BATCHES` dumped batches (``first3``), each with RV as the variance (``var``, the
paper's text and the CLI's default) and as the standard deviation (``std``, the score the trainer's filter ranks by):
four readings, :data:`READINGS`; a condition's reading is the mean over its baseline runs (a batch whose every prompt
has zero variance has no ratio; the verdict of a condition without any ratio is *unlikely to help*). An archive
written before a reading existed (``repro_long``: the first batch's var ratio only) lacks it: the condition is left
out of that reading, never guessed.

**A hit.** With :data:`DELTA` = 5 points, the smallest filter gain of interest at this scale (FrozenLake validates on
32 fixed seeds, one episode = 3.1 points; the paper's FrozenLake hurt was about 5), a measured gain is
(:func:`analysis.stats.predictor.gain_class`, sides as :func:`analysis.stats.verdicts.side`):

* *helped* -- its interval lies above 0 (a demonstrable gain, however small);
* *fell short* -- not above 0, and below :data:`DELTA` (any gain is demonstrably less than 5 points: harm, none,
  or too little to matter);
* *unsettled* -- the interval spans both 0 and :data:`DELTA`, or an arm has fewer than
  :data:`analysis.stats.verdicts.MIN_SEEDS` seeds.

*likely helps* **hits** on *helped* and **misses** on *fell short*; *unlikely to help* hits on *fell short* and misses
on *helped*; an *unsettled* gain leaves the condition **undecided**; *uncertain* makes **no call**. Every decided
condition is a hit for exactly one of the two verdicts, so a gain near zero with a tight interval (e.g. -0.6
[-3.8, +2.5]) decides: it fell short of 5 points. With ``delta`` 0 the rule is finding 4's (docs/science.md), which
keeps it. The hit rate is hits / decided with a Wilson 95% interval (:func:`analysis.stats.verdicts.wilson`); *net* is
hits - misses, the score that also charges a rule for wrong calls when rules call different numbers of conditions.

**Held out.** Conditions are split by (sweep, task, variant) -- both filter arms of one baseline stay together, since
they share its runs and its ratio -- deterministically and by name alone: the units are ordered by the SHA-256 of
``sweep/task/variant`` and alternate, the first to the *fit* half, the next to the *held-out* half (:func:`halves`).
On the fit half the thresholds and the uncertain band are refitted (:func:`fit_thresholds`: the cuts with the highest
net, ties to the cuts nearest the shipped ones; fewer than :data:`MIN_FIT` decided fit conditions keep the shipped
ones); the held-out half reports, for every reading, the shipped thresholds (set on the paper's points, so all of
orch's runs are out of sample for them) and the refitted ones. Two trivial rules are scored on the same held-out
conditions: *always likely helps*, and the first batch's zero-variance share alone with cuts fitted on the fit half
the same way. The *kept* reading (:data:`KEPT`, the CLI's default: var, first batch) and its shipped thresholds make
the line reports print (:func:`hit_rate_line`) and the words on the verdict (:func:`verdict_note`); the reading with
the best held-out net is named as *best*; a change of the default reading or of the thresholds is a deliberate,
changelogged change, never made by this module. Fewer than :data:`MIN_DECIDED` decided comparisons are too few to
recalibrate on.

The power calculation of docs/statistics.md (:func:`seeds_needed`, :func:`power_table`) reads the archives' seed-to-
seed spread of final success. The record is ``analysis/stats/predictor_record.yaml``, written by ``python
benchmarks/bench_predictor.py --record`` into the checkout the bench runs from; ``tests/analysis/
test_predictor_record.py`` checks that the file equals what the bench computes from the archives.
"""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from analysis.stats.predictor import (
    FELL_SHORT,
    HELPED,
    HIT,
    MISS,
    NO_CALL,
    UNDECIDED,
    VERDICT_HELPS,
    VERDICT_HURTS,
    PredictorThresholds,
    gain_class,
    outcome,
    verdict_for,
)
from analysis.stats.verdicts import MIN_SEEDS, wilson
from orchlib.errors import OrchError

if TYPE_CHECKING:
    import pandas as pd

RECORD = Path(__file__).with_name("predictor_record.yaml")
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
COMMAND = "python benchmarks/bench_predictor.py --record"
DOCS = "docs/statistics.md#the-predictor-tested"
DELTA = 5.0  # points: the smallest filter gain of interest (module docstring)
EARLY_BATCHES = 3  # the "first k" reading
READINGS = {"var-first": ("var", 1), "std-first": ("std", 1), f"var-first{EARLY_BATCHES}": ("var", EARLY_BATCHES),
            f"std-first{EARLY_BATCHES}": ("std", EARLY_BATCHES)}
KEPT = "var-first"  # the CLI's default: --metric var on one batch
RATIO_COLUMN = {"var": "ratio", "std": "ratio_std"}  # analysis.stores.rollout_artifacts.PREDICTION_COLUMNS
FIT, HELD_OUT = "fit", "held out"
OUTCOMES = (HIT, MISS, UNDECIDED, NO_CALL)
MIN_DECIDED = 10
MIN_FIT = 3
COUNTS = ("n", "decided", "hits", "misses", "undecided", "no_call", "against", "net")
DEFINITION = (f"a gain helped when its 95% interval lies above 0 and fell short when it lies below {DELTA:g} points "
              "without lying above 0; 'likely helps' hits on helped and misses on fell short, 'unlikely to help' the "
              f"reverse; an interval spanning 0 and {DELTA:g}, or fewer than {MIN_SEEDS} seeds per arm, leaves a "
              "condition undecided, and 'uncertain' makes no call")
LABELS = {HIT: "hits", MISS: "misses", UNDECIDED: "undecided by the data", NO_CALL: "no call (uncertain)"}


# --- conditions ------------------------------------------------------------------------------------------------

def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


EARLY_COLUMNS = {"var": "ratio_early", "std": "ratio_std_early"}


def early_columns(predictions: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its earliest predictor row (:data:`analysis.stores.rollout_artifacts.PREDICTION_COLUMNS`) with the
    mean ratios over its first :data:`EARLY_BATCHES` rows (``ratio_early``, ``ratio_std_early``; a step without a
    ratio -- every prompt zero-variance -- left out of the mean) and ``early_batches``, how many rows it had (at
    most :data:`EARLY_BATCHES`). What `orch archive` keeps, so an archive holds one predictor row per run, as every
    reader of it expects. Frames that already have ``early_batches`` are returned as they are."""
    import pandas as pd

    if "early_batches" in predictions.columns or predictions.empty:
        return predictions
    parts = []
    for _, rows in predictions.sort_values(["run_id", "step"], kind="stable").groupby("run_id", sort=False):
        early = rows.head(EARLY_BATCHES)
        first = rows.iloc[[0]].copy()
        for metric, column in EARLY_COLUMNS.items():
            values = pd.to_numeric(early[RATIO_COLUMN[metric]], errors="coerce") if RATIO_COLUMN[metric] in early \
                else pd.Series(dtype=float)
            first[column] = values.mean() if values.notna().any() else math.nan
        first["early_batches"] = len(early)
        parts.append(first)
    return pd.concat(parts, ignore_index=True)


def run_reading(row: pd.Series, metric: str, k: int) -> tuple[bool, float | None]:
    """(available, ratio) of one run's row of :func:`early_columns` for a reading: the first batch's ratio under
    ``metric`` (k = 1) or the mean over its first ``k`` batches. Not available when the run had fewer batches or the
    ratio was not recorded (an old archive); None when no batch read had a ratio (every prompt zero-variance)."""
    if k == 1:
        column = RATIO_COLUMN[metric]
        if column not in row.index:
            return False, None
        ratio = _finite(row[column])
        if ratio is None and (_finite(row["zero_variance_share"]) or 0.0) < 1.0:
            return False, None  # not recorded, not undefined
        return True, ratio
    column = EARLY_COLUMNS[metric]
    if column not in row.index or (_finite(row.get("early_batches")) or 0) < k:
        return False, None
    if metric == "std" and _finite(row[RATIO_COLUMN["std"]]) is None and (_finite(row["zero_variance_share"]) or 0.0) < 1.0:
        return False, None  # the std ratio was not recorded
    return True, _finite(row[column])


def condition_readings(summary: pd.DataFrame, predictions: pd.DataFrame) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (task, variant): every reading of :data:`READINGS` available on its baseline runs (mean over runs, None
    when no run has a ratio), the spread of the first-batch var ratio over runs, the runs read and the first batch's
    mean zero-variance share."""
    import numpy as np

    baseline = summary[summary["filtered"].eq(False).fillna(False)][["run_id", "task", "variant"]]
    predictions = early_columns(predictions)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for (task, variant), runs in baseline.groupby(["task", "variant"], sort=True):
        per_run = [row for _, row in predictions[predictions["run_id"].isin(runs["run_id"])].iterrows()]
        if not per_run:
            continue
        readings: dict[str, float | None] = {}
        for name, (metric, k) in READINGS.items():
            values = [run_reading(row, metric, k) for row in per_run]
            if not any(available for available, _ in values):
                continue
            ratios = [ratio for available, ratio in values if available and ratio is not None]
            readings[name] = float(np.mean(ratios)) if ratios else None
        firsts = [value for value in (_finite(row["ratio"]) for row in per_run) if value is not None]
        shares = [value for value in (_finite(row["zero_variance_share"]) for row in per_run) if value is not None]
        found[(str(task), str(variant))] = {
            "readings": readings, "runs": len(per_run),
            "ratio_sd": float(np.std(firsts, ddof=1)) if len(firsts) > 1 else None,
            "zero_variance_share": float(np.mean(shares)) if shares else None,
        }
    return found


def _round(value: Any) -> float | None:
    """A finite value rounded for the record (None for NaN or None)."""
    value = _finite(value)
    return None if value is None else round(value, 4)


def sweep_rows(sweep: str, summary: pd.DataFrame, predictions: pd.DataFrame) -> list[dict[str, Any]]:
    """The conditions of one sweep: every (task, variant, filter setting) with a predictor reading and a filter gain
    measured on both arms; [] for a sweep without both filter arms or without dumped batches."""
    from analysis.stats.science import filter_effect

    readings = condition_readings(summary, predictions)
    effects = filter_effect(summary).dropna(subset=["delta"])
    rows = []
    for _, effect in effects.sort_values(["task", "variant", "filter"]).iterrows():
        key = (str(effect["task"]), str(effect["variant"]))
        if key not in readings:
            continue
        read = readings[key]
        seeds = int(min(effect["base_n"], effect["filt_n"]))
        lo, hi = float(effect["lo"]), float(effect["hi"])
        rows.append({
            "sweep": sweep, "task": key[0], "variant": key[1], "filter": str(effect["filter"]),
            "ratios": {name: _round(value) for name, value in read["readings"].items()},
            "ratio_sd": _round(read["ratio_sd"]), "runs": int(read["runs"]),
            "zero_variance_share": _round(read["zero_variance_share"]),
            "gain": _round(effect["delta"]), "lo": _round(lo), "hi": _round(hi),
            "base_n": int(effect["base_n"]), "filt_n": int(effect["filt_n"]),
            "shown": gain_class(lo, hi, seeds, DELTA),
        })
    return rows


def unit(row: dict[str, Any]) -> str:
    """The split's unit of a condition: sweep/task/variant (both filter arms of one baseline together)."""
    return f"{row['sweep']}/{row['task']}/{row['variant']}"


def halves(rows: list[dict[str, Any]]) -> dict[str, str]:
    """unit -> :data:`FIT` or :data:`HELD_OUT`: the units ordered by the SHA-256 of their name, alternating (the
    first fit). By name alone: no measured number moves a condition between halves."""
    units = sorted({unit(row) for row in rows}, key=lambda name: hashlib.sha256(name.encode()).hexdigest())
    return {name: (FIT if position % 2 == 0 else HELD_OUT) for position, name in enumerate(units)}


# --- rules, their fit and their tally --------------------------------------------------------------------------

def _seeds(row: dict[str, Any]) -> int:
    return min(row["base_n"], row["filt_n"])


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def row_outcome(row: dict[str, Any], verdict: str) -> str:
    """A verdict against a condition's measured gain (:func:`analysis.stats.predictor.outcome` with :data:`DELTA`)."""
    return outcome(verdict, _nan(row["lo"]), _nan(row["hi"]), _seeds(row), DELTA)


def _verdict(value: float | None, thresholds: PredictorThresholds) -> str:
    return verdict_for(value, thresholds)[0]


def tally(rows: list[dict[str, Any]], verdicts: list[str] | None = None) -> dict[str, Any]:
    """The counts of :data:`COUNTS` of ``verdicts`` (default: each row's recorded ``verdict``) against ``rows``, and
    the hit rate's Wilson 95% interval over the decided ones. ``against``: undecided conditions whose point
    estimate lies on the side of 0 the verdict did not say."""
    verdicts = [row["verdict"] for row in rows] if verdicts is None else verdicts
    results = [row_outcome(row, said) for row, said in zip(rows, verdicts, strict=True)]
    counts = {name: sum(result == name for result in results) for name in OUTCOMES}
    decided = counts[HIT] + counts[MISS]
    lo, hi = wilson(counts[HIT], decided)
    against = sum(result == UNDECIDED and said in (VERDICT_HELPS, VERDICT_HURTS) and row["gain"] is not None
                  and (row["gain"] > 0.0) != (said == VERDICT_HELPS)
                  for row, said, result in zip(rows, verdicts, results, strict=True))
    return {"n": len(rows), "decided": decided, "hits": counts[HIT], "misses": counts[MISS],
            "undecided": counts[UNDECIDED], "no_call": counts[NO_CALL], "against": against,
            "net": counts[HIT] - counts[MISS], "wilson": [round(lo, 4), round(hi, 4)]}


def fit_thresholds(values: list[float | None], rows: list[dict[str, Any]],
                   shipped: PredictorThresholds | None = None) -> tuple[PredictorThresholds, str]:
    """The cuts (hurts_below <= helps_above) whose verdicts on ``values`` (a ratio, or any score read the same way,
    per row) have the highest net (hits - misses) against ``rows``' gains; ties go to the cuts nearest ``shipped``
    (default: the shipped thresholds). Candidates: 0, the shipped cuts, the midpoints between consecutive distinct
    values and one above the largest. Fewer than :data:`MIN_FIT` decided rows keep ``shipped``. Returns the cuts and
    why."""
    shipped = shipped or PredictorThresholds()
    decided = [(value, row) for value, row in zip(values, rows, strict=True)
               if row["shown"] in (HELPED, FELL_SHORT)]
    if len(decided) < MIN_FIT:
        return shipped, f"{len(decided)} decided fit conditions (< {MIN_FIT}): the shipped cuts kept"
    finite = sorted({value for value, _ in decided if value is not None})
    cuts = sorted({0.0, shipped.hurts_below, shipped.helps_above, *(round((a + b) / 2, 4) for a, b in
                   zip(finite, finite[1:], strict=False)), round((finite[-1] if finite else 0.0) + 1.0, 4)})
    best: tuple[float, float, PredictorThresholds] | None = None
    for low in cuts:
        for high in (cut for cut in cuts if cut >= low):
            cand = PredictorThresholds(helps_above=high, hurts_below=low)
            net = tally([row for _, row in decided], [_verdict(value, cand) for value, _ in decided])["net"]
            distance = abs(high - shipped.helps_above) + abs(low - shipped.hurts_below)
            if best is None or (net, -distance) > (best[0], -best[1]):
                best = (net, distance, cand)
    assert best is not None
    return best[2], f"net {best[0]:+d} on {len(decided)} decided fit conditions"


def _cuts(thresholds: PredictorThresholds) -> dict[str, float]:
    return {"helps_above": thresholds.helps_above, "hurts_below": thresholds.hurts_below}


def evaluate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every reading's held-out tallies (shipped and refitted cuts, the refit's reason), the shipped cuts' tally on
    every condition, the trivial rules on the kept reading's held-out conditions and the reading with the best
    held-out net."""
    shipped = PredictorThresholds()
    split = halves(rows)
    readings = {}
    for name in READINGS:
        chosen = [row for row in rows if name in row["ratios"]]
        fit = [row for row in chosen if split[unit(row)] == FIT]
        held = [row for row in chosen if split[unit(row)] == HELD_OUT]
        refit, why = fit_thresholds([row["ratios"][name] for row in fit], fit)
        readings[name] = {
            "conditions": len(chosen), "refit": {**_cuts(refit), "why": why},
            "held_out": {"shipped": tally(held, [_verdict(row["ratios"][name], shipped) for row in held]),
                         "refit": tally(held, [_verdict(row["ratios"][name], refit) for row in held])},
            "all_shipped": tally(chosen, [_verdict(row["ratios"][name], shipped) for row in chosen]),
        }
    kept = [row for row in rows if KEPT in row["ratios"]]
    fit = [row for row in kept if split[unit(row)] == FIT]
    held = [row for row in kept if split[unit(row)] == HELD_OUT]
    zero_cuts, zero_why = fit_thresholds([row["zero_variance_share"] for row in fit], fit,
                                         PredictorThresholds(helps_above=0.5, hurts_below=0.5))
    trivial = {
        "always likely helps": {"held_out": tally(held, [VERDICT_HELPS] * len(held))},
        "zero-variance share alone": {
            "cuts": {**_cuts(zero_cuts), "why": zero_why},
            "held_out": tally(held, [_verdict(row["zero_variance_share"], zero_cuts) for row in held])},
    }
    predictor_net = readings[KEPT]["held_out"]["shipped"]["net"]
    beats = {name: predictor_net - rule["held_out"]["net"] for name, rule in trivial.items()}
    # the readings compared on the held-out conditions every reading covers (an old archive has var-first only)
    common = [row for row in rows if split[unit(row)] == HELD_OUT and all(name in row["ratios"] for name in READINGS)]
    nets = {name: tally(common, [_verdict(row["ratios"][name], shipped) for row in common]) for name in READINGS}
    best = (max(READINGS, key=lambda name: (nets[name]["net"], name == KEPT))
            if any(counts["decided"] for counts in nets.values()) else None)
    return {"split": {name: split[name] for name in sorted(split)}, "readings": readings, "trivial": trivial,
            "beats": beats, "best": best, "best_on": len(common)}


# --- the archives, the record ----------------------------------------------------------------------------------

def measure(results: Path = RESULTS) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The conditions of every archived sweep under ``results`` (one folder per sweep, one archive folder per
    session inside it) and the sweeps left out, each with why."""
    from analysis.stats.summary import summarize
    from analysis.stores.archive import evidence_sessions, read_archives

    if not Path(results).is_dir():
        raise OrchError(f"{results}: no such folder of archived sweeps (docs/results/<sweep>/<session>/)")
    rows, skipped = [], {}
    for folder in sorted(path for path in Path(results).iterdir() if path.is_dir()):
        sessions = evidence_sessions(folder)
        if not sessions:
            skipped[folder.name] = ("rehearsal archives only (generated data, not evidence)"
                                    if any(path.is_dir() for path in folder.iterdir()) else "no archive folder")
            continue
        data, predictions = read_archives(sessions, folder.name)
        found = sweep_rows(folder.name, summarize(data), predictions)
        if not found:
            skipped[folder.name] = "no task with a predictor reading and both filter arms (filter none and on)"
        rows += found
    return rows, skipped


def make_record(rows: list[dict[str, Any]], skipped: dict[str, str], source: str) -> dict[str, Any]:
    """The record :func:`write_record` keeps: source, rule, thresholds, the kept reading's held-out counts, the
    evaluation of :func:`evaluate`, the sweeps left out and the conditions (each with its half, and the kept
    reading's verdict and outcome at the shipped cuts)."""
    thresholds = PredictorThresholds()
    split = halves(rows)
    rows = [dict(row) for row in rows]
    for row in rows:
        row["half"] = split[unit(row)]
        if KEPT in row["ratios"]:
            row["verdict"] = _verdict(row["ratios"][KEPT], thresholds)
            row["outcome"] = row_outcome(row, row["verdict"])
    evaluation = evaluate(rows)
    held = evaluation["readings"][KEPT]["held_out"]["shipped"]
    return {"source": source, "definition": DEFINITION, "delta": DELTA, "kept": KEPT, "thresholds": _cuts(thresholds),
            **copy.deepcopy(held), **evaluation, "skipped": dict(skipped), "rows": rows}


def record_path(checkout: Path | None = None) -> Path:
    """Where the record of the checkout ``checkout`` lives (default: this module's)."""
    return RECORD if checkout is None else Path(checkout) / "analysis" / "stats" / RECORD.name


def write_record(record: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``record`` as YAML (at ``path``, default :data:`RECORD`) with a header saying what it is and how it is
    made."""
    import yaml

    path = RECORD if path is None else Path(path)
    header = ("# The Std(RV)/Mean(RV) predictor's hit rate, held out, on orch's own archived sweeps "
              f"(analysis/stats/predictor_record.py):\n# what reports and `orch predict-filter-gain` print beside its verdict. "
              f"Written by `{COMMAND}`\n# from every archive under docs/results; the paper's reference points are "
              "not in it (the thresholds were set on them).\n")
    text = header + yaml.safe_dump(record, sort_keys=False, width=200, allow_unicode=True)
    path.write_text(text)
    return path


def load_record(path: Path | None = None) -> dict[str, Any]:
    """The recorded hit rate at ``path`` (default :data:`RECORD`; {} when nothing is recorded); OrchError when a
    condition's outcome is not what its verdict and interval give, or the counts disagree with the conditions (a
    hand edit, or a rule changed since: both are re-derived, never trusted alone)."""
    import yaml

    path = RECORD if path is None else Path(path)
    if not path.is_file():
        return {}
    record = yaml.safe_load(path.read_text()) or {}
    rows = record.get("rows") or []
    for row in rows:
        if "outcome" in row and row["outcome"] != row_outcome(row, row["verdict"]):
            raise OrchError(f"{path}: {unit(row)} ({row['filter']}) is recorded as {row['outcome']!r}, but its verdict "
                            f"and interval give {row_outcome(row, row['verdict'])!r}; re-record it with `{COMMAND}`")
    held = [row for row in rows if "verdict" in row and row.get("half") == HELD_OUT]
    derived = tally(held)
    wrong = [name for name in COUNTS if name in record and record[name] != derived[name]]
    if wrong:
        raise OrchError(f"{path}: {', '.join(f'{name} {record[name]} but its rows give {derived[name]}' for name in wrong)}"
                        f"; re-record it with `{COMMAND}`")
    return record


# --- the words -------------------------------------------------------------------------------------------------

def _rate(counts: dict[str, Any]) -> str:
    text = f"{counts['n']} held-out condition{'s' * (counts['n'] != 1)}, {counts['decided']} decided"
    if not counts["decided"]:
        return text
    lo, hi = counts["wilson"]
    return (f"{text}: {counts['hits']} hit{'s' * (counts['hits'] != 1)}, {counts['misses']} "
            f"miss{'es' * (counts['misses'] != 1)} (hit rate {counts['hits'] / counts['decided']:.0%}, Wilson 95% "
            f"{lo:.0%}-{hi:.0%})")


def verdict_note(record: dict[str, Any] | None = None) -> str:
    """How the verdict fared on held-out runs against the trivial rules, in a few words for the verdict line: ''
    when nothing held out is decided."""
    record = load_record() if record is None else record
    if not record.get("decided"):
        return "not yet tested on held-out runs"
    trivial = record.get("trivial") or {}
    beats = record.get("beats") or {}
    lost = [name for name, margin in beats.items() if margin <= 0]
    if lost:
        rules = " or ".join(f"'{name}' (net {trivial[name]['held_out']['net']:+d})" for name in lost)
        return f"on held-out runs no better than {rules}: net {record['net']:+d}"
    margins = ", ".join(f"'{name}' by {margin:+d}" for name, margin in beats.items())
    return f"on held-out runs it beat {margins} (net hits)"


def hit_rate_line(record: dict[str, Any] | None = None) -> str:
    """The predictor's held-out hit rate in one plain line, with the score and reading it was measured with, how
    it compares to the trivial rules, and where the rule is written (``record``: :func:`load_record`'s by
    default)."""
    record = load_record() if record is None else record
    head = "Predictor on orch's own runs"
    if not record.get("rows"):
        return f"{head}: not measured yet (no archived sweep with both filter arms; {COMMAND}); see {DOCS}."
    name = record.get("kept", KEPT)
    metric, k = READINGS.get(name, ("var", 1))
    batches = "first batch" if k == 1 else f"first {k} batches"
    thin = "; too few to recalibrate on" if record["decided"] < MIN_DECIDED else ""
    return (f"{head} (held-out half, RV as {metric}, {batches}, a gain of interest {record.get('delta', DELTA):g} "
            f"points): {_rate(record)}{thin}; {verdict_note(record)}. See {DOCS}.")


# --- the power calculation -------------------------------------------------------------------------------------

def seeds_needed(sd_base: float, sd_filtered: float, gain: float, power: float = 0.8, alpha: float = 0.05) -> int:
    """Seeds per arm for a two-sided ``alpha`` test of a difference of two means (each arm's seed-to-seed standard
    deviation given, equal seeds per arm) to find a true ``gain`` with probability ``power``: the normal
    approximation ``n = (z_{1-alpha/2} + z_power)^2 (sd_base^2 + sd_filtered^2) / gain^2``, rounded up, at least
    :data:`analysis.stats.verdicts.MIN_SEEDS`. The same n makes an interval's upper end fall below ``gain`` with that
    probability when the true gain is 0 (the *fell short* side of the rule). Optimistic for small n (a t quantile
    would add one or two seeds)."""
    if gain <= 0:
        raise ValueError(f"gain must be > 0, got {gain}")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    n = z * z * (sd_base ** 2 + sd_filtered ** 2) / gain ** 2
    return max(MIN_SEEDS, math.ceil(n - 1e-9))


def power_table(summary: pd.DataFrame, gains: tuple[float, ...] = (5.0, 10.0)) -> list[dict[str, Any]]:
    """Per (task, variant, filter setting) with both arms: each arm's seed-to-seed standard deviation of final
    success (points) and the seeds per arm :func:`seeds_needed` gives for each of ``gains``."""
    known = summary[summary["filtered"].notna() & summary["final_success"].notna()]
    rows = []
    for (task, variant), group in known.groupby(["task", "variant"], sort=True):
        base = group.loc[~group["filtered"].astype(bool), "final_success"].astype(float)
        for setting, treated in group[group["filtered"].astype(bool)].groupby("filter", sort=True):
            values = treated["final_success"].astype(float)
            if len(base) < 2 or len(values) < 2:
                continue
            sd_base, sd_filt = float(base.std(ddof=1)), float(values.std(ddof=1))
            rows.append({"task": str(task), "variant": str(variant), "filter": str(setting),
                         "sd_base": round(sd_base, 2), "sd_filtered": round(sd_filt, 2), "seeds": len(base),
                         **{f"seeds_for_{gain:g}": seeds_needed(sd_base, sd_filt, gain) for gain in gains}})
    return rows
