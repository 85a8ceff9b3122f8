"""What the orch state store (orchestrator.store) says about a sweep's cells, for the report's overview.

MLflow holds results; the store holds intent and state -- including cells that never got an MLflow run and the
reason a cell failed. :func:`store_cells` returns one row per cell, or None when there is no store here or it
does not know the sweep (the report then relies on MLflow alone):

    digest, state (pending | queued | running | requeued | finished | stopped | failed | cancelled | lost),
    attempts, steps_done, reason (first line), mlflow_run_id, setting (the cell's varied keys, "k=v, ...")
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from orchlib.errors import OrchError

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("digest", "state", "attempts", "steps_done", "reason", "mlflow_run_id", "setting")


def store_cells(sweep: str, store_url: str | None = None) -> pd.DataFrame | None:
    """The sweep's cells in the orch store at ``store_url`` (default: ``$ORCH_STORE`` or ``.orch/orch.db``)."""
    import pandas as pd

    from orchestrator.store import Store

    try:
        store = Store.open(store_url, create=False)
    except OrchError:
        return None
    try:
        row = store.sweep(sweep)
        if row is None:
            return None
        cells = store.status_rows(row.id)
    finally:
        store.dispose()
    records = [
        {
            "digest": cell["digest"],
            "state": str(cell["state"]),
            "attempts": cell["attempts"],
            "steps_done": cell["steps_done"],
            "reason": (cell["reason"] or "").strip().splitlines()[0] if cell["reason"] else None,
            "mlflow_run_id": cell["mlflow_run_id"],
            "setting": ", ".join(f"{k}={v}" for k, v in json.loads(cell["varied_json"] or "{}").items()),
        }
        for cell in cells
    ]
    return pd.DataFrame(records, columns=list(COLUMNS))


def store_notes(cells: pd.DataFrame) -> list[str]:
    """One line per cell that is not done (finished or stopped), with the store's reason."""
    import pandas as pd

    from orchestrator.states import DONE

    notes = []
    for cell in cells.itertuples(index=False):
        if cell.state in DONE:
            continue
        line = f"cell {cell.digest[:10]} ({cell.setting or 'base'}): {cell.state}"
        if not pd.isna(cell.reason):
            line += f" — {cell.reason}"
        if pd.isna(cell.mlflow_run_id):
            line += " (no MLflow run)"
        notes.append(line)
    return notes
