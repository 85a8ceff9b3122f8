"""What the docs say about a sweep file is what planning that file gives (`build_plan`, which `orch sweep FILE
--dry-run` counts): every row of docs/sweeps.md's table of sweep files -- its cells, and the seeds, steps, tasks and
task names its description quotes -- and the cell counts the README and docs/sweeps.md quote in their text."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from orchestrator.plan import Plan, build_plan
from orchestrator.spec import load_sweep

REPO = Path(__file__).resolve().parents[2]
SWEEPS_MD = REPO / "docs" / "sweeps.md"
TASK_NAMES = {"Sokoban": "sokoban", "FrozenLake": "frozenlake", "Countdown": "countdown", "MetaMathQA": "metamathqa",
              "SearchQA": "searchqa", "WebShop": "webshop", "DeepCoder": "deepcoder"}


@functools.cache
def plan_of(name: str, profile: str | None = None) -> Plan:
    return build_plan(load_sweep(REPO / "sweeps" / name, profile=profile))


def table_rows() -> list[tuple[list[str], str, str]]:
    """(sweep files, description, cells column) of each row of docs/sweeps.md naming a sweep file first."""
    rows = []
    for line in SWEEPS_MD.read_text().splitlines():
        if line.startswith("| `sweeps/"):
            first, description, cells = (cell.strip() for cell in line.strip("|").split(" | "))
            rows.append((re.findall(r"sweeps/(\w+\.yaml)", first), description, cells))
    return rows


ROWS = table_rows()


def quoted_cells(column: str) -> list[int]:
    """The cell counts of a row's last column: `24, 42`, `12`, or `(3 + 3) × 3 = 18` (whose arithmetic must hold)."""
    if "=" in column:
        formula, total = (part.strip() for part in column.rsplit("=", 1))
        assert re.fullmatch(r"[\d\s()+×]+", formula), column
        assert eval(formula.replace("×", "*"), {"__builtins__": {}}) == int(total), column  # digits, + and * only
        return [int(total)]
    return [int(part) for part in column.split(",")]


def test_the_table_names_every_sweep_file_it_should() -> None:
    named = {name for files, _, _ in ROWS for name in files}
    assert {"table4.yaml", "repro_tiny.yaml", "predictor_grid.yaml"} <= named
    assert all((REPO / "sweeps" / name).is_file() for name in named)


@pytest.mark.parametrize(("files", "description", "cells"), ROWS, ids=[", ".join(files) for files, _, _ in ROWS])
def test_each_row_quotes_what_planning_the_file_gives(files: list[str], description: str, cells: str,
                                                      workdir: Path) -> None:
    plans = [plan_of(name) for name in files]
    assert quoted_cells(cells) == [len(plan.cells) for plan in plans]
    configs = [cell.resolved.config for plan in plans for cell in plan.cells]
    tasks = {config.task.name for config in configs}
    for seeds in re.findall(r"(\d+) seeds", description):
        assert all(len({cell.seed for cell in plan.cells}) == int(seeds) for plan in plans), description
    for steps in re.findall(r"(\d+) steps", description):
        assert {config.trainer.total_steps for config in configs} == {int(steps)}, description
    for count in re.findall(r"(\d+) (?:tasks|environments)", description):
        assert all(len({cell.resolved.config.task.name for cell in plan.cells}) == int(count) for plan in plans)
    named = {task for word, task in TASK_NAMES.items() if re.search(rf"\b{word}\b", description)}
    assert named <= tasks, f"{description}: names {sorted(named - tasks)}, which the file does not run"


TEXT_CLAIMS = [  # (doc, the sentence's pattern with the count as its group, sweep file, profile)
    ("docs/sweeps.md", r"`orch sweep sweeps/table4\.yaml --profile cpu` has (\d+) cells", "table4.yaml", "cpu"),
    ("docs/sweeps.md", r"stays 4 cells of its own \((\d+) in all\)", "table4.yaml", "cpu-verl"),
    ("README.md", r"Table 4's (\d+) cells", "table4.yaml", None),
    ("README.md", r"demo sweep.*?\((\d+) cells ×", "demo.yaml", None),
    ("README.md", r"`sweeps/repro_tiny\.yaml` is the multi-seed\s+version \((\d+) cells", "repro_tiny.yaml", None),
]


@pytest.mark.parametrize(("doc", "pattern", "name", "profile"), TEXT_CLAIMS, ids=[c[2] + f" ({c[0]})" for c in TEXT_CLAIMS])
def test_cell_counts_quoted_in_the_text(doc: str, pattern: str, name: str, profile: str | None, workdir: Path) -> None:
    found = re.search(pattern, (REPO / doc).read_text(), re.DOTALL)
    assert found, f"{doc} no longer says {pattern!r}: update the claim or this test"
    assert int(found.group(1)) == len(plan_of(name, profile).cells)


def test_the_demo_logs_what_its_report_answers_from(workdir: Path) -> None:
    """Issue 59 item 1 shortened the demo (6 steps); each cell must still log what the report's three answers read:
    both filter arms, validation at the last step (final success: did filtering help), the MI proxies on at least the
    trend test's minimum of steps (did MI collapse), and a rollout batch (what the predictor says)."""
    from analysis.stats.trend import MIN_POINTS

    configs = [cell.resolved.config for cell in plan_of("demo.yaml").cells]
    assert {config.filter.name for config in configs} == {"none", "top_p"}
    for config in configs:
        steps = range(1, config.trainer.total_steps + 1)
        assert "collapse" in config.hooks
        assert sum(config.diagnostics.due(step) for step in steps) >= MIN_POINTS
        assert config.trainer.val_every and config.trainer.total_steps % config.trainer.val_every == 0
        assert any(step % config.trainer.dump_every == 0 for step in steps)


def test_readme_demo_line_matches_the_demo_sweep(workdir: Path) -> None:
    """README command 1: the demo's task and steps per cell."""
    found = re.search(r"the tiny\s+code-built model on (\w+), .*?\(\d+ cells × (\d+) PPO steps", (REPO / "README.md").read_text(),
                      re.DOTALL)
    assert found
    configs = [cell.resolved.config for cell in plan_of("demo.yaml").cells]
    assert {config.task.name for config in configs} == {TASK_NAMES[found.group(1)]}
    assert {config.trainer.total_steps for config in configs} == {int(found.group(2))}
    assert {config.algorithm.name for config in configs} == {"ppo"}
