"""Does RAGEN-2's story (arXiv 2604.06268) hold in this sweep? Each finding tested with statistics over seeds and
given a machine-made verdict -- *reproduced*, *not reproduced* or *inconclusive* -- by the rules below, declared
before any run was looked at (docs/science.md repeats them). A finding that does not reproduce is a result.

Definitions (per run):

* *success* is the last validation success (``final_success`` of :func:`analysis.stats.summary.summarize`, percent);
* a metric's *final* value is the mean of its last 3 logged values, its *peak* the largest logged value
  (:func:`analysis.stats.summary.metric_stats`);
* *retrieval excess* is ``retrieval_acc / retrieval_chance - 1`` (``recipes.stats.mi.retrieval_excess``) of the
  trajectory sample set: the excess over chance that the collapse alert tracks
  (``recipes.stats.collapse_alert.CollapseAlert``);
* a metric's *fall* is ``(peak - final) / peak``, 0 when its peak is not positive (nothing above zero to lose);
* a *decline onset* and the early-warning *lead* are :mod:`analysis.stats.early_warning`'s (the series sits at or below
  70% of its running peak on 2 consecutive points: ``recipes.stats.collapse_alert.LEGACY_RULE``, the alert's rule when
  these rules were declared); the lead is
  success's onset minus MI-ZScore-EMA's onset, in steps (positive: MI fell first).

Every verdict is :func:`analysis.stats.verdicts.judge`'s (issue 56: one judge for every claim, shared with the paper's
side-by-side report), by the path of the claim's kind, and carries in brackets that path's error rate measured on
known truth (``benchmarks/bench_judge.py``). An interval *clears* a threshold when it lies entirely above it and
*misses* it when it lies entirely below. Fewer than :data:`MIN_SEEDS` runs where a rule needs them make that finding
inconclusive. Findings are judged per task (and variant): pooling tasks would mix task difficulty into every
statistic. (Until issue 56 the intervals were percentile bootstraps over seeds; the thresholds are unchanged.)

1a. Without filtering, the MI proxies fall while entropy does not (baseline runs): the judge's direction path on
    each fall less 0.3 (Student's t over the runs): reproduced when the falls of MI-ZScore-EMA and of retrieval
    excess both clear 0.3 and entropy's (``actor/entropy``) misses 0.3 (a one-sided bound, 0.3 its margin); not
    reproduced when either MI fall misses 0.3 or entropy's fall clears it; inconclusive otherwise.
1b. Without filtering, MI falls before success: the judge's ordering path, scored only on the baseline runs where
    both declined, one first: reproduced when the share with MI first lies above 1/2 (Wilson interval), not
    reproduced below, inconclusive otherwise or with fewer than 3 such runs; "MI only", "no decline" and the other
    outcomes counted apart and shown, with the decline rule's false-alarm rate as an alert beside
    (:func:`analysis.stats.collapse_alert_calibration.decline_rule_line`).
2.  With filtering, MI and success end higher (each filter setting against the baseline): the judge's direction path
    on the deltas of final success and of final MI-ZScore-EMA (filtered minus baseline; Welch's t). Reproduced when
    both clear 0; not reproduced when either misses 0; inconclusive otherwise (and without MI diagnostics).
3.  MI tracks success better than entropy does (all runs of a task, filtered or not; at least 2 x 3 runs):
    Spearman's rho across runs of each run's mean MI-ZScore-EMA, and of its mean entropy, with final success.
    Reproduced when rho(MI)'s interval (Fisher's z, Bonett-Wright) clears 0 and the interval of rho(MI) -
    |rho(entropy)| (a bootstrap, runs resampled together) clears 0, each by the judge's direction path; not
    reproduced when either misses 0; inconclusive otherwise.
4.  The Std(RV)/Mean(RV) predictor (``analysis.stats.predictor``: the mean over baseline seeds of the ratio on each
    run's first dumped rollout batch, its verdict at the default thresholds) against the measured gain (finding
    2's success delta). Reproduced when *likely helps* meets a gain interval that clears 0, or *unlikely to help*
    one that misses 0; not reproduced when they point the other way; inconclusive when the verdict is *uncertain*,
    the interval spans 0, or no baseline run dumped a batch.

Beside the findings, a reading made after the runs and labelled so (:data:`POST_HOC`): the trend test of
:mod:`analysis.stats.trend` (zero in expectation on a flat noisy series, unlike the *fall* above) on each of finding 1a's
signals, for every filter arm side by side (:func:`arm_trends`). It changes no verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from analysis import names
from analysis.stats.early_warning import DEFAULT_RULE
from analysis.stats.verdicts import (  # noqa: F401  (re-exported: the verdict vocabulary of the findings)
    BOOT_SEED,
    CI,
    DIRECTION,
    INCONCLUSIVE,
    MIN_SEEDS,
    N_BOOT,
    NOT_REPRODUCED,
    ORDER,
    REPRODUCED,
    Judgement,
    Measurement,
    correlation_interval,
    delta_interval,
    interval_text,
    judge,
    mean_interval,
    percentiles,
    rate_brief,
    side,
)
from recipes.stats.mi import retrieval_excess

if TYPE_CHECKING:
    import pandas as pd

    from analysis.stats.trend import Trend
    from analysis.stores.mlflow_store import RunData

DROP = DEFAULT_RULE.drop_fraction  # the fall that counts as a collapse (0.3)
CLAIMS = {
    "1a": "without filtering, the MI proxies fall while entropy does not",
    "1b": "without filtering, MI falls before success does",
    "2": "with filtering, MI and success end higher than without",
    "3": "MI tracks success across runs better than entropy does (Spearman)",
    "4": "the Std(RV)/Mean(RV) predictor on the first batch foretells the filter's gain",
}


@dataclass(frozen=True)
class Finding:
    """One finding's verdict on one scope (a task, variant and filter setting), with its numbers in words."""

    key: str
    scope: str
    verdict: str
    evidence: str

    @property
    def claim(self) -> str:
        return CLAIMS[self.key]

    def line(self) -> str:
        return f"finding {self.key} [{self.scope}] {self.verdict}: {self.claim} -- {self.evidence}"


