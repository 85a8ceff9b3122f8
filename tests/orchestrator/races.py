"""The race scenarios of test_races.py and benchmarks/bench_races.py: N real processes started together against
one fresh store or MLflow database, and the checks of what they leave behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_BACKEND_DIR = Path(__file__).parent / "testbackend"
POSTGRES_ENV = "ORCH_TEST_POSTGRES_URL"

SWEEP = """\
name: race
backend: orch-test
base: {trainer: test, trainer.total_steps: 1}
grid:
  task: [sokoban, frozenlake]
seeds: [1, 2]
"""
CELLS = 4  # the sweep above: 2 tasks x 2 seeds


@dataclass
class Outcome:
    """What N processes of one scenario did."""

    codes: list[int]
    outputs: list[str]
    wall_s: float
    facts: dict = field(default_factory=dict)

    @property
    def successes(self) -> int:
        return sum(code == 0 for code in self.codes)

    def failures(self) -> str:
        return "\n---\n".join(out for code, out in zip(self.codes, self.outputs, strict=True) if code != 0)


def environment(workdir: Path, **extra: str) -> dict[str, str]:
    """The environment of the processes: the repo and the TEST-ONLY backend importable, fast test steps."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("ORCH_STORE", "MLFLOW_TRACKING_URI", "ORCH_TEST_FAIL_SEED", "ORCH_TEST_FAIL_FLAG")}
    env.update(PYTHONPATH=os.pathsep.join([str(TEST_BACKEND_DIR), str(REPO)]), ORCH_TEST_STEP_S="0.01",
               ORCH_HEARTBEAT_S="1", ORCH_CACHE_DIR=str(workdir / ".cache"), **extra)
    return env


def run_together(commands: list[list[str]], workdir: Path, env: dict[str, str], timeout: float = 300) -> Outcome:
    """Start every command at once in `workdir`; wait for all."""
    start = time.perf_counter()
    processes = [subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for command in commands]
    outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    return Outcome([process.returncode for process in processes], outputs, time.perf_counter() - start)


def run_python_together(code: str, count: int, workdir: Path, env: dict[str, str]) -> Outcome:
    """Run `code` (it sees `index`) in `count` processes that first import what it needs, then start it at the
    same moment (each says it is ready with a file, then waits for a go file), so that they really collide,
    however slowly a loaded machine imports."""
    go = workdir / f"go-{uuid.uuid4().hex}"
    script = textwrap.dedent("""
        import os, sys, time
        from pathlib import Path
        from orchestrator.store import Store
        from recipes.run.tracking import RunTracker, default_tracking_uri
        index, go = int(sys.argv[1]), Path(sys.argv[2])
        Path(f"{go}.ready-{index}").touch()
        while not go.exists():
            time.sleep(0.01)
    """) + textwrap.dedent(code)
    commands = [[sys.executable, "-c", script, str(index), str(go)] for index in range(count)]
    start = time.perf_counter()
    processes = [subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for command in commands]
    deadline = time.monotonic() + 300
    while not all(Path(f"{go}.ready-{index}").exists() for index in range(count)):
        if any(process.poll() is not None for process in processes) or time.monotonic() > deadline:
            break  # one died while importing: its output says why
        time.sleep(0.01)
    go.touch()
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    return Outcome([process.returncode for process in processes], outputs, time.perf_counter() - start)


# -- fresh databases ----------------------------------------------------------------------------------------------


def fresh_postgres_schema(url: str) -> str:
    """A URL whose tables live in a new, empty PostgreSQL schema of the test database."""
    import sqlalchemy as sa

    schema = f"orch_race_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text(f"CREATE SCHEMA {schema}"))
    engine.dispose()
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


@contextmanager
def postgres_schema(url: str) -> Iterator[str]:
    """`fresh_postgres_schema(url)` for the block, dropped at its end."""
    fresh = fresh_postgres_schema(url)
    try:
        yield fresh
    finally:
        drop_postgres_schema(fresh)


def drop_postgres_schema(url: str) -> None:
    import sqlalchemy as sa

    schema = url.rsplit("%3D", 1)[1]
    engine = sa.create_engine(url.split("?")[0] if "options=" in url.split("?")[-1] else url)
    with engine.begin() as connection:
        connection.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
    engine.dispose()


# -- the scenarios -------------------------------------------------------------------------------------------------


def first_runs(workdir: Path, count: int, tracking_uri: str | None = None) -> Outcome:
    """`count` training runs opening their MLflow run at once in a fresh folder (the path `orch train` takes:
    `recipes.run.tracking.RunTracker` on `default_tracking_uri()`, SQLite `mlflow.db` here unless `tracking_uri`)."""
    env = environment(workdir, **({"MLFLOW_TRACKING_URI": tracking_uri} if tracking_uri else {}))
    outcome = run_python_together("""
        tracker = RunTracker(default_tracking_uri(), "race", run_id=None, run_name=f"run{index}")
        tracker.log_metrics({"loss": float(index)}, step=0)
        tracker.end("FINISHED")
    """, count, workdir, env)
    from recipes.run.tracking import default_tracking_uri, mlflow_client

    client = mlflow_client(tracking_uri or default_tracking_uri(workdir=workdir))
    experiments = [experiment for experiment in client.search_experiments() if experiment.name == "race"]
    runs = client.search_runs([experiments[0].experiment_id]) if len(experiments) == 1 else []
    outcome.facts = {"experiments": len(experiments), "runs": len(runs),
                     "finished": sum(run.info.status == "FINISHED" for run in runs)}
    return outcome


