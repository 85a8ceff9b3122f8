"""What the V1 backend (`verl.trainer: v1`, recipes.verl.v1) runs today, checked when a config is validated (no veRL
import: the driver and `orch sweep --dry-run` validate without one).

A config asking the V1 path for something it does not do yet is refused with one line naming the key, never run
differently from the legacy path. The list shrinks as docs/verl.md's "The V1 trainer" table is filled in.
"""

from __future__ import annotations

from typing import Any

# key -> why, for what the V1 path does not do yet (each done on verl.trainer=legacy)
NOT_YET: dict[str, str] = {}


def v1_refusal(cfg: Any) -> tuple[str, str] | None:
    """(the config key, why) when `cfg` (a TrainConfig on backend=verl) asks the V1 path for what it does not do
    yet; else None."""
    return None
