"""Concurrent use of one store and one MLflow database by real processes started together: first runs in a
fresh folder, `Store.open` of a new store, `orch sweep` of one file, `orch resume` against `orch cancel`. On
SQLite; set ORCH_TEST_POSTGRES_URL to run them on PostgreSQL too. Races are probabilistic: CI runs each scenario
once per backend (`ROUNDS`; ORCH_RACE_ROUNDS=3 repeats them), and benchmarks/bench_races.py runs the same scenarios
at N = 32, with timings."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.orchestrator.races import (
    CELLS,
    POSTGRES_ENV,
    drop_postgres_schema,
    first_runs,
    fresh_postgres_schema,
    resume_and_cancel,
    store_opens,
    sweeps,
)

N = 8
ROUNDS = list(range(1, int(os.environ.get("ORCH_RACE_ROUNDS", "1")) + 1))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "postgresql" and not os.environ.get(POSTGRES_ENV):
        pytest.skip(f"no PostgreSQL: set {POSTGRES_ENV} (bash scripts/setup_postgres.sh starts one and prints it)")
    return request.param


@pytest.fixture
def database(backend: str, tmp_path: Path):
    """`database(name)`: a URL of a new, empty database: an SQLite file in the test folder, or a fresh schema
    of the test PostgreSQL database (dropped afterwards)."""
    made = []

    def make(name: str) -> str:
        if backend == "sqlite":
            return f"sqlite:///{tmp_path / name}"
        made.append(fresh_postgres_schema(os.environ[POSTGRES_ENV]))
        return made[-1]

    yield make
    for url in made:
        drop_postgres_schema(url)


@pytest.mark.parametrize("round_", ROUNDS)
def test_concurrent_first_runs_in_a_fresh_folder_all_succeed(backend: str, database, tmp_path: Path,
                                                             round_: int) -> None:
    uri = None if backend == "sqlite" else database("mlflow")  # SQLite: the default mlflow.db of the folder
    outcome = first_runs(tmp_path, N, uri)
    assert outcome.successes == N, outcome.failures()
    assert outcome.facts == {"experiments": 1, "runs": N, "finished": N}


@pytest.mark.parametrize("round_", ROUNDS)
def test_concurrent_store_opens_of_a_new_store_all_succeed(database, tmp_path: Path, round_: int) -> None:
    outcome = store_opens(tmp_path, 2 * N, database("orch.db"))
    assert outcome.successes == 2 * N, outcome.failures()
    assert outcome.facts == {"sweeps": 0}


@pytest.fixture
def mlflow_db(tmp_path: Path, mlflow_template: Path) -> str:
    shutil.copy(mlflow_template, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.mark.parametrize("round_", ROUNDS)
def test_concurrent_sweeps_of_one_file_submit_each_cell_once(database, mlflow_db: str, tmp_path: Path,
                                                             round_: int) -> None:
    outcome = sweeps(tmp_path, N, database("orch.db"), mlflow_db)
    assert outcome.successes == N, outcome.failures()
    facts = outcome.facts
    assert facts["attempts_per_cell"] == [1] * CELLS
    assert facts["reported_submitted"] == CELLS
    assert facts["states"] == ["finished"] * CELLS
    assert (facts["parent_runs"], facts["child_runs"], facts["cells_with_runs"]) == (1, CELLS, CELLS)


@pytest.mark.parametrize("round_", ROUNDS)
def test_concurrent_resume_and_cancel_leave_every_cell_in_one_legal_state(database, mlflow_db: str, tmp_path: Path,
                                                                        round_: int) -> None:
    outcome = resume_and_cancel(tmp_path, N, database("orch.db"), mlflow_db)
    assert outcome.facts["setup"] in (0, 1)  # the failing cells fail the setup sweep on purpose
    assert outcome.successes == 2 * N, outcome.failures()  # an illegal transition would exit 2
    facts = outcome.facts
    assert facts["disagreeing"] == [] and facts["numbering_gaps"] == []
    assert set(facts["states"]) <= {"finished", "cancelled"}, facts["states"]  # nothing left active or failed
    assert facts["child_runs"] == facts["cells_with_runs"] == CELLS
