"""Plotly figures of the report: training curves, diagnostic-vs-success scatters, ρ and slip curves, RV histograms
and the predictor's verdicts. Each function takes analysis frames and returns a ``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

    from analysis.mlflow_store import RunData

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 60, "b": 50}, "height": 380}


def _color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def training_curves(data: RunData, summary: pd.DataFrame, key: str) -> go.Figure:
    """Mean over seeds of ``key`` against step, one panel per task, one line per (variant, filter setting);
    filter-off lines dashed, a band of ± one std across seeds."""
    from plotly.subplots import make_subplots

    history = data.history(key).merge(summary[["run_id", "task", "variant", "filter", "filtered"]], on="run_id")
    tasks = sorted(history["task"].dropna().unique())
    figure = make_subplots(rows=1, cols=max(1, len(tasks)), subplot_titles=tasks, shared_yaxes=True)
    variants = {v: i for i, v in enumerate(sorted(summary["variant"].dropna().unique()))}
    shown = set()
    for column, task in enumerate(tasks, start=1):
        rows = history[history["task"] == task]
        for (variant, setting), group in rows.groupby(["variant", "filter"], sort=True):
            stats = group.groupby("step")["value"].agg(["mean", "std"]).reset_index()
            name = f"{variant} · {setting}"
            color = _color(variants.get(variant, 0))
            dash = "dash" if setting == "none" else "solid"
            band = stats.dropna(subset=["std"])
            if not band.empty:
                figure.add_scatter(
                    x=list(band["step"]) + list(band["step"])[::-1],
                    y=list(band["mean"] + band["std"]) + list(band["mean"] - band["std"])[::-1],
                    fill="toself", fillcolor=color, opacity=0.12, line={"width": 0}, hoverinfo="skip",
                    showlegend=False, legendgroup=name, row=1, col=column,
                )
            figure.add_scatter(
                x=stats["step"], y=stats["mean"], mode="lines+markers", marker={"size": 4},
                line={"color": color, "dash": dash}, name=name, legendgroup=name,
                showlegend=name not in shown, row=1, col=column,
            )
            shown.add(name)
    figure.update_layout(title=key, **LAYOUT)
    figure.update_xaxes(title_text="step")
    return figure


def diagnostic_scatter(frame: pd.DataFrame, diagnostic: str, target: str, stats: dict | None) -> go.Figure:
    """One point per run: ``diagnostic`` (x) against ``target`` (y), coloured by task; the title carries the
    correlation (``stats``: a row of :func:`analysis.correlations.diagnostic_correlations`)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for index, (task, group) in enumerate(frame.groupby("task", sort=True)):
        figure.add_scatter(
            x=group[diagnostic], y=group[target], mode="markers", name=str(task), marker={"color": _color(index)},
            text=group["variant"] + " · " + group["filter"] + " · seed " + group["seed"].astype(str),
        )
    title = f"{diagnostic} vs {target}"
    if stats is not None and not math.isnan(stats["spearman"]):
        title += (
            f"<br><sup>Spearman {stats['spearman']:+.2f} [{stats['spearman_lo']:+.2f}, {stats['spearman_hi']:+.2f}]"
            f" · Pearson {stats['pearson']:+.2f} [{stats['pearson_lo']:+.2f}, {stats['pearson_hi']:+.2f}]"
            f" · n = {stats['n']}</sup>"
        )
    figure.update_layout(title=title, xaxis_title=diagnostic, yaxis_title=f"{target} (%)", **LAYOUT)
    return figure


