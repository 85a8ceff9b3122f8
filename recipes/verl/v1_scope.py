"""What the V1 backend (`verl.trainer: v1`, recipes.verl.v1) runs today, checked when a config is validated (no veRL
import: the driver and `orch sweep --dry-run` validate without one).

A config asking the V1 path for something it does not do yet is refused with one line naming the key, never run
differently from the legacy path. The list shrinks as docs/verl.md's "The V1 trainer" table is filled in.
"""

from __future__ import annotations

from typing import Any

# key -> why, for what the V1 path does not do yet (each done on verl.trainer=legacy)
NOT_YET = {
    "diagnostics.grad_every": "the gradient split is not on the V1 path yet; set diagnostics.grad_every=0 or "
                              "verl.trainer=legacy",
    "algorithm.name": "DAPO's dynamic sampling is not on the V1 path yet (veRL's V1 replay buffer refills; orch's "
                      "refill is not ported); use verl.trainer=legacy",
    "control.blind_from_step": "the planted-collapse control is not on the V1 path yet; use verl.trainer=legacy",
}


def v1_refusal(cfg: Any) -> tuple[str, str] | None:
    """(the config key, why) when `cfg` (a TrainConfig on backend=verl) asks the V1 path for what it does not do
    yet; else None."""
    if cfg.diagnostics.grad_every and "collapse" in cfg.hooks:
        return "diagnostics.grad_every", NOT_YET["diagnostics.grad_every"]
    if cfg.algorithm.dynamic_sampling:
        return "algorithm.name", NOT_YET["algorithm.name"]
    if cfg.control.blind_from_step:
        return "control.blind_from_step", NOT_YET["control.blind_from_step"]
    return None
