"""The collapse alert's rule, chosen offline from runs whose answer is known (issue 46 item 3;
`analysis.alert_calibration`): replay every candidate rule over the archived graded plants
(sweeps/controls_graded.yaml) and honest runs (sweeps/repro_long.yaml), choose on the even seeds, report on the odd.

    python benchmarks/bench_alert_rules.py                      # every archive under docs/results/
    python benchmarks/bench_alert_rules.py --live controls_graded=sqlite:////work/plants/mlflow.db
    python benchmarks/bench_alert_rules.py --record             # write analysis/alert_rates.yaml

Prints: the replay's fidelity (each run's own rule, replayed, fires where the run logged it fired), the honest runs
that collapsed by success or format validity (neither false alarms nor detections), the ROC frontier on the choosing
half, the chosen rule's rates on the held-out half and on every run, per task and per strength, and the same for
the rule the runs were made with (`recipes.stats.collapse.LEGACY_RULE`) and for the rule `conf/train.yaml` ships. `--live
SWEEP=URI` reads a sweep's finished runs from its tracking store instead of its archive (plants still running).
`--record` writes the shipped rule's rates into analysis/alert_rates.yaml, which every report prints beside the alert.
Seconds on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path

import yaml

from analysis import alert_calibration as ac
from analysis.archive import read_archives
from recipes.stats.collapse import LEGACY_RULE, CollapseRule

ROOT = Path(__file__).resolve().parents[1]


def load_cells(live: dict[str, str]) -> tuple[list[ac.Cell], list[str]]:
    """Every archived sweep's cells (a `--live` sweep from its store instead) and a line per source."""
    cells, sources = [], []
    for sweep_dir in sorted((ROOT / "docs" / "results").iterdir()):
        sweep = sweep_dir.name
        if sweep in live:
            from analysis.mlflow_query import RunQuery
            from analysis.mlflow_store import load_runs

            data = load_runs(RunQuery(sweep=sweep), tracking_uri=live[sweep])
            where = live[sweep]
        else:
            data, _ = read_archives(sorted(p for p in sweep_dir.iterdir() if p.is_dir()), sweep)
            where = str(sweep_dir.relative_to(ROOT))
        data = dataclasses.replace(data, runs=data.runs[data.runs["status"] == "FINISHED"])  # whole runs only
        found = ac.cells_from(data, sweep)
        cells += found
        if found:
            sources.append(f"{where} ({len(found)} runs)")
    return cells, sources


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
        print("| " + " | ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in row) + " |")
    chosen, _ = ac.choose(chosen_on)
    show("chosen", chosen, chosen_on, held_out, cells)
    show("legacy (the rule the runs were made with)", LEGACY_RULE, chosen_on, held_out, cells)
    shipped = CollapseRule()
    show("shipped (conf/train.yaml)", shipped, chosen_on, held_out, cells)
    if args.record:
        record = {
            "rule": shipped.model_dump(),
            "held_out": ac.rates_record(ac.rates(shipped, held_out)),
            "all": ac.rates_record(ac.rates(shipped, cells)),
            "legacy": {"rule": LEGACY_RULE.model_dump(),
                       "all": ac.rates_record(ac.rates(LEGACY_RULE, cells))},
            "by_task": {task: ac.rates_record(ac.rates(shipped, [c for c in cells if c.task == task]))
                        for task in sorted({c.task for c in cells})},
            "sources": sources,
            "source": f"python benchmarks/bench_alert_rules.py --record, {datetime.date.today().isoformat()}",
        }
        header = ("# The collapse alert's measured error rates (analysis.alert_calibration), written by\n"
                  "# `python benchmarks/bench_alert_rules.py --record`: every report prints them beside the alert.\n")
        ac.RECORD.write_text(header + yaml.safe_dump(record, sort_keys=False), encoding="utf-8")
        print(f"\nwrote {ac.RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
