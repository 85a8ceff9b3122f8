"""What `orch paper` needs from the orchestrator about the paper's sweep files: each file planned as its jobs would
run it (or the one line saying why it cannot be), the cell classes that do not fit their declared GPUs, the GPU-hours
a file costs, and its cells' states in the store.

The paper map (`analysis.paper`) names the sweep files; the CLI (`orch paper`, analysis/cli.py) plans them here and
hands the map these plain records (`analysis.paper.check`, `analysis.paper.status`): the orchestrator never imports
`analysis`, and `analysis` never imports the orchestrator. Nothing is stored or submitted.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from orchestrator.api import PlannedConfig, fit_cache, planned_configs, sweep_cells, unfit_classes
from orchlib.errors import OrchError


def plan_sweeps(paths: Mapping[str, Path], profile: str | None = None) -> dict[str, list[PlannedConfig] | str]:
    """Sweep name -> its cells as `paths[name]` plans them under `profile` (`planned_configs`), or the one line
    (`OrchError`'s) saying why it cannot be planned; a file that does not exist is left out. An unknown profile is
    bad input, not a problem of one file: the first file is planned under it first and its `OrchError` raised."""
    planned: dict[str, list[PlannedConfig] | str] = {}
    if profile is not None and paths:
        first = next(iter(paths))
        planned[first] = planned_configs(paths[first], profile)
    for sweep, path in paths.items():
        if sweep not in planned and path.exists():
            try:
                planned[sweep] = planned_configs(path, profile)
            except OrchError as err:
                planned[sweep] = str(err)
    return planned


def unfit_by_sweep(planned: Mapping[str, list[PlannedConfig] | str]) -> dict[str, list[str]]:
    """Sweep name -> one line per cell class of its planned cells (`plan_sweeps`) that does not fit its declared
    hardware (`unfit_classes`: preflight's memory and vLLM checks), the sweeps sharing one `fit_cache`; the sweeps
    that could not be planned are left out."""
    with fit_cache() as cache:
        return {sweep: unfit_classes(configs, cache) for sweep, configs in planned.items() if isinstance(configs, list)}


def state_counts(sweeps: Iterable[str], store_url: str | None = None) -> dict[str, dict[str, int] | None]:
    """Sweep name -> the counts of its cells' states in the orch store at `store_url` (`sweep_cells`), None when the
    store does not know the sweep (or there is no store)."""
    counts: dict[str, dict[str, int] | None] = {}
    for sweep in sweeps:
        if sweep not in counts:
            cells = sweep_cells(sweep, store_url)
            counts[sweep] = None if cells is None else dict(Counter(cell.state for cell in cells))
    return counts


def sweep_gpu_hours(path: Path) -> float | None:
    """`_sweep_gpu_hours` of the sweep file at `path` as it is now (cached by its modification time: planning a
    sweep takes seconds)."""
    return _sweep_gpu_hours(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sweep_gpu_hours(path: Path, _mtime: int) -> float | None:
    """The estimated GPU-hours of a sweep file as written (its GPU cells, `recipes.verl.cost.estimate_cost` on each
    cell's resources and its model's parameters from the built-in architectures), or None when a model is not in
    the table; `orch sweep FILE --preflight` gives the full estimate with memory and calibration."""
    from recipes.verl.cost import estimate_cost
    from recipes.verl.memory import builtin_architecture

    total = 0.0
    for cell in planned_configs(path):
        cfg, res = cell.config, cell.resources
        if cfg.trainer.device == "cpu" or res is None or res.gpus_per_node == 0:
            continue
        arch = builtin_architecture(str(cfg.model.path)) if cfg.model.path else None
        if arch is None:
            return None
        total += estimate_cost(cfg, arch.parameters(), res.nodes * res.gpus_per_node).gpu_hours
    return total