TREND_LABELS = {names.MI_ZSCORE_EMA: "MI-ZScore-EMA", names.RETRIEVAL_EXCESS: "retrieval excess",
                names.ENTROPY: "entropy"}  # finding 1a's signals, read by the post-hoc trend test
POST_HOC = "post-hoc: trend test"
Readings = dict[tuple[str, str], dict[str, dict[str, "Trend"]]]  # (task, variant) -> filter arm -> signal -> trend


@dataclass
class Science:
    """The verdicts of a sweep, or why the sweep cannot test the story (``reason``; then no findings). A sweep
    where some tasks can test it and others cannot yet (one seed so far) is tested on the former; ``untested``
    names the others and why."""

    findings: list[Finding] = field(default_factory=list)
    reason: str = ""
    untested: list[str] = field(default_factory=list)  # "scope: why" of each (task, variant) left untested
    effects: pd.DataFrame | None = None  # filter_effect(): the deltas behind findings 2 and 4
    trends: Readings = field(default_factory=dict)  # arm_trends() of the tested scopes: the post-hoc reading
    alert: list[str] = field(default_factory=list)  # the collapse alert: fired where, its rates (alert_summary)

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        rows = [{"finding": f.key, "claim": f.claim, "scope": f.scope, "verdict": f.verdict, "evidence": f.evidence}
                for f in self.findings]
        return pd.DataFrame(rows, columns=["finding", "claim", "scope", "verdict", "evidence"])


# --- per-run signals -------------------------------------------------------------------------------------------

def with_retrieval_excess(data: RunData) -> RunData:
    """``data`` with the derived metric :data:`analysis.names.RETRIEVAL_EXCESS` added at every step where both
    retrieval accuracy and its chance level were logged (chance > 0), from :func:`recipes.stats.mi.retrieval_excess`."""
    import pandas as pd

    acc = data.history(names.RETRIEVAL_ACC)
    chance = data.history(names.RETRIEVAL_CHANCE).rename(columns={"value": "chance"})
    both = acc.merge(chance, on=["run_id", "step"])
    both = both[both["chance"] > 0]
    if both.empty:
        return data
    derived = pd.DataFrame({"run_id": both["run_id"], "key": names.RETRIEVAL_EXCESS, "step": both["step"],
                            "timestamp": 0,
                            "value": retrieval_excess(both["value"], both["chance"])})
    return data.with_rows(derived)  # the histories found so far kept


