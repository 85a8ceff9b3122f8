"""The Std(RV)/Mean(RV) predictor's hit rate, held out, on orch's own archived sweeps (`analysis.stats.predictor_record`):
for every sweep under docs/results with both filter arms, every condition (sweep, task, variant, filter setting):
its readings (RV as var and as std; first batch and first 3), its filter gain with its 95% interval and what that
shows against a gain of interest of 5 points; the split into a fit and a held-out half; per reading the held-out
hits, misses and net with the shipped and the refitted thresholds; the trivial rules; and the power calculation
(seeds per arm for a 5- and a 10-point gain from each sweep's seed-to-seed spread). Reads only the archives: seconds.

    python benchmarks/bench_predictor.py [--results docs/results] [--record] [--figure FILE.png]

`--record` writes analysis/stats/predictor_record.yaml of the checkout this file is in (not of an installed orch), which
reports and `orch predict-filter-gain` print beside the verdict; `--figure` draws the calibration curve (predicted
ratio vs measured gain with intervals, the kept reading) as a PNG (matplotlib) for docs/statistics.md.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))  # this checkout's analysis/, not an installed one

from analysis.stats.predictor_record import (  # noqa: E402
    COMMAND,
    KEPT,
    READINGS,
    RESULTS,
    hit_rate_line,
    make_record,
    measure,
    power_table,
    record_path,
    write_record,
)
from orchlib.errors import OrchError  # noqa: E402


def draw(record: dict, path: Path) -> Path:
    """The calibration curve as a PNG: the kept reading's ratio (x) against the measured gain with its interval
    (y), fit half hollow, held-out half filled; the thresholds dotted, 0 and the gain of interest dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    rows = [row for row in record["rows"] if row["ratios"].get(KEPT) is not None]
    for half, face in (("fit", "none"), ("held out", None)):
        chosen = [row for row in rows if row["half"] == half]
        if not chosen:
            continue
        x = [row["ratios"][KEPT] for row in chosen]
        y = [row["gain"] for row in chosen]
        err = [[row["gain"] - row["lo"] for row in chosen], [row["hi"] - row["gain"] for row in chosen]]
        axes.errorbar(x, y, yerr=err, fmt="o", capsize=3, color="#1f77b4", mfc=face, label=f"{half} half")
        for row in chosen:
            axes.annotate(f"{row['task']} {'' if row['variant'] == 'base' else row['variant']} {row['filter']}",
                          (row["ratios"][KEPT], row["gain"]), fontsize=6, xytext=(4, 2), textcoords="offset points")
    for x in (record["thresholds"]["hurts_below"], record["thresholds"]["helps_above"]):
        axes.axvline(x, color="grey", linestyle=":")
    axes.axhline(0, color="grey")
    axes.axhline(record["delta"], color="grey", linestyle="--", linewidth=0.8)
    axes.set_xlabel("std(RV)/mean(RV), RV as variance, first batch (mean over baseline seeds)")
    axes.set_ylabel("filter gain, final success points (95% CI)")
    axes.set_title("The predictor, tested: predicted ratio vs measured filter gain", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of archived sweeps (<sweep>/<session>/)")
    parser.add_argument("--record", action="store_true", help="write analysis/stats/predictor_record.yaml of this checkout")
    parser.add_argument("--figure", type=Path, help="write the calibration curve as a PNG here")
    args = parser.parse_args()
    try:
        rows, skipped = measure(args.results)
    except OrchError as err:
        sys.exit(f"bench_predictor: {err}")
    source = f"{COMMAND}, {datetime.date.today().isoformat()}"
    if args.results.resolve() != RESULTS:
        source = f"{COMMAND} --results {args.results}, {datetime.date.today().isoformat()}"
    record = make_record(rows, skipped, source)
    for row in record["rows"]:
        ratios = " ".join(f"{name} {'-' if value is None else f'{value:.2f}'}" for name, value in row["ratios"].items())
        print(f"{row['half']:>8} {row['sweep']:>14} {row['task']:>10} {row['variant']:>18} {row['filter']:>12}  "
              f"{ratios}  zero-var {row['zero_variance_share']}  gain {row['gain']:+.2f} [{row['lo']:+.2f}, "
              f"{row['hi']:+.2f}] ({row['base_n']} vs {row['filt_n']} seeds): {row['shown']}"
              + (f"; {row['verdict']} -> {row['outcome']}" if "verdict" in row else ""))
    for sweep, why in skipped.items():
        print(f"left out {sweep}: {why}")
    for name in READINGS:
        reading = record["readings"][name]
        shipped, refit = reading["held_out"]["shipped"], reading["held_out"]["refit"]
        cuts = reading["refit"]
        print(f"{name:>10}: {reading['conditions']} conditions; held out, shipped cuts: {shipped['hits']} hits "
              f"{shipped['misses']} misses of {shipped['n']} (net {shipped['net']:+d}); refit on the fit half "
              f"(< {cuts['hurts_below']:g} / >= {cuts['helps_above']:g}; {cuts['why']}): net {refit['net']:+d}; every "
              f"condition, shipped cuts: net {reading['all_shipped']['net']:+d}")
    for name, rule in record["trivial"].items():
        counts = rule["held_out"]
        print(f"trivial rule '{name}' held out: {counts['hits']} hits {counts['misses']} misses (net {counts['net']:+d})"
              f"; the predictor beats it by {record['beats'][name]:+d}")
    print(f"best held-out reading on the {record['best_on']} held-out conditions every reading covers: "
          f"{record['best'] or 'none decided'} (kept: {KEPT})")
    for sweep in sorted({row["sweep"] for row in rows} | set(skipped)):
        from analysis.stats.summary import summarize
        from analysis.stores.archive import evidence_sessions, read_archives

        sessions = evidence_sessions(args.results / sweep)
        if not sessions:
            continue
        data, _ = read_archives(sessions, sweep)
        for power in power_table(summarize(data)):
            print(f"power {sweep} {power['task']} {power['variant']} {power['filter']}: sd none {power['sd_base']}, "
                  f"filtered {power['sd_filtered']} ({power['seeds']} seeds) -> seeds per arm for 5 points "
                  f"{power['seeds_for_5']}, for 10 points {power['seeds_for_10']}")
    print(hit_rate_line(record))
    if args.figure:
        print(f"figure: {draw(record, args.figure)}")
    if args.record:
        print(f"recorded in {write_record(record, record_path(CHECKOUT))}")


if __name__ == "__main__":
    main()
