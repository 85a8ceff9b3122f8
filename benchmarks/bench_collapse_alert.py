"""The collapse alert's rule, chosen offline from runs whose answer is known (issue 46 item 3;
`analysis.stats.collapse_alert_calibration`): replay every candidate rule over the archived graded plants
(sweeps/controls_graded.yaml) and honest runs (sweeps/repro_long.yaml), choose on the even seeds, report on the odd.

    python benchmarks/bench_collapse_alert.py                      # every archive under docs/results/
    python benchmarks/bench_collapse_alert.py --live controls_graded=sqlite:////work/plants/mlflow.db
    python benchmarks/bench_collapse_alert.py --record             # write recipes/stats/collapse_alert_rates.yaml

Prints: the replay's fidelity (each run's own rule, replayed, fires where the run logged it fired), the honest runs
that collapsed by success or format validity (neither false alarms nor detections), the ROC frontier on the choosing
half, the chosen rule's rates on the held-out half and on every run, per task and per strength, and the same for
the rule the runs were made with (`recipes.stats.collapse_alert.LEGACY_RULE`) and for the rule `conf/train.yaml` ships. `--live
SWEEP=URI` reads a sweep's finished runs from its tracking store instead of its archive (plants still running).
`--record` writes the shipped rule's rates into recipes/stats/collapse_alert_rates.yaml of the checkout this file is in (the
training-time alert line and every report print them beside the alert), after everything else has run; from archives
only. tests/analysis/stats/test_collapse_alert_calibration.py fails when the file differs from what this computes, or when the even
seeds choose a rule other than the shipped default. Seconds on one core.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import yaml

from analysis.stats import collapse_alert_calibration as ac
from recipes.stats.collapse_alert import LEGACY_RULE, RATES, CollapseRule

ROOT = Path(__file__).resolve().parents[1]  # the checkout this bench was run from
RESULTS = ROOT / "docs" / "results"
TARGET = ROOT / "recipes" / "stats" / RATES.name  # --record writes here, not beside the installed module


def load_cells(live: dict[str, str]) -> tuple[list[ac.Cell], list[str]]:
    """Every archived sweep's cells (a `--live` sweep from its store instead) and a line per source."""
    loaded = {}
    for sweep, uri in live.items():
        from analysis.stores.mlflow_query import RunQuery
        from analysis.stores.mlflow_store import load_runs

        loaded[sweep] = load_runs(RunQuery(sweep=sweep), tracking_uri=uri)
    return ac.archived_cells(RESULTS, loaded)


def show(title: str, rule: CollapseRule, chosen_on: list[ac.Cell], held_out: list[ac.Cell],
         every: list[ac.Cell]) -> None:
    print(f"\n{title}: {ac.rule_text(rule)}")
    for name, cells in (("choosing half", chosen_on), ("held-out half", held_out), ("every run", every)):
        record = ac.rates(rule, cells)
        print(f"  {name:14s} {record.text()}; by strength {record.by_strength}")
    for task in sorted({cell.task for cell in every}):
        print(f"  {task:14s} {ac.rates(rule, [c for c in every if c.task == task]).text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", nargs="*", default=[], metavar="SWEEP=URI")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    bad = [item for item in args.live if "=" not in item]
    if bad:
        sys.exit(f"bench_collapse_alert.py: --live {bad[0]!r}: expected SWEEP=URI")
    if args.record and not TARGET.parent.is_dir():
        sys.exit(f"bench_collapse_alert.py --record: {TARGET.parent} is not a folder of this checkout")
    if args.record and args.live:
        sys.exit("bench_collapse_alert.py --record: not with --live (the record is made from archived runs only)")
    live = dict(item.split("=", 1) for item in args.live)
    cells, sources = load_cells(live)
    same, checked = ac.replay_fidelity(cells)
    print(f"{len(cells)} runs from {'; '.join(sources)}")
    print(f"replay fidelity: {same}/{checked} runs' own rule fires where the run logged it")
    print("honest runs that collapsed (success halved or format validity -0.2): "
          + (", ".join(c.label for c in cells if not c.planted and ac.collapsed(c)) or "none"))
    chosen_on, held_out = ac.split(cells)
    print("\nROC frontier on the choosing half (even seeds):")
    print(ac.roc_frame(chosen_on).to_string(index=False))
    print("\nROC frontier on every run (markdown):")
    table = ac.roc_frame(cells)
    print("| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns))
    for row in table.itertuples(index=False):
        print("| " + " | ".join(f"{v:.2g}" if isinstance(v, float) else str(v) for v in row) + " |")
    chosen, _ = ac.choose(chosen_on)
    show("chosen", chosen, chosen_on, held_out, cells)
    show("legacy (the rule the runs were made with)", LEGACY_RULE, chosen_on, held_out, cells)
    shipped = CollapseRule()
    show("shipped (conf/train.yaml)", shipped, chosen_on, held_out, cells)
    if chosen != shipped:
        print(f"\nNOTE: the even seeds choose a rule other than the shipped default: {ac.rule_text(chosen)}")
    if args.record:
        record = {**ac.make_record(cells, sources, shipped),
                  "source": f"python benchmarks/bench_collapse_alert.py --record, {datetime.date.today().isoformat()}"}
        header = ("# The collapse alert's measured error rates (analysis.stats.collapse_alert_calibration), written by\n"
                  "# `python benchmarks/bench_collapse_alert.py --record`: the training-time alert line\n"
                  "# (recipes.stats.collapse_alert.rates_line) and every report print them beside the alert.\n")
        text = header + yaml.safe_dump(record, sort_keys=False)
        TARGET.write_text(text, encoding="utf-8")
        print(f"\nwrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