def falls(data: RunData, keys: tuple[str, ...]) -> pd.DataFrame:
    """Per run (index run_id), each metric's fall ``(peak - final) / peak`` (0 when the peak is not positive)."""
    import pandas as pd

    from analysis.stats.summary import metric_stats

    columns = {}
    for key in keys:
        stats = metric_stats(data, key)
        if not stats.empty:
            peak, final = stats["peak"].astype(float), stats["final"].astype(float)
            columns[key] = ((peak - final) / peak).where(peak > 0, 0.0)
    return pd.DataFrame(columns).rename_axis("run_id")


def arm_trends(data: RunData, summary: pd.DataFrame) -> Readings:
    """The post-hoc trend test (:func:`analysis.stats.trend.trends`) of finding 1a's signals per (task, variant) and per
    filter arm (the baseline ``none`` first), over the runs whose filter setting is known. ``data`` must carry
    retrieval excess (:func:`with_retrieval_excess`); a signal no run of an arm logged is left out of that arm."""
    from analysis.stats.trend import trends

    known = summary[summary["filtered"].notna()]
    readings: Readings = {}
    for (task, variant), group in known.groupby(["task", "variant"], sort=True):
        arms = sorted(group.groupby("filter", sort=True), key=lambda arm: bool(arm[1]["filtered"].astype(bool).any()))
        readings[task, variant] = {str(setting): trends(data, tuple(TREND_LABELS), runs["run_id"])
                                   for setting, runs in arms}
    return readings


def trend_lines(readings: Readings) -> list[str]:
    """``readings`` (:func:`arm_trends`) in words: a header naming the test and its measured false-positive rate, then
    per scope and signal one line with every arm side by side (entropy's with its held verdict)."""
    from analysis.stats.trend import HOLD_MARGIN, null_note

    if not readings:
        return []
    lines = [f"{POST_HOC} (read after the runs, not a pre-registered rule; it changes no verdict): {null_note()}"]
    for (task, variant), arms in readings.items():
        for key, label in TREND_LABELS.items():
            parts = []
            for arm, signals in arms.items():
                if key in signals:
                    reading = signals[key]
                    held = f", {reading.level} (margin +-{HOLD_MARGIN:.0%})" if key == names.ENTROPY else ""
                    parts.append(f"{arm}: {reading.text()}{held}")
            if parts:
                lines.append(f"{POST_HOC} [{_scope(task, variant)}] {label} -- " + "; ".join(parts))
    return lines


def diagnostics_state(data: RunData) -> str:
    """Why a sweep has (or lacks) MI proxies: 'logged', 'off' (no run had the collapse hook), 'empty' (the hook ran
    but built no sample set) or 'missing' (the hook was on by its params, yet nothing was logged)."""
    from analysis.stats.summary import cell_runs, config_value

    if data.history(names.MI_ZSCORE_EMA)["value"].notna().any():
        return "logged"
    hooks = config_value(cell_runs(data.runs), names.PARAM_HOOKS).dropna()
    if not hooks.map(lambda value: f"'{names.COLLAPSE_HOOK}'" in value).any():
        return "off"
    return "empty" if not data.history(names.COLLAPSE_NUM_SAMPLES).empty else "missing"


DIAGNOSTICS_CAUSE = {
    "off": f"the MI diagnostics were off: no run had the collapse hook (run with hooks=[{names.COLLAPSE_HOOK}])",
    "empty": (f"the collapse hook ran but built no trajectory sample set ({names.COLLAPSE_NUM_SAMPLES} = 0: no "
              "response held a complete <think>...</think> block), so no MI proxy was computed"),
    "missing": f"the runs had the collapse hook on but logged no {names.MI_ZSCORE_EMA} (runs cut short?)",
}


