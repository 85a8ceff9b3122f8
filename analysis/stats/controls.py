"""Whether the MI instrument has been shown to move on a task: its controls re-derived from archived runs under the
shipped alert rule (the ``controls`` section of the alert's rates file, `recipes/stats/collapse_alert_rates.yaml`, written by
`benchmarks/bench_collapse_alert.py --record`: the total plants and the strength-0 runs of the archived graded
plants), judged by `analysis.stats.verdicts.control_verdict`. `orch report` prints one line per task of a sweep, so a flat
MI curve is read as "no collapse" only where a planted collapse was seen. (Until issue 56 these came from
`analysis/controls.yaml`: the legacy rule on 6-step runs that were not kept.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.stats.verdicts import SHOWN, control_verdict
from recipes.stats.collapse_alert import RATES, recorded_rates

RECORD = RATES


def load_record(path: Path = RECORD) -> dict[str, dict[str, Any]]:
    """Task -> its control results ({} when nothing is recorded)."""
    return recorded_rates(path).get("controls") or {}


def control_lines(tasks, record: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """One line per task: whether the MI proxies have been shown to move there, and where that comes from."""
    record = load_record() if record is None else record
    lines = []
    for task in sorted({str(task) for task in tasks}):
        entry = record.get(task)
        if entry is None:
            lines.append(f"MI instrument on {task}: not shown to move -- no archived control on this task (graded "
                         f"plants: sweeps/controls_graded.yaml, then python benchmarks/bench_collapse_alert.py --record); "
                         "a flat MI curve here is not yet evidence that nothing collapsed")
            continue
        verdict, reason = control_verdict(entry["detected"], entry["planted"], entry["false_alarms"],
                                          entry["negative"])
        reading = ("a flat MI curve rules out a total collapse (weaker ones: the alert's measured rates)"
                   if verdict == SHOWN else "a flat MI curve here is not yet evidence that nothing collapsed")
        lines.append(f"MI instrument on {task}: {verdict} -- {reason}; {entry.get('setting', '')} "
                     f"({entry.get('source', 'benchmarks/bench_controls.py')}); {reading}")
    return lines
