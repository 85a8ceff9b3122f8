"""The paper verdicts' judge on known truth (issue 56 item 2; `analysis.stats.verdicts.judge`): draw measured runs at
orch's seed counts (3, 5, 10) with noise taken from the archives, the truth equal to the published value and at 1x
and 2x the margin away, run every path of the judge and count how often it errs.

    python benchmarks/bench_judge.py                  # print the rates
    python benchmarks/bench_judge.py --record         # and write analysis/stats/judge_rates.yaml of this checkout

Per path, one case from the paper map (`analysis.paper`), its margin as declared there:

* level: Table 4's PPO Sokoban baseline, 12.9 +- 0.05 (the rounding), runs drawn around the truth with the
  seed-to-seed sd of peak success in the long run (docs/results/repro_long);
* effect: Table 5's 32x4 step-time cut, -41.4 +- 7.65 % (half the spread of the three cuts), two arms of runs whose
  step time varies seed to seed as the long run's does (the judge's t interval on the two arms' difference, in %
  of the base's mean); the truth 1x the margin away lies on the band's edge, which the path's rule ("overlaps the
  band and excludes 0") may call reproduced -- not an error; 2x (one margin outside the band) is the false
  reproduction; also the truth 0 (no effect at all);
* no effect: a Table 4 "+0.0" delta, smallest effect of interest 1 point, two arms with the long run's sd;
* direction: a figure's "+" claim, truth one sd of success above 0 (published), 0 (1x) and one sd below (2x);
* ordering: the share of runs where MI fell first, truth 0.9 (published), 0.5 (1x) and 0.1 (2x), the seed count
  being the runs where both series declined;
* correlation: the MI-vs-success Spearman rho across runs, 0.39 +- 0.005, one (MI, success) pair per run, bivariate
  normal with that rank correlation (`analysis.stats.verdicts.correlation_interval`: Fisher's z with Bonett and Wright's
  variance; 3 runs are too few for it, so every verdict there is inconclusive);
* correlation over (run, step) pairs (recorded apart, as ``correlation, pairs over steps``): the RV-vs-retrieval
  Pearson r, 0.15 +- 0.005, each run a series of (RV, proxy) pairs as long as the long run's, the interval the
  delete-one-run jackknife of z with Student's t.

Rates: P(reproduced | truth 1x / 2x the margin away) and P(not reproduced | truth = published) (and, for the
effect, P(reproduced | no effect)). Each (path, seeds, truth) draws from its own generator, so any subset
recomputes to the same figures (tests/analysis/stats/test_judge_calibration.py checks a subset against the file). About a
minute on one core with the default trials.
"""

from __future__ import annotations

import argparse
import sys
from functools import cache
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]  # the checkout this bench was run from
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analysis import paper  # noqa: E402
from analysis.stats.verdicts import (  # noqa: E402
    CORRELATION,
    DIRECTION,
    EDGE,
    EFFECT,
    LEVEL,
    NO_EFFECT,
    NOT_REPRODUCED,
    ORDER,
    RATES_FILE,
    REPRODUCED,
    Measurement,
    judge,
)

TARGET = ROOT / "analysis" / "stats" / RATES_FILE.name  # --record writes here, not beside the installed module
SEEDS = (3, 5, 10)
TRIALS = 200
SEED = 56
STEPS = "correlation, pairs over steps"  # the correlation path on (run, step) pairs: its own case
PATHS = (LEVEL, EFFECT, NO_EFFECT, DIRECTION, ORDER, CORRELATION, STEPS)
EDGE_LABEL = f"reproduced | truth {EDGE} (1x the margin away)"


@cache
def noise() -> dict[str, float]:
    """From the long run's archives: the pooled seed-to-seed sd of peak success (points) and of the mean step time
    (relative to the cell's mean) within cells (task x filter), and the median number of steps per run with RV."""
    from analysis.stats.summary import summarize
    from analysis.stores.archive import read_archives

    data, _ = read_archives(sorted(p for p in (ROOT / "docs" / "results" / "repro_long").iterdir() if p.is_dir()))
    runs = summarize(data)
    cells = runs.groupby(["task", "filtered"])
    success = float(np.sqrt(cells["peak_success"].var(ddof=1).mean()))
    step = float(np.sqrt((cells["step_time"].std(ddof=1) / cells["step_time"].mean()).pow(2).mean()))
    from analysis import names

    steps = float(data.history(names.RV_STD_MEAN).groupby("run_id").size().median())
    return {"success_sd": round(success, 3), "step_time_rel_sd": round(step, 4), "steps_per_run": int(steps)}


def _value(key: str, **at) -> paper.Value:
    item = paper.BY_KEY[key]
    return next(v for v in item.published if all(v.at.get(k) == x for k, x in at.items()))


def cases() -> dict[str, dict]:
    """Per path: the map value it is calibrated on, its margin and the truths (label -> true value)."""
    sd = noise()
    level = _value("table4", variant="PPO Qwen2.5-3B", task="sokoban", stat="base")
    effect = _value("table5", samples=4, stat="time_change")
    null = _value("table4", variant="PPO Qwen2.5-3B", task="countdown", stat="delta")
    corr = _value("correlations", coefficient="spearman", metric=paper.names.collapse_metric("trajectory",
                                                                                              "mi_zscore"))
    pairs = _value("rv_proxies", metric=paper.names.RETRIEVAL_ACC, coefficient="pearson")
    out = {}
    for kind, value in ((LEVEL, level), (EFFECT, effect), (NO_EFFECT, null), (CORRELATION, corr), (STEPS, pairs)):
        m = value.band
        truths = {"published": value.value, "1x": value.value + m, "2x": value.value + 2 * m}
        if kind == EFFECT:
            truths = {"published": value.value, "1x": value.value + m, "2x": value.value + 2 * m, "no effect": 0.0}
        out[kind] = {"case": f"{value.where}: {value.printed} \u00b1 {m:g}", "published": value.value, "margin": m,
                     "truths": truths}
    out[DIRECTION] = {"case": f"a '+' claim, truth +{sd['success_sd']:g} / 0 / -{sd['success_sd']:g} points",
                      "published": 1.0, "margin": 0.0,
                      "truths": {"published": sd["success_sd"], "1x": 0.0, "2x": -sd["success_sd"]}}
    out[ORDER] = {"case": "MI first in 90% (published) / 50% / 10% of the runs where both declined",
                  "published": 1.0, "margin": 0.0, "truths": {"published": 0.9, "1x": 0.5, "2x": 0.1}}
    return out


