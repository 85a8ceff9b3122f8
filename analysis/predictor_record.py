"""The Std(RV)/Mean(RV) predictor's own hit rate: how often its verdict (:mod:`analysis.predictor`) matched the filter
gain orch measured, over every archived sweep with both filter arms (``docs/results/<sweep>/<session>/``). The
paper's three reference points cannot take part: the thresholds were set on them.

Per (sweep, task, variant, filter setting), a *comparison*: the verdict of the mean ratio over the baseline runs'
first dumped rollout batch (:func:`analysis.tables.task_verdicts`, the verdict the reports print) against the filter
gain of :func:`analysis.science.filter_effect` (filtered minus unfiltered final validation success, in points, with
its 95% bootstrap interval over seeds). Its outcome:

* **hit** -- *likely helps* and the gain's interval lies above 0, or *unlikely to help* and it lies below 0;
* **miss** -- *likely helps* and the interval lies below 0, or *unlikely to help* and it lies above 0;
* **undecided** by the data -- the interval spans 0, or an arm has fewer than
  :data:`analysis.verdicts.MIN_SEEDS` seeds: neither a hit nor a miss; the line says on which side of 0 the point
  estimate fell, so a verdict the point estimate contradicts is not hidden;
* **no call** -- the verdict was *uncertain*: the predictor claimed nothing.

This is the rule of finding 4 of docs/science.md (hit: reproduced, miss: not reproduced, declared before the runs;
:func:`analysis.predictor.outcome` decides both), pooled over every archived sweep. An interval that
touches 0 (e.g. [-5, 0]) spans it, as everywhere in :mod:`analysis.verdicts`.

The hit rate is hits / (hits + misses) with its Wilson 95% interval (:func:`analysis.verdicts.wilson`). Fewer than
:data:`MIN_DECIDED` decided comparisons are too few to recalibrate the thresholds on (the Wilson interval is then
about 30 points wide even at 100% hits -- 9/9: 70-100% -- and 55 at half).

The result is recorded in ``analysis/predictor_record.yaml`` (written by ``python benchmarks/bench_predictor.py
--record``, which reads every archive under ``docs/results``), so a report on a fresh store prints it without the
archives: :func:`hit_rate_line`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.predictor import (
    HIT,
    MISS,
    NO_CALL,
    UNDECIDED,
    VERDICT_HELPS,
    VERDICT_HURTS,
    PredictorThresholds,
    outcome,
)
from analysis.verdicts import MIN_SEEDS, wilson
from orchlib.errors import OrchError

if TYPE_CHECKING:
    import pandas as pd

RECORD = Path(__file__).with_name("predictor_record.yaml")
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
COMMAND = "python benchmarks/bench_predictor.py --record"
OUTCOMES = (HIT, MISS, UNDECIDED, NO_CALL)
MIN_DECIDED = 10
COUNTS = ("n", "decided", "hits", "misses", "undecided", "no_call", "against")
DEFINITION = ("a hit is 'likely helps' with the filter gain's 95% interval above 0 or 'unlikely to help' with it "
              "below 0 (finding 4's rule, docs/science.md), a miss the reverse; an interval spanning 0 or fewer than "
              f"{MIN_SEEDS} seeds per arm leaves a comparison undecided, and 'uncertain' makes no call")
LABELS = {HIT: "hits", MISS: "misses", UNDECIDED: "undecided by the data", NO_CALL: "no call (uncertain)"}


def against(row: dict[str, Any]) -> bool:
    """Whether the comparison's point estimate lies on the side of 0 its verdict did not say (a 'likely helps'
    with gain <= 0, an 'unlikely to help' with gain > 0)."""
    if row["verdict"] not in (VERDICT_HELPS, VERDICT_HURTS):
        return False
    return (row["gain"] > 0.0) != (row["verdict"] == VERDICT_HELPS)


def sweep_rows(sweep: str, summary: pd.DataFrame, predictions: pd.DataFrame) -> list[dict[str, Any]]:
    """The comparisons of one sweep: every (task, variant, filter setting) with a predictor verdict and a filter
    gain measured on both arms; [] for a sweep without both filter arms or without dumped batches."""
    from analysis.science import filter_effect
    from analysis.tables import task_verdicts

    verdicts = task_verdicts(summary, predictions)
    effects = filter_effect(summary).dropna(subset=["delta"])
    rows = []
    for _, row in verdicts.merge(effects, on=["task", "variant"]).sort_values(["task", "variant", "filter"]).iterrows():
        seeds = int(min(row["base_n"], row["filt_n"]))
        rows.append({
            "sweep": sweep, "task": str(row["task"]), "variant": str(row["variant"]), "filter": str(row["filter"]),
            "ratio": _round(row["ratio_mean"]), "ratio_std": _round(row["ratio_std"]), "ratio_runs": int(row["ratio_n"]),
            "verdict": str(row["verdict"]), "gain": _round(row["delta"]), "lo": _round(row["lo"]),
            "hi": _round(row["hi"]), "base_n": int(row["base_n"]), "filt_n": int(row["filt_n"]),
            "outcome": outcome(str(row["verdict"]), float(row["lo"]), float(row["hi"]), seeds),
        })
    return rows


def _round(value: Any) -> float | None:
    """A finite value rounded for the record (None for NaN)."""
    value = float(value)
    return None if math.isnan(value) else round(value, 4)


def tally(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts of :data:`COUNTS` over ``rows``, and the hit rate's Wilson 95% interval over the decided ones."""
    counts = {name: sum(row["outcome"] == name for row in rows) for name in OUTCOMES}
    decided = counts[HIT] + counts[MISS]
    lo, hi = wilson(counts[HIT], decided)
    return {"n": len(rows), "decided": decided, "hits": counts[HIT], "misses": counts[MISS],
            "undecided": counts[UNDECIDED], "no_call": counts[NO_CALL],
            "against": sum(row["outcome"] == UNDECIDED and against(row) for row in rows),
            "wilson": [round(lo, 4), round(hi, 4)]}


