"""The filter-strategy figure (analysis.reports.paper_report's `filters` section) compares RAGEN's three arms per task:
WebShop's extra top-p 0.95 cells (sweeps/filters.yaml) are not pooled into its top-p 0.9 arm."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import names, paper
from analysis.paper import Value
from analysis.reports.paper_report import SECTIONS, build_context
from analysis.stats.summary import summarize
from analysis.stores.mlflow_store import RunData


def _runs(arms: dict[tuple[str, float], float]) -> RunData:
    """Two finished WebShop runs per (strategy, value) arm, validation success `peak` then half of it."""
    runs, rows = [], []
    for index, ((strategy, value), peak) in enumerate((arm, peak) for arm, peak in arms.items() for _ in range(2)):
        run = f"r{index}"
        runs.append({"run_id": run, "run_name": run, "status": "FINISHED", "experiment": "filters",
                     "tags.cell": f"c{index}", "params.backend": "torch", "params.task.name": "webshop",
                     "params.algorithm.name": "grpo", "params.model.name": "tiny", "params.model.path": "None",
                     "params.seed": str(index), "params.filter.strategy": strategy, "params.filter.value": str(value)})
        rows += [(run, names.VAL_SUCCESS, step, v) for step, v in ((1, peak), (2, peak / 2))]
    metrics = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"]).assign(timestamp=0)
    return RunData(runs=pd.DataFrame(runs), metrics=metrics, tracking_uri="none", reader="archive")


def test_the_top_p_arm_is_rho_0_9_not_webshops_0_95_cells() -> None:
    data = _runs({("top_p", 0.9): 0.5, ("top_p", 0.95): 0.9, ("top_k", 0.25): 0.3, ("none", 1.0): 0.1})
    ctx = build_context(data, summarize(data), n_boot=20)
    measure = SECTIONS["filters"]
    top_p_vs_top_k = Value("Figure: filter strategies", "webshop", 1, {"task": "webshop", "better": "top_p",
                                                                       "worse": "top_k"})
    measured = measure(ctx, top_p_vs_top_k)
    assert measured.value == pytest.approx(20.0)  # points: 50% - 30% (with the 0.95 cells pooled in: 70% - 30%)
    top_k_vs_none = Value("Figure: filter strategies", "webshop", 1, {"task": "webshop", "better": "top_k",
                                                                      "worse": "none"})
    assert measure(ctx, top_k_vs_none).value == pytest.approx(20.0)
    assert paper.FILTER_ARMS == {"top_p": 0.9, "top_k": 0.25, "none": 1.0}
