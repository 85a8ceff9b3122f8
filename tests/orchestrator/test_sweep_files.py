"""The shipped sweep files validate against conf/ (or fail only for the conf key they are known to wait for),
and the `cpu` profile turns every paper sweep into a torch-backend rehearsal."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import OrchError
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
FILES = sorted(path.name for path in SWEEPS.glob("*.yaml") if path.name != "profiles.yaml")
# Sweep files that need a config key conf/ does not have yet, and the error that says so. When conf/ gains the
# key, the test below fails: delete the entry.
WAITING_FOR_CONF = {
    "table6.yaml": "unknown filter option 'quartile'",
    "table7.yaml": "unknown filter option 'trajectory'",
}
EXPECTED_CELLS = {"demo.yaml": 4, "table4.yaml": 216, "table5.yaml": 21, "topp.yaml": 84, "slip.yaml": 42}


def test_every_required_sweep_file_is_shipped() -> None:
    required = {"demo.yaml", "table4.yaml", "table5.yaml", "table6.yaml", "table7.yaml", "topp.yaml", "slip.yaml"}
    assert required <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_sweep_file_validates(name: str, workdir: Path) -> None:
    if name in WAITING_FOR_CONF:
        with pytest.raises(OrchError) as info:
            build_plan(load_sweep(SWEEPS / name))
        assert WAITING_FOR_CONF[name] in str(info.value), (
            f"{name} no longer fails for the conf key it waited for; remove it from WAITING_FOR_CONF: {info.value}"
        )
        return
    plan = build_plan(load_sweep(SWEEPS / name))
    if name in EXPECTED_CELLS:
        assert len(plan.cells) == EXPECTED_CELLS[name]
    if name == "demo.yaml":
        plan.check_submittable()
        assert {cell.backend for cell in plan.cells} == {"torch"}
    else:
        with pytest.raises(OrchError, match="not implemented yet"):
            plan.check_submittable()
    assert not (workdir / ".orch").exists()


@pytest.mark.parametrize("name", [name for name in FILES if name not in WAITING_FOR_CONF and name != "demo.yaml"])
def test_cpu_profile_rehearses_a_paper_sweep(name: str) -> None:
    plan = build_plan(load_sweep(SWEEPS / name, profile="cpu"))
    plan.check_submittable()
    assert {cell.backend for cell in plan.cells} == {"torch"}
    assert all(cell.resources.gpus_per_node == 0 for cell in plan.cells)
    assert {cell.settings["model"] for cell in plan.cells} == {"tiny"}


def test_table4_rows_match_the_paper() -> None:
    plan = build_plan(load_sweep(SWEEPS / "table4.yaml"))
    rows = {(cell.axis, cell.settings.get("algorithm"), cell.settings.get("model.path")) for cell in plan.cells}
    assert len(rows) == 9  # PPO/3B base + 3 algorithms + 3 sizes + 2 model types (the 2 VL rows wait for conf)
    assert {cell.settings["task"] for cell in plan.cells} == {"sokoban", "frozenlake", "metamathqa", "countdown"}
    assert {cell.seed for cell in plan.cells} == {1, 2, 3}
