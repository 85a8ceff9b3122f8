"""The Std(RV)/Mean(RV) predictor's hit rate on orch's own archived sweeps (`analysis.predictor_record`): for every
sweep under docs/results with both filter arms, per task, the predictor's verdict on the baseline runs' first dumped
rollout batch against the filter gain measured over seeds (final validation success, 95% bootstrap interval), each
a hit, a miss, undecided by the data or no call; then the hit rate over the decided ones with its Wilson interval.
Sweeps without both arms (e.g. controls_graded) are listed as left out. Reads only the archives: a few seconds.

    python benchmarks/bench_predictor.py [--results docs/results] [--record]

`--record` writes the result into analysis/predictor_record.yaml, which `orch report` (per sweep and `--paper`)
prints beside the predictor's verdict.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from analysis.predictor_record import (
    COMMAND,
    RECORD,
    RESULTS,
    hit_rate_line,
    make_record,
    measure,
    write_record,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of archived sweeps (<sweep>/<session>/)")
    parser.add_argument("--record", action="store_true", help=f"write the result into {RECORD.name}")
    args = parser.parse_args()
    rows, skipped = measure(args.results)
    for row in rows:
        print(f"{row['sweep']:>14} {row['task']:>12} {row['variant']:>6} {row['filter']:>8}  ratio {row['ratio']} "
              f"(sd {row['ratio_std']}, {row['ratio_runs']} runs) -> {row['verdict']:<16} gain {row['gain']:+.2f} "
              f"[{row['lo']:+.2f}, {row['hi']:+.2f}] ({row['base_n']} vs {row['filt_n']} seeds): {row['outcome']}")
    for sweep, why in skipped.items():
        print(f"left out {sweep}: {why}")
    source = f"{COMMAND}, {datetime.date.today().isoformat()}"
    if args.results.resolve() != RESULTS:
        source = f"{COMMAND} --results {args.results}, {datetime.date.today().isoformat()}"
    record = make_record(rows, skipped, source)
    print(hit_rate_line(record))
    if args.record:
        print(f"recorded in {write_record(record)}")


if __name__ == "__main__":
    main()
