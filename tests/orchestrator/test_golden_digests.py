"""The identity of every shipped sweep's cells is pinned: a refactoring that changed how a config is hashed would
make users' stores see new cells (and rerun finished work). `golden_digests.json` was captured before the typed
`TrainConfig` replaced the dict hashing; regenerate it only for a deliberate change of identity, with a note in the
changelog, by running this file with `ORCH_REGENERATE_GOLDEN=1`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from recipes.config.resolve import load_config

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
GOLDEN = Path(__file__).with_name("golden_digests.json")
PROFILES = ["default", *sorted(yaml.safe_load((SWEEPS / "profiles.yaml").read_text()))]
CASES = [f"{path.name}:{profile}" for path in sorted(SWEEPS.glob("*.yaml")) if path.name != "profiles.yaml"
         and "study" not in yaml.safe_load(path.read_text())
         for profile in PROFILES]


def _digests(case: str) -> list[str]:
    name, profile = case.split(":")
    plan = build_plan(load_sweep(SWEEPS / name, profile=None if profile == "default" else profile))
    for cell in plan.cells:  # the config its job runs (stored with the cell, read back) is the cell planned (#47)
        assert load_config(*cell.resolved.stored()).digest() == cell.digest, f"{case}: cell {cell.digest}"
    return [cell.digest for cell in plan.cells]


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache root for every case of this file: no conf-tree cache from another version, and the trees resolved
    for one sweep are reused by the next (the cache is keyed by a fingerprint of every file in conf/)."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("case", CASES)
def test_cell_digests_are_unchanged(case: str, monkeypatch: pytest.MonkeyPatch, fresh_cache: Path) -> None:
    monkeypatch.setenv("ORCH_CACHE_DIR", str(fresh_cache))
    if os.environ.get("ORCH_REGENERATE_GOLDEN"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[case] = _digests(case)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    assert _digests(case) == json.loads(GOLDEN.read_text())[case]


def test_every_shipped_sweep_is_pinned() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(CASES)


@pytest.mark.parametrize("sweep", ["repro_long", "controls_graded"])
def test_archived_cells_are_still_the_sweeps_cells(sweep: str, monkeypatch: pytest.MonkeyPatch,
                                                   fresh_cache: Path) -> None:
    """`orch sweep sweeps/<sweep>.yaml --done-in docs/results/<sweep>/...` leaves out every archived cell: an
    identity change of conf/ (a new default) must leave these sweeps' cells as they were archived (#46: they pin the
    collapse alert's rule they ran with)."""
    from analysis.stores.archive import finished_cells

    monkeypatch.setenv("ORCH_CACHE_DIR", str(fresh_cache))
    archives = sorted(p for p in (SWEEPS.parent / "docs" / "results" / sweep).iterdir() if p.is_dir())
    archived = finished_cells(archives, sweep)
    planned = {cell.digest for cell in build_plan(load_sweep(SWEEPS / f"{sweep}.yaml")).cells}
    assert archived and archived <= planned
