"""Whether the MI instrument has been shown to move on a task (issue 29 item 3): the controls' recorded rates,
judged by the one verdict module, become one line per task in `orch report`'s early-warning section."""

from __future__ import annotations

import pytest

from analysis.stats.controls import control_lines, load_record
from analysis.stats.verdicts import NOT_SHOWN, SHOWN, control_verdict, wilson


def test_wilson_interval_matches_the_textbook_values() -> None:
    low, high = wilson(8, 8)
    assert low == pytest.approx(0.6756, abs=1e-3) and high == 1.0
    low, high = wilson(0, 8)
    assert low == 0.0 and high == pytest.approx(0.3244, abs=1e-3)
    assert wilson(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize(("counts", "verdict", "said"), [
    ((8, 8, 0, 8), SHOWN, "detected in 8/8 runs"),
    ((8, 8, 4, 8), NOT_SHOWN, "the intervals overlap"),
    ((2, 2, 0, 2), NOT_SHOWN, "at least 3 each"),
])
def test_the_control_verdict_needs_detections_clear_of_false_alarms(counts, verdict, said) -> None:
    got, reason = control_verdict(*counts)
    assert got == verdict and said in reason, reason


def test_report_lines_say_where_the_instrument_was_and_was_not_shown_to_move() -> None:
    record = {"frozenlake": {"detected": 8, "planted": 8, "false_alarms": 0, "negative": 8, "setting": "tiny",
                             "source": "bench"}}
    frozen, sokoban = control_lines(["sokoban", "frozenlake", "frozenlake"], record)
    assert frozen.startswith("MI instrument on frozenlake: shown to move") and "(bench)" in frozen
    assert "a flat MI curve rules out a total collapse" in frozen
    assert sokoban.startswith("MI instrument on sokoban: not shown to move -- no archived control on this task")
    assert "bench_collapse_alert.py --record" in sokoban


def test_the_shipped_record_loads() -> None:
    record = load_record()
    assert record, "the controls are re-derived from the archived graded plants (bench_collapse_alert.py --record)"
    for task, entry in record.items():
        assert {"detected", "planted", "false_alarms", "negative", "source"} <= set(entry), task
        assert "docs/results/controls_graded" in entry["source"]  # archived runs, not the legacy rule's 6-step runs