def rho_figure(curve: pd.DataFrame) -> go.Figure:
    """Success (mean ± std over seeds) against ρ, one line per (task, variant)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for index, ((task, variant), group) in enumerate(curve.groupby(["task", "variant"], sort=True)):
        group = group.sort_values("rho")
        figure.add_scatter(
            x=group["rho"], y=group["mean"], error_y={"type": "data", "array": group["std"].fillna(0)},
            mode="lines+markers", name=f"{task} · {variant}", line={"color": _color(index)},
        )
    figure.update_layout(title="success vs top-p ρ (ρ = 1: no filter)", xaxis_title="ρ", yaxis_title="success (%)", **LAYOUT)
    return figure


def slip_figure(curve: pd.DataFrame) -> go.Figure:
    """Success without (dashed) and with (solid) the filter against the slip rate."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for index, ((task, variant, setting), group) in enumerate(
        curve.groupby(["task", "variant", curve["filter"].fillna("no filtered run")], sort=True)
    ):
        group = group.sort_values("slip")
        color = _color(index)
        figure.add_scatter(
            x=group["slip"] * 100, y=group["base_mean"], error_y={"type": "data", "array": group["base_std"].fillna(0)},
            mode="lines+markers", line={"color": color, "dash": "dash"}, name=f"{task} · {variant} · no filter",
        )
        if group["filt_n"].gt(0).any():
            figure.add_scatter(
                x=group["slip"] * 100, y=group["filt_mean"],
                error_y={"type": "data", "array": group["filt_std"].fillna(0)},
                mode="lines+markers", line={"color": color}, name=f"{task} · {variant} · {setting}",
            )
    figure.update_layout(title="success vs slip rate", xaxis_title="slip rate (%)", yaxis_title="success (%)", **LAYOUT)
    return figure


def rv_histograms(rv: pd.DataFrame, labels: dict[str, str]) -> go.Figure:
    """Histograms of per-prompt reward variance, one trace per run (``labels``: run_id -> legend name), with a
    slider over the dumped training steps."""
    import plotly.graph_objects as go

    steps = sorted(rv["step"].unique())
    runs = [r for r in labels if r in set(rv["run_id"])]
    shown = rv[rv["run_id"].isin(runs)]
    top = float(shown["rv"].max()) if len(shown) and shown["rv"].max() > 0 else 1.0
    bins = {"start": 0.0, "end": top * 1.0001, "size": top / 25}  # the same bins for every run and step
    figure = go.Figure()
    for step in steps:
        for index, run_id in enumerate(runs):
            values = shown[(shown["run_id"] == run_id) & (shown["step"] == step)]["rv"]
            figure.add_histogram(
                x=values, name=labels[run_id], opacity=0.6, marker={"color": _color(index)}, xbins=bins,
                autobinx=False, visible=step == steps[0], legendgroup=run_id,
            )
    per_step = len(runs)
    slider_steps = [
        {
            "label": str(step),
            "method": "update",
            "args": [{"visible": [i // per_step == position for i in range(per_step * len(steps))]}],
        }
        for position, step in enumerate(steps)
    ]
    figure.update_layout(
        title="per-prompt reward variance over training (slider: step)", barmode="overlay",
        xaxis_title="reward variance of a prompt's group", yaxis_title="prompts", xaxis_range=[0, top * 1.02],
        sliders=[{"active": 0, "currentvalue": {"prefix": "step "}, "steps": slider_steps}],
        **{**LAYOUT, "height": 460},
    )
    return figure


def predictor_figure(table: pd.DataFrame) -> go.Figure:
    """Predicted ratio std(RV)/mean(RV) (x) against the realised filter gain (y), coloured by verdict."""
    import plotly.graph_objects as go

    from analysis.predictor import PredictorThresholds

    thresholds = PredictorThresholds()
    figure = go.Figure()
    for index, (verdict, group) in enumerate(table.groupby("verdict", sort=True)):
        figure.add_scatter(
            x=group["ratio_mean"], y=group["gain"], mode="markers", name=verdict, marker={"color": _color(index), "size": 9},
            text=group["variant"] + " · " + group["task"], error_x={"type": "data", "array": group["ratio_std"].fillna(0)},
        )
    for x in (thresholds.hurts_below, thresholds.helps_above):
        figure.add_vline(x=x, line={"dash": "dot", "color": "grey"})
    figure.add_hline(y=0, line={"color": "grey"})
    figure.update_layout(
        title="predictor: std(RV)/mean(RV) of the first rollout batch vs realised filter gain",
        xaxis_title="std(RV) / mean(RV)", yaxis_title="filter gain (success points)", **LAYOUT,
    )
    return figure