def measure(results: Path = RESULTS) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The comparisons of every archived sweep under ``results`` (one folder per sweep, one archive folder per
    session inside it) and the sweeps left out, each with why."""
    from analysis.archive import read_archives
    from analysis.summary import summarize

    if not Path(results).is_dir():
        raise OrchError(f"{results}: no such folder of archived sweeps (docs/results/<sweep>/<session>/)")
    rows, skipped = [], {}
    for folder in sorted(path for path in Path(results).iterdir() if path.is_dir()):
        sessions = sorted(path for path in folder.iterdir() if path.is_dir())
        if not sessions:
            skipped[folder.name] = "no archive folder"
            continue
        data, predictions = read_archives(sessions, folder.name)
        found = sweep_rows(folder.name, summarize(data), predictions)
        if not found:
            skipped[folder.name] = "no task with a predictor verdict and both filter arms (filter none and on)"
        rows += found
    return rows, skipped


def make_record(rows: list[dict[str, Any]], skipped: dict[str, str], source: str) -> dict[str, Any]:
    """The record :func:`write_record` keeps: source, definition, thresholds, counts, the sweeps left out and rows."""
    thresholds = PredictorThresholds()
    return {"source": source, "definition": DEFINITION,
            "thresholds": {"helps_above": thresholds.helps_above, "hurts_below": thresholds.hurts_below},
            **tally(rows), "skipped": dict(skipped), "rows": list(rows)}


def write_record(record: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``record`` as YAML (at ``path``, default :data:`RECORD`) with a header saying what it is and how it is
    made."""
    import yaml

    path = RECORD if path is None else Path(path)
    header = ("# The Std(RV)/Mean(RV) predictor's hit rate on orch's own archived sweeps (analysis/predictor_record.py):"
              f"\n# what `orch report` prints beside the predictor's verdict. Written by `{COMMAND}`\n# from every "
              "archive under docs/results; the paper's reference points are not in it (the thresholds were set on "
              "them).\n")
    path.write_text(header + yaml.safe_dump(record, sort_keys=False, width=200, allow_unicode=True))
    return path