def filter_effect(summary: pd.DataFrame, n_boot: int = N_BOOT, value: str = "final_success") -> pd.DataFrame:
    """Per (task, variant, filter setting): the baseline and filtered means of ``value`` over seeds, their run
    counts, and the delta with its bootstrap interval. Columns task, variant, filter, base_mean, base_n, filt_mean,
    filt_n, delta, lo, hi."""
    import pandas as pd

    rows = []
    known = summary[summary["filtered"].notna() & summary[value].notna()]
    for (task, variant), group in known.groupby(["task", "variant"], sort=True):
        base = group.loc[~group["filtered"].astype(bool), value].to_numpy(dtype=float)
        for setting, treated in group[group["filtered"].astype(bool)].groupby("filter", sort=True):
            values = treated[value].to_numpy(dtype=float)
            delta, lo, hi = delta_interval(base, values, n_boot)
            rows.append({"task": task, "variant": variant, "filter": setting,
                         "base_mean": base.mean() if base.size else math.nan, "base_n": int(base.size),
                         "filt_mean": values.mean(), "filt_n": int(values.size), "delta": delta, "lo": lo, "hi": hi})
    columns = ["task", "variant", "filter", "base_mean", "base_n", "filt_mean", "filt_n", "delta", "lo", "hi"]
    return pd.DataFrame(rows, columns=columns)


# --- the findings ----------------------------------------------------------------------------------------------

def _scope(task: str, variant: str, setting: str | None = None) -> str:
    parts = [str(task)] + ([] if variant == "base" else [str(variant)]) + ([str(setting)] if setting else [])
    return " · ".join(parts)


def _direction(sign: float, samples: tuple, shift: float = 0.0) -> tuple[float, Judgement]:
    """The judge's direction path (`analysis.stats.verdicts.judge`) on per-run values (one array, or base and treated
    arms) less ``shift``: does the mean (or the difference of means) lie above (``sign`` +1) or below (-1) it?
    Student's t (Welch's for two arms) over the runs. (the mean or difference, the judgement with its interval
    shifted back)."""
    arms = tuple(np.asarray(arm, dtype=np.float64) for arm in samples)
    arms = tuple(arm[np.isfinite(arm)] for arm in arms)
    value = float(arms[0].mean() if len(arms) == 1 else arms[1].mean() - arms[0].mean()) if all(
        arm.size for arm in arms) else math.nan
    n = int(min(arm.size for arm in arms))
    shifted = (arms[0] - shift,) if len(arms) == 1 else arms
    verdict, reason, lo, hi = judge(sign, DIRECTION, Measurement(value - shift, math.nan, math.nan, n,
                                                                samples=shifted))
    return value, Judgement(verdict, reason, lo + shift, hi + shift)


def _combined(verdicts: list[str]) -> str:
    """A finding of several claims: not reproduced when any is, reproduced when all are, else inconclusive."""
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED
    return REPRODUCED if all(v == REPRODUCED for v in verdicts) else INCONCLUSIVE


def _rates(kind: str, n: int) -> str:
    """The judge's measured error rates for a finding's path, in brackets (`analysis.stats.verdicts.rate_brief`)."""
    brief = rate_brief(kind, n)
    return f" [{brief}]" if brief else ""


def _finding_1a(scope: str, fall: pd.DataFrame, n_boot: int) -> Finding:
    needed = (names.MI_ZSCORE_EMA, names.RETRIEVAL_EXCESS, names.ENTROPY)
    absent = [key if key != names.RETRIEVAL_EXCESS else f"{names.RETRIEVAL_ACC} and {names.RETRIEVAL_CHANCE}"
              for key in needed if key not in fall.columns]
    if absent:
        return Finding("1a", scope, INCONCLUSIVE, f"not logged: {', '.join(absent)}")
    fall = fall[list(needed)].dropna()
    if len(fall) < MIN_SEEDS:
        return Finding("1a", scope, INCONCLUSIVE, f"{len(fall)} baseline runs with every signal (< {MIN_SEEDS})")
    # The judge's direction path on each fall less the threshold: the MI proxies' above it, entropy's below it (a
    # one-sided bound with the threshold as its margin: "does not fall" is never read from an interval spanning it).
    judged = {key: _direction(-1.0 if key == names.ENTROPY else 1.0, (fall[key].to_numpy(dtype=float),), DROP)[1]
              for key in needed}
    verdict = _combined([j.verdict for j in judged.values()])
    labels = {names.MI_ZSCORE_EMA: "MI-ZScore-EMA", names.RETRIEVAL_EXCESS: "retrieval excess",
              names.ENTROPY: "entropy"}
    text = "; ".join(f"{labels[key]} fall {interval_text(float(fall[key].mean()), j.lo, j.hi)}"
                     for key, j in judged.items())
    return Finding("1a", scope, verdict, f"{text} (threshold {DROP:g}: MI's falls above it, entropy's below; Student's "
                   f"t over {len(fall)} baseline runs){_rates(DIRECTION, len(fall))}")