def store_opens(workdir: Path, count: int, store_url: str) -> Outcome:
    """`count` processes opening one new store at once."""
    outcome = run_python_together("""
        Store.open(sys.argv[3]).dispose()
    """.replace("sys.argv[3]", repr(store_url)), count, workdir, environment(workdir))
    from orchestrator.store import Store

    store = Store.open(store_url, create=False)
    outcome.facts = {"sweeps": len(store.sweep_names())}
    store.dispose()
    return outcome


def orch(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "orch"), *args]


def sweeps(workdir: Path, count: int, store_url: str, tracking_uri: str) -> Outcome:
    """`count` `orch sweep` of one file at once (debug executor: the cells run inside the process that submits
    them). Facts: attempts per cell, MLflow child runs per cell, cells submitted as the processes reported."""
    (workdir / "race.yaml").write_text(SWEEP)
    env = environment(workdir, ORCH_STORE=store_url)
    outcome = run_together([orch("sweep", "race.yaml", "--cluster", "debug", "--tracking-uri", tracking_uri)] * count,
                           workdir, env)
    outcome.facts = sweep_facts(store_url, tracking_uri)
    outcome.facts["reported_submitted"] = sum(_submitted(output) for output in outcome.outputs)
    return outcome


def _submitted(output: str) -> int:
    for word, following in zip(output.split(), output.split()[1:], strict=False):
        if word == "submitted" and following.isdigit():
            return int(following)
    return 0


RETRY_SWEEP = """\
name: race
backend: orch-test
base: {trainer: test, trainer.total_steps: 1}
grid:
  task: [sokoban, frozenlake, countdown, sokoban_8x8]
seeds: [7]
"""


def resume_and_cancel(workdir: Path, count: int, store_url: str, tracking_uri: str) -> Outcome:
    """A sweep whose cells all failed once, then `count` processes at once, half `orch resume --retry-failed`,
    half `orch cancel`, twice over. Facts: cells whose latest attempt disagrees with them, attempt numbering."""
    (workdir / "race.yaml").write_text(RETRY_SWEEP)
    flag = workdir / "fail-flag"
    flag.touch()
    env = environment(workdir, ORCH_STORE=store_url)
    setup = subprocess.run(orch("sweep", "race.yaml", "--cluster", "debug", "--tracking-uri", tracking_uri),
                           cwd=workdir, env={**env, "ORCH_TEST_FAIL_SEED": "7", "ORCH_TEST_FAIL_FLAG": str(flag)},
                           capture_output=True, text=True)
    flag.unlink()
    commands = [orch("resume", "race", "--cluster", "debug", "--retry-failed") if index % 2 else orch("cancel", "race")
                for index in range(count)]
    first = run_together(commands, workdir, env)
    second = run_together(commands[::-1], workdir, env)
    outcome = Outcome(first.codes + second.codes, first.outputs + second.outputs, first.wall_s + second.wall_s)
    outcome.facts = sweep_facts(store_url, tracking_uri)
    outcome.facts["setup"] = setup.returncode
    return outcome


def sweep_facts(store_url: str, tracking_uri: str) -> dict:
    """What the store and MLflow hold for the sweep `race`."""
    from orchestrator.store import Store
    from recipes.run.tracking import mlflow_client

    store = Store.open(store_url, create=False)
    sweep = store.sweep("race")
    cells = store.cell_rows(sweep.id) if sweep else []
    attempts = {cell.digest: store.attempts(cell.id) for cell in cells}
    disagreeing = [cell.digest for cell in cells
                   if attempts[cell.digest] and attempts[cell.digest][-1].state != cell.state]
    numbering = [cell.digest for cell in cells
                 if [attempt.number for attempt in attempts[cell.digest]] != list(range(1, cell.attempts + 1))]
    store.dispose()
    client = mlflow_client(tracking_uri)
    experiment = client.get_experiment_by_name("race")
    runs = client.search_runs([experiment.experiment_id]) if experiment else []
    children = [run.data.tags.get("cell") for run in runs if run.data.tags.get("orch.role") == "cell"]
    return {
        "cells": len(cells),
        "states": sorted(cell.state for cell in cells),
        "attempts_per_cell": sorted(len(items) for items in attempts.values()),
        "disagreeing": disagreeing,
        "numbering_gaps": numbering,
        "parent_runs": sum(run.data.tags.get("orch.role") == "sweep" for run in runs),
        "child_runs": len(children),
        "cells_with_runs": len(set(children)),
    }


def summary(outcome: Outcome) -> str:
    return json.dumps({"successes": outcome.successes, "processes": len(outcome.codes),
                       "wall_s": round(outcome.wall_s, 2), **outcome.facts})