def load_record(path: Path | None = None) -> dict[str, Any]:
    """The recorded hit rate at ``path`` (default :data:`RECORD`; {} when nothing is recorded); OrchError when a
    row's outcome is not what :func:`outcome` gives its verdict and interval, or the counts disagree with the rows
    (a hand edit, or a rule changed since: both are re-derived, never trusted alone)."""
    import yaml

    path = RECORD if path is None else Path(path)
    if not path.is_file():
        return {}
    record = yaml.safe_load(path.read_text()) or {}
    rows = record.get("rows") or []
    for row in rows:
        nan = float("nan")
        expected = outcome(row["verdict"], nan if row["lo"] is None else row["lo"],
                           nan if row["hi"] is None else row["hi"], min(row["base_n"], row["filt_n"]))
        if row["outcome"] != expected:
            raise OrchError(f"{path}: {row['sweep']} {row['task']} is recorded as {row['outcome']!r}, but its verdict "
                            f"and interval give {expected!r}; re-record it with `{COMMAND}`")
    derived = tally(rows)
    wrong = [name for name in COUNTS if name in record and record[name] != derived[name]]
    if wrong:
        raise OrchError(f"{path}: {', '.join(f'{name} {record[name]} but its rows give {derived[name]}' for name in wrong)}"
                        f"; re-record it with `{COMMAND}`")
    return record


def _case(row: dict[str, Any]) -> str:
    """One comparison in words: where, what the predictor said, what was measured."""
    where = " ".join([row["sweep"], row["task"]] + ([] if row["variant"] == "base" else [row["variant"]]))
    ratio = "undefined" if row["ratio"] is None else f"{row['ratio']:.2f}"
    interval = "" if row["lo"] is None else f" [{row['lo']:+.1f}, {row['hi']:+.1f}]"
    return f"{where} said {row['verdict']} (ratio {ratio}), measured {row['gain']:+.1f}{interval} points with {row['filter']}"


def _cases(rows: list[dict[str, Any]], counts: dict[str, Any]) -> str:
    """The comparisons grouped by outcome, each group with its count."""
    groups = []
    for name in OUTCOMES:
        chosen = [row for row in rows if row["outcome"] == name]
        if not chosen:
            continue
        label = f"{LABELS[name]} ({len(chosen)}"
        if name == UNDECIDED:
            label += f", point estimate against the verdict in {counts['against']}"
        groups.append(label + "): " + "; ".join(_case(row) for row in chosen))
    return "; ".join(groups)


def _threshold_words(record: dict[str, Any], counts: dict[str, Any]) -> str:
    """Whether the evidence is enough to recalibrate on, and a warning when it was recorded at other thresholds."""
    current = PredictorThresholds()
    recorded = record.get("thresholds") or {}
    text = ""
    if recorded and (recorded.get("helps_above"), recorded.get("hurts_below")) != (current.helps_above,
                                                                                   current.hurts_below):
        text += (f"Recorded at thresholds likely helps >= {recorded.get('helps_above'):g}, unlikely to help < "
                 f"{recorded.get('hurts_below'):g}, not today's: re-record it ({COMMAND}). ")
    if counts["decided"] < MIN_DECIDED:
        text += (f"n = {counts['n']} comparisons, {counts['decided']} decided: far too thin to recalibrate; the "
                 f"thresholds stay those set on the paper's points (likely helps >= {current.helps_above:g}, unlikely to help < "
                 f"{current.hurts_below:g}). ")
    return text


def hit_rate_line(record: dict[str, Any] | None = None) -> str:
    """The predictor's hit rate on orch's own runs in one line, with n, the cases, whether that is enough to
    recalibrate on, the definition and the source (``record``: :func:`load_record`'s by default)."""
    record = load_record() if record is None else record
    rows = record.get("rows") or []
    head = "Predictor hit rate on orch's own runs (not the paper's points its thresholds were set on): "
    if not rows:
        return (head + "not measured yet -- no archived sweep with both filter arms is recorded in "
                f"analysis/predictor_record.yaml ({COMMAND}).")
    counts = tally(rows)
    lo, hi = counts["wilson"]
    rate = (f"{counts['hits']}/{counts['decided']} decided comparisons hit (Wilson 95% {lo:.0%}-{hi:.0%})"
            if counts["decided"] else "no comparison decided yet")
    return (f"{head}{rate}; {_cases(rows, counts)}. {_threshold_words(record, counts)}"
            f"Definition: {DEFINITION}. Source: {record.get('source', COMMAND)} (analysis/predictor_record.yaml).")
