"""Whether the MI instrument has been shown to move on a task: the recorded results of its controls
(`analysis/controls.yaml`, written by `benchmarks/bench_controls.py --record`), judged by
`analysis.verdicts.control_verdict`. `orch report` prints one line per task of a sweep, so a flat MI curve is read as
"no collapse" only where a planted collapse was seen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.verdicts import SHOWN, control_verdict

RECORD = Path(__file__).with_name("controls.yaml")


def load_record(path: Path = RECORD) -> dict[str, dict[str, Any]]:
    """Task -> its control results ({} when nothing is recorded)."""
    import yaml

    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def control_lines(tasks, record: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """One line per task: whether the MI proxies have been shown to move there, and where that comes from."""
    record = load_record() if record is None else record
    lines = []
    for task in sorted({str(task) for task in tasks}):
        entry = record.get(task)
        if entry is None:
            lines.append(f"MI instrument on {task}: not shown to move -- no control has run on this task (python "
                         f"benchmarks/bench_controls.py --task {task} --record); a flat MI curve here is not yet "
                         "evidence that nothing collapsed")
            continue
        verdict, reason = control_verdict(entry["detected"], entry["planted"], entry["false_alarms"],
                                          entry["negative"])
        reading = ("a flat MI curve rules out a total collapse (weaker ones: the alert's measured rates)"
                   if verdict == SHOWN else "a flat MI curve here is not yet evidence that nothing collapsed")
        lines.append(f"MI instrument on {task}: {verdict} -- {reason}; {entry.get('setting', '')} "
                     f"({entry.get('source', 'benchmarks/bench_controls.py')}); {reading}")
    return lines