def _finding_1b(scope: str, leads: pd.DataFrame, n_boot: int) -> Finding:
    """The judge's ordering path: scored only on the runs where both series declined, one before the other; "MI
    only", "no decline" and the rest counted apart and shown; the decline rule's false-alarm rate beside."""
    from analysis.stats.collapse_alert_calibration import decline_rule_line
    from analysis.stats.early_warning import decline_order

    measured = decline_order(list(leads["outcome"]))
    rule = decline_rule_line(brief=True)
    if measured.n == 0 and not measured.counts:
        return Finding("1b", scope, INCONCLUSIVE, f"no baseline run logged both MI and success; {rule}")
    verdict, reason, _, _ = judge(1.0, ORDER, measured)
    lead = leads["lead_steps"].dropna().to_numpy(dtype=float)
    shown = f"; mean lead {interval_text(*mean_interval(lead, n_boot), 1)} steps" if lead.size >= MIN_SEEDS else ""
    return Finding("1b", scope, verdict, f"{reason}{shown}; {rule}{_rates(ORDER, measured.n)}")


def _finding_2(scope: str, success: tuple, mi: tuple | None, counts: str) -> Finding:
    """The judge's direction path on the filtered minus baseline difference of final success and of final
    MI-ZScore-EMA (``success``, ``mi``: the per-run values of the two arms, base first; Welch's t)."""
    judged = [_direction(1.0, success)]
    text = f"success {interval_text(judged[0][0], judged[0][1].lo, judged[0][1].hi, 1)} points"
    if mi is not None:
        judged.append(_direction(1.0, mi))
        text += f"; MI-ZScore-EMA {interval_text(judged[1][0], judged[1][1].lo, judged[1][1].hi)}"
    seeds = int(min(np.isfinite(np.asarray(arm, dtype=float)).sum() for arm in success))
    text += f" ({counts}; Welch's t)"
    if seeds < MIN_SEEDS:
        return Finding("2", scope, INCONCLUSIVE, f"fewer than {MIN_SEEDS} seeds in an arm; {text}")
    verdict = _combined([j.verdict for _, j in judged])
    if mi is None and verdict != NOT_REPRODUCED:
        verdict, text = INCONCLUSIVE, f"no MI proxies logged; {text}"
    return Finding("2", scope, verdict, text + _rates(DIRECTION, seeds))


