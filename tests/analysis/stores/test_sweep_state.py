"""The orch state store's view of a sweep in the report: states, reasons, cells without an MLflow run."""

from __future__ import annotations

import json

import pytest

from analysis.reports.report import build_report
from analysis.stores.sweep_state import store_cells, store_notes
from orchestrator.api import sweep_cells
from orchestrator.states import State
from orchestrator.store import Store


@pytest.fixture
def demo_orch_store(demo_store, tmp_path):
    """An orch store for the demo sweep: 16 finished cells, the failed one (with its reason), the scheduled one
    (queued) and one pending cell that never got an MLflow run."""
    url = f"sqlite:///{tmp_path / 'orch.db'}"
    store = Store.open(url)
    sweep = store.save_sweep({"name": "demo", "spec_path": "sweeps/demo.yaml", "spec_text": "name: demo",
                              "executor": "local", "run_dir": str(tmp_path)})
    runs = {f"{t}-{a}-{f}-{s}": run_id for (t, a, f, s), run_id in demo_store.run_ids.items()}
    runs["sokoban-ppo-True-2"] = demo_store.failed_run
    runs["frozenlake-grpo-False-2"] = demo_store.scheduled_run
    digests = [*runs, "countdown-ppo-False-0"]
    store.add_cells(sweep.id, [
        {"digest": digest, "position": i, "axis": None, "seed": 0, "backend": "torch", "settings_json": "{}",
         "overrides_json": "[]", "varied_json": json.dumps({"task": digest.split("-")[0]}), "resources_json": "{}"}
        for i, digest in enumerate(digests)
    ])
    ids = {row.digest: row.id for row in store.cell_rows(sweep.id)}
    store.set_run_ids({ids[digest]: run_id for digest, run_id in runs.items()})
    done = [ids[d] for d in runs if d not in ("sokoban-ppo-True-2", "frozenlake-grpo-False-2")]
    # Through the transitions `orchestrator.states.TRANSITIONS` allows: pending -> queued -> running -> ended.
    store.mark([ids[d] for d in runs], State.QUEUED, "submitted", only_states=[State.PENDING])
    store.mark([*done, ids["sokoban-ppo-True-2"]], State.RUNNING, "", only_states=[State.QUEUED])
    store.mark(done, State.FINISHED, "all steps done", only_states=[State.RUNNING])
    store.mark([ids["sokoban-ppo-True-2"]], State.FAILED, "RuntimeError: CUDA out of memory\ntraceback ...",
               only_states=[State.RUNNING])
    store.dispose()
    return url


def test_store_cells_and_notes(demo_orch_store, tmp_path):
    cells = store_cells(sweep_cells("demo", demo_orch_store))
    assert len(cells) == 19
    assert cells["state"].value_counts().to_dict() == {"finished": 16, "failed": 1, "queued": 1, "pending": 1}
    notes = store_notes(cells)
    assert notes == [
        "cell sokoban-pp (task=sokoban): failed — RuntimeError: CUDA out of memory",
        "cell frozenlake (task=frozenlake): queued — submitted",
        "cell countdown- (task=countdown): pending (no MLflow run)",
    ]
    assert store_cells(sweep_cells("other", demo_orch_store)) is None
    assert store_cells(sweep_cells("demo", f"sqlite:///{tmp_path / 'absent.db'}")) is None


def test_report_takes_states_and_reasons_from_the_store(demo_store, demo_orch_store):
    report = build_report("demo", demo_store.uri, cells=sweep_cells("demo", demo_orch_store), n_boot=50,
                          rollouts=False)
    assert len(report.notes) == 3  # from the store; the MLflow runs of those cells are not described twice
    assert any("CUDA out of memory" in note for note in report.notes)
    assert any("no MLflow run" in note for note in report.notes)
    section = next(section for section in report.sections if section.title == "Sweep overview")
    overview = "".join(block for block in section.blocks if isinstance(block, str))
    assert "cells by orch state" in overview