def trial(kind: str, case: dict, truth: float, n: int, rng: np.random.Generator) -> str:
    """One draw of `n` runs (per arm) around `truth`, judged by the path `kind`: the verdict."""
    sd = noise()
    published, margin = case["published"], case["margin"]
    if kind == LEVEL:
        x = rng.normal(truth, sd["success_sd"], n)
        measured = Measurement(float(x.mean()), np.nan, np.nan, n, samples=(x,))
    elif kind in (NO_EFFECT, DIRECTION):
        base = rng.normal(50.0, sd["success_sd"], n)
        treated = rng.normal(50.0 + truth, sd["success_sd"], n)
        measured = Measurement(float(treated.mean() - base.mean()), np.nan, np.nan, n, samples=(base, treated))
    elif kind == EFFECT:  # step times in % of the base's mean: the t interval of the difference of the two arms
        base = rng.normal(100.0, 100.0 * sd["step_time_rel_sd"], n)
        treated = rng.normal(100.0 + truth, 100.0 * sd["step_time_rel_sd"], n)
        measured = Measurement(float(treated.mean() - base.mean()), np.nan, np.nan, n, samples=(base, treated))
    elif kind == ORDER:
        first = int(rng.binomial(n, truth))
        measured = Measurement(first / n, np.nan, np.nan, n, counts={"MI first": first, "success first": n - first})
    elif kind == CORRELATION:  # n runs, one (MI, success) pair each, with Spearman's rho `truth`
        rho = 2.0 * np.sin(np.pi * truth / 6.0)  # the normal's Pearson r whose population Spearman rho is `truth`
        pairs = rng.multivariate_normal([0.0, 0.0], [[1.0, rho], [rho, 1.0]], size=n)
        measured = Measurement(float(spearmanr(pairs[:, 0], pairs[:, 1]).statistic), np.nan, np.nan, n,
                               samples=(pairs[:, 0], pairs[:, 1]), coefficient="spearman")
    else:  # STEPS: n runs of (RV, proxy) pairs with Pearson r `truth`, the runs the sample
        steps = sd["steps_per_run"]
        pairs = rng.multivariate_normal([0.0, 0.0], [[1.0, truth], [truth, 1.0]], size=n * steps)
        measured = Measurement(float(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]), np.nan, np.nan, n,
                               samples=(pairs[:, 0], pairs[:, 1], np.repeat(np.arange(n), steps)))
    return judge(published, CORRELATION if kind == STEPS else kind, measured, margin=margin).verdict


def rates(kind: str, n: int, trials: int = TRIALS, seed: int = SEED) -> dict[str, float]:
    """The path's error rates at `n` runs: P(reproduced | truth 1x, 2x away) (and | no effect), P(not reproduced |
    truth = published); every truth from its own generator."""
    case = cases()[kind]
    out = {}
    for index, (label, truth) in enumerate(case["truths"].items()):
        rng = np.random.default_rng([seed, PATHS.index(kind), n, index])
        verdicts = [trial(kind, case, truth, n, rng) for _ in range(trials)]
        if label == "published":
            out["not reproduced | truth = published"] = verdicts.count(NOT_REPRODUCED) / trials
        elif kind == EFFECT and label == "1x":
            out[EDGE_LABEL] = verdicts.count(REPRODUCED) / trials
        else:
            key = "no effect" if label == "no effect" else f"truth {label} the margin away"
            out[f"reproduced | {key}"] = verdicts.count(REPRODUCED) / trials
    return {key: round(value, 4) for key, value in out.items()}


def record(trials: int = TRIALS, seed: int = SEED, paths: tuple[str, ...] = PATHS) -> dict:
    found = cases()
    return {"source": "python benchmarks/bench_judge.py --record", "trials": trials, "seed": seed,
            "noise": noise(), "target": 0.05,
            "paths": {kind: {"case": found[kind]["case"],
                             "rates": {n: rates(kind, n, trials, seed) for n in SEEDS}} for kind in paths}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=TRIALS)
    parser.add_argument("--record", action="store_true", help=f"write {TARGET.relative_to(ROOT)}")
    args = parser.parse_args()
    import yaml

    found = record(args.trials)
    print(f"noise from docs/results/repro_long: {found['noise']}")
    for kind, entry in found["paths"].items():
        print(f"\n{kind}: {entry['case']}")
        for n, rates_at in entry["rates"].items():
            errors = [v for k, v in rates_at.items() if EDGE not in k]
            flag = "" if n < 5 or max(errors) <= 0.05 else "   <- above the 5% target"
            print(f"  {n:2d} runs  " + "  ".join(f"P({k}) {v:.1%}" for k, v in rates_at.items()) + flag)
    if args.record:
        text = yaml.safe_dump(found, sort_keys=False, allow_unicode=True)
        TARGET.write_text("# The judge's error rates on known truth: benchmarks/bench_judge.py --record\n" + text,
                          encoding="utf-8")
        print(f"\nwrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