def spearman_gap(mi, entropy, success, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """(rho(MI) - |rho(entropy)|, lo, hi) across runs, the runs resampled together (NaN-free inputs)."""
    from analysis.stats.correlations import rowwise_spearman

    x, e, y = (np.asarray(v, dtype=np.float64)[None] for v in (mi, entropy, success))
    point = float(rowwise_spearman(x, y)[0] - abs(rowwise_spearman(e, y)[0]))
    picks = np.random.default_rng(BOOT_SEED).integers(0, x.shape[1], size=(n_boot, x.shape[1]))
    draws = rowwise_spearman(x[0][picks], y[0][picks]) - np.abs(rowwise_spearman(e[0][picks], y[0][picks]))
    return (point, *percentiles(draws))


def _finding_3(scope: str, runs: pd.DataFrame, n_boot: int) -> Finding:
    from analysis.stats.correlations import correlate

    if names.MI_ZSCORE_EMA not in runs.columns or names.ENTROPY not in runs.columns:
        return Finding("3", scope, INCONCLUSIVE, f"not logged: {names.MI_ZSCORE_EMA} or {names.ENTROPY}")
    runs = runs[[names.MI_ZSCORE_EMA, names.ENTROPY, "final_success"]].dropna()
    if len(runs) < 2 * MIN_SEEDS:
        return Finding("3", scope, INCONCLUSIVE, f"{len(runs)} runs with MI, entropy and success (< {2 * MIN_SEEDS})")
    # rho(MI) and rho(entropy) with Fisher's z (Bonett-Wright), the gap with the bootstrap over runs resampled
    # together; each judged by the judge's direction path
    rho = {key: correlate(runs[key], runs["final_success"], n_boot=0)["spearman"] for key in (names.MI_ZSCORE_EMA,
                                                                                             names.ENTROPY)}
    ci = {key: correlation_interval(runs[key], runs["final_success"], "spearman") for key in rho}
    gap = spearman_gap(runs[names.MI_ZSCORE_EMA], runs[names.ENTROPY], runs["final_success"], n_boot)
    mi = judge(1.0, DIRECTION, Measurement(rho[names.MI_ZSCORE_EMA], *ci[names.MI_ZSCORE_EMA], len(runs)))
    ahead = judge(1.0, DIRECTION, Measurement(*gap, len(runs)))
    verdict = _combined([mi.verdict, ahead.verdict])
    text = (f"Spearman MI {interval_text(rho[names.MI_ZSCORE_EMA], mi.lo, mi.hi)}, entropy "
            f"{interval_text(rho[names.ENTROPY], *ci[names.ENTROPY])} (Fisher's z), MI - |entropy| "
            f"{interval_text(*gap)} (bootstrap) over {len(runs)} runs")
    return Finding("3", scope, verdict, text + _rates(DIRECTION, len(runs)))


def _finding_4(scope: str, ratios: np.ndarray | None, effect: pd.Series) -> Finding:
    from analysis.stats.predictor import HIT, MISS, PredictorThresholds, outcome, verdict_for

    gain = f"gain {interval_text(effect['delta'], effect['lo'], effect['hi'], 1)} points"
    if ratios is None:
        return Finding("4", scope, INCONCLUSIVE, f"rollout batches were not read (--no-rollouts); {gain}")
    if not ratios.size:
        return Finding("4", scope, INCONCLUSIVE, f"no baseline run dumped a rollout batch; {gain}")
    ratio = float(np.nanmean(ratios)) if np.isfinite(ratios).any() else None
    said = verdict_for(ratio, PredictorThresholds())[0]
    shown = "undefined (every prompt zero-variance)" if ratio is None else f"{ratio:.2f}"
    text = f"ratio {shown} over {ratios.size} baseline runs: {said}; {gain}"
    seeds = int(min(effect["base_n"], effect["filt_n"]))
    if seeds < MIN_SEEDS:
        return Finding("4", scope, INCONCLUSIVE, f"fewer than {MIN_SEEDS} seeds in an arm; {text}")
    result = outcome(said, effect["lo"], effect["hi"], seeds)  # the rule the predictor's hit rate pools
    if result not in (HIT, MISS):
        return Finding("4", scope, INCONCLUSIVE, text)
    return Finding("4", scope, REPRODUCED if result == HIT else NOT_REPRODUCED, text)


def untested(summary: pd.DataFrame) -> dict[tuple[str, str], str]:
    """Each (task, variant) with finished runs that cannot test the story, and why: it needs runs without and
    with the filter, and at least 2 seeds with results in every filter setting. The other scopes are tested."""
    done = summary[summary["final_success"].notna()]
    gaps: dict[tuple[str, str], str] = {}
    for scope, group in done.groupby(["task", "variant"], sort=True):
        if not (group["filtered"].eq(True).any() and group["filtered"].eq(False).any()):
            gaps[scope] = "needs finished runs both without and with the filter"
            continue
        seeds = group.groupby("filter")["run_id"].nunique()
        if seeds.min() < 2:
            gaps[scope] = f"every filter setting needs at least 2 seeds with results; {seeds.idxmin()} has {seeds.min()}"
    return gaps


def testable(summary: pd.DataFrame, gaps: dict[tuple[str, str], str] | None = None) -> str:
    """'' when at least one (task, variant) of the sweep can test the story (``gaps``: :func:`untested`'s, computed
    when not given), else why not."""
    done = summary[summary["final_success"].notna()]
    if not (done["filtered"].eq(True).any() and done["filtered"].eq(False).any()):
        return "the sweep needs finished runs both without and with the filter"
    gaps = untested(summary) if gaps is None else gaps
    if len(gaps) < done.groupby(["task", "variant"]).ngroups:
        return ""
    return "; ".join(f"{_scope(*scope)}: {why}" for scope, why in gaps.items())


def science(data: RunData, summary: pd.DataFrame, predictions: pd.DataFrame | None = None,
            n_boot: int = N_BOOT) -> Science:
    """Every finding's verdict (module docstring) for a sweep; ``predictions``: the predictor on the baseline
    runs' first rollout batches (:func:`analysis.stats.predictor.predictions`), or None when not read."""
    from analysis.stats.collapse_alert_calibration import alert_summary
    from analysis.stats.early_warning import early_warning
    from analysis.stats.summary import metric_summary

    alert = alert_summary(data)  # whether or not the findings can be tested: the terminal prints it
    gaps = untested(summary)
    reason = testable(summary, gaps)
    if reason:
        return Science(reason=reason, alert=alert)
    data = with_retrieval_excess(data)
    done = summary[summary["final_success"].notna() & summary["filtered"].notna()]
    fall = falls(data, (names.MI_ZSCORE_EMA, names.RETRIEVAL_EXCESS, names.ENTROPY))
    leads = early_warning(data)
    means = metric_summary(data, [names.MI_ZSCORE_EMA, names.ENTROPY], "mean")
    finals = metric_summary(data, [names.MI_ZSCORE_EMA], "final")
    effects = filter_effect(summary, n_boot)
    state = diagnostics_state(data)
    findings: list[Finding] = []
    for (task, variant), group in done.groupby(["task", "variant"], sort=True):
        if (task, variant) in gaps:
            continue
        scope = _scope(task, variant)
        base = group[~group["filtered"].astype(bool)]
        if state != "logged":
            findings += [Finding(key, scope, INCONCLUSIVE, DIAGNOSTICS_CAUSE[state]) for key in ("1a", "1b")]
        else:
            findings.append(_finding_1a(scope, fall.reindex(base["run_id"]), n_boot))
            findings.append(_finding_1b(scope, leads[leads["run_id"].isin(base["run_id"])], n_boot))
        for _, effect in effects[(effects["task"] == task) & (effects["variant"] == variant)].iterrows():
            treated = group[group["filter"] == effect["filter"]]
            mi = None
            if names.MI_ZSCORE_EMA in finals.columns:
                mi = tuple(finals[names.MI_ZSCORE_EMA].reindex(arm["run_id"]).to_numpy(dtype=float)
                           for arm in (base, treated))
                mi = mi if all(np.isfinite(arm).any() for arm in mi) else None
            success = tuple(arm["final_success"].to_numpy(dtype=float) for arm in (base, treated))
            counts = f"{effect['base_n']} vs {effect['filt_n']} seeds"
            findings.append(_finding_2(_scope(task, variant, effect["filter"]), success, mi, counts))
        joined = group.set_index("run_id")[["final_success"]].join(means, how="left")
        findings.append(_finding_3(scope, joined, n_boot))
        ratios = None
        if predictions is not None:
            first = predictions.sort_values("step").drop_duplicates("run_id")
            ratios = first.loc[first["run_id"].isin(base["run_id"]), "ratio"].to_numpy(dtype=float)
        for _, effect in effects[(effects["task"] == task) & (effects["variant"] == variant)].iterrows():
            findings.append(_finding_4(_scope(task, variant, effect["filter"]), ratios, effect))
    order = list(CLAIMS)
    findings.sort(key=lambda f: order.index(f.key))
    tested = done[~done.set_index(["task", "variant"]).index.isin(list(gaps))]
    return Science(findings=findings, effects=effects, trends=arm_trends(data, tested),
                   untested=[f"{_scope(*scope)}: {why}" for scope, why in gaps.items()], alert=alert)
