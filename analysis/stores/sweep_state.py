"""What the orch state store (orchestrator.store) says about a sweep's cells, for the report's overview.

MLflow holds results; the store holds intent and state -- including cells that never got an MLflow run and the
reason a cell failed. The CLI reads the cells (`orchestrator.api.sweep_cells`: None when there is no store here or
it does not know the sweep, and the report then relies on MLflow alone) and hands them in; :func:`store_cells`
makes them one row per cell:

    digest, state (pending | queued | running | requeued | finished | stopped | failed | cancelled | lost),
    done (finished or stopped), attempts, steps_done, reason (first line), mlflow_run_id,
    setting (the cell's varied keys, "k=v, ...")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("digest", "state", "done", "attempts", "steps_done", "reason", "mlflow_run_id", "setting")


def store_cells(cells: Sequence[Any] | None) -> pd.DataFrame | None:
    """The sweep's cells as the orch store records them (records with the attributes of
    `orchestrator.api.CellState`, as `orchestrator.api.sweep_cells` returns them), one row per cell; None for None."""
    import pandas as pd

    if cells is None:
        return None
    records = [
        {
            "digest": cell.digest,
            "state": cell.state,
            "done": cell.done,
            "attempts": cell.attempts,
            "steps_done": cell.steps_done,
            "reason": cell.reason.strip().splitlines()[0] if cell.reason else None,
            "mlflow_run_id": cell.mlflow_run_id,
            "setting": ", ".join(f"{k}={v}" for k, v in cell.varied.items()),
        }
        for cell in cells
    ]
    return pd.DataFrame(records, columns=list(COLUMNS))


def store_notes(cells: pd.DataFrame) -> list[str]:
    """One line per cell that is not done (finished or stopped), with the store's reason."""
    import pandas as pd

    notes = []
    for cell in cells.itertuples(index=False):
        if cell.done:
            continue
        line = f"cell {cell.digest[:10]} ({cell.setting or 'base'}): {cell.state}"
        if not pd.isna(cell.reason):
            line += f" — {cell.reason}"
        if pd.isna(cell.mlflow_run_id):
            line += " (no MLflow run)"
        notes.append(line)
    return notes
