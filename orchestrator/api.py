"""What the orchestrator hands the CLI modules for `analysis`: the state of a sweep's cells, the Optuna study of a
sweep run by `orch tune`, a sweep file's planned cells and the cell classes that do not fit.

`analysis` never imports the orchestrator (nor the orchestrator `analysis`): the CLI (`orch report`, `orch paper`)
reads these and hands them in. They are plain records, so the reader needs neither the store nor the state machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.states import DONE
from orchestrator.store import Store
from orchlib.errors import OrchError


@dataclass(frozen=True)
class CellState:
    """One cell as the store records it.

    digest: the cell's identity. state: pending | queued | running | requeued | finished | stopped | failed |
    cancelled | lost; done: whether that state is a successful end (finished, stopped). attempts, steps_done:
    counters. reason: the last reason recorded (a failure's last lines). mlflow_run_id: the cell's run, if created.
    varied: the cell's values of the sweep's varied keys.
    """

    digest: str
    state: str
    done: bool
    attempts: int
    steps_done: int | None
    reason: str | None
    mlflow_run_id: str | None
    varied: dict[str, object]


def sweep_cells(sweep: str, store_url: str | None = None) -> list[CellState] | None:
    """The cells of `sweep` in the store at `store_url` (default: `$ORCH_STORE`, else `.orch/orch.db`), in sweep
    order; None when there is no store there or it does not know the sweep."""
    try:
        store = Store.open_readonly(store_url)  # `orch report` only reads: nothing is written to the file
    except OrchError:
        return None
    try:
        row = store.sweep(sweep)
        rows = store.status_rows(row.id) if row is not None else None
    finally:
        store.dispose()
    if rows is None:
        return None
    return [
        CellState(digest=cell["digest"], state=str(cell["state"]), done=cell["state"] in DONE,
                  attempts=cell["attempts"], steps_done=cell["steps_done"], reason=cell["reason"],
                  mlflow_run_id=cell["mlflow_run_id"], varied=json.loads(cell["varied_json"] or "{}"))
        for cell in rows
    ]


def sweep_study(sweep: str, store_url: str | None = None) -> Any:
    """The Optuna study `orch tune` ran for `sweep` (read from the store's database, read-only), or None when that
    database holds no such study."""
    import optuna

    from orchestrator.store import default_store_url
    from orchlib.sqlurl import readonly_url, sqlite_path

    url = store_url or default_store_url()
    path = sqlite_path(url)
    if path is not None and not Path(path).is_file():
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = optuna.storages.RDBStorage(readonly_url(url), skip_table_creation=True,
                                             skip_compatibility_check=True)
        if sweep not in {summary.study_name for summary in optuna.get_all_study_summaries(storage)}:
            return None
        return optuna.load_study(study_name=sweep, storage=storage)
    except Exception:  # not a database Optuna can read (no study tables): no study
        return None


@dataclass(frozen=True)
class PlannedConfig:
    """One cell a sweep file would run: its identity, its settings and its resolved training config
    (`recipes.config.schema.TrainConfig`)."""

    digest: str
    settings: dict[str, Any]
    config: Any
    resources: Any = None  # orchestrator.resources.Resources


def planned_configs(path: Path, profile: str | None = None) -> list[PlannedConfig]:
    """Every cell the sweep file at `path` plans (under `profile`), resolved as a job would run it; nothing is
    stored or submitted. Raises `OrchError` (file, line, key) on a bad file."""
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep

    plan = build_plan(load_sweep(path, profile=profile))
    return [PlannedConfig(cell.digest, cell.settings, cell.resolved.config, cell.resources) for cell in plan.cells]


def unfit_classes(configs: list[PlannedConfig], cache: Any = None) -> list[str]:
    """One line per cell class of `configs` (a sweep's `planned_configs`) that does not fit its declared hardware:
    the memory per GPU and vLLM's start-up checks of `orch sweep FILE --preflight` on its verl GPU cells, without
    veRL's validation and without asking for model or data paths (`orchestrator.preflight.unfit_lines`). `cache`:
    one `fit_cache()` shared by several sweeps (their common veRL config is composed once)."""
    from orchestrator.preflight import unfit_lines

    if cache is None:
        with fit_cache() as own:
            return unfit_classes(configs, own)
    return unfit_lines([(planned.config, planned.resources, str(planned.settings.get("backend")))
                        for planned in configs], cache)


def fit_cache() -> Any:
    """What `unfit_classes` calls on several sweeps share: a context manager (`with fit_cache() as cache:`)."""
    from recipes.verl.preflight import PreflightCache

    return PreflightCache(fit_only=True)
