"""Plotly figures of the report: training curves, diagnostic-vs-success scatters, ρ and slip curves, RV histograms
and the predictor's verdicts. Each function takes analysis frames and returns a ``plotly.graph_objects.Figure``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import plotly.graph_objects as go

    from analysis.stores.mlflow_store import RunData

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 60, "b": 50}, "height": 380}


def _color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def training_curves(data: RunData, summary: pd.DataFrame, key: str) -> go.Figure:
    """Mean over seeds of ``key`` against step, one panel per task, one line per (variant, filter setting);
    filter-off lines dashed, a band of ± one std across seeds."""
    import numpy as np
    from plotly.subplots import make_subplots

    history = data.history(key).merge(summary[["run_id", "task", "variant", "filter", "filtered"]], on="run_id")
    tasks = sorted(history["task"].dropna().unique())
    figure = make_subplots(rows=1, cols=max(1, len(tasks)), subplot_titles=tasks, shared_yaxes=True)
    variants = {v: i for i, v in enumerate(sorted(summary["variant"].dropna().unique()))}
    shown = set()
    traces = []  # plain dicts, set at once without plotly's validation of each value (_with_traces, issue 60)
    lines = _per_step(history, ["task", "variant", "filter"], ["mean", "std"])
    for column, task in enumerate(tasks, start=1):
        axes = _axes(figure, 1, column)
        for (_, variant, setting), stats in sorted(((line, s) for line, s in lines.items() if line[0] == task),
                                                   key=lambda item: item[0]):
            name = f"{variant} · {setting}"
            color = _color(variants.get(variant, 0))
            dash = "dash" if setting == "none" else "solid"
            band = ~np.isnan(stats["std"])
            if band.any():
                steps, mean, std = stats["step"][band], stats["mean"][band], stats["std"][band]
                upper, lower = mean + std, mean - std
                traces.append({
                    "type": "scatter", "x": np.concatenate([steps, steps[::-1]]),
                    "y": np.concatenate([upper, lower[::-1]]), "fill": "toself", "fillcolor": color, "opacity": 0.12,
                    "line": {"width": 0}, "hoverinfo": "skip", "showlegend": False, "legendgroup": name, **axes,
                })
            traces.append({
                "type": "scatter", "x": stats["step"], "y": stats["mean"],
                "mode": "lines+markers", "marker": {"size": 4}, "line": {"color": color, "dash": dash}, "name": name,
                "legendgroup": name, "showlegend": name not in shown, **axes,
            })
            shown.add(name)
    figure = _with_traces(figure, traces)
    figure.update_layout(title=key, **LAYOUT)
    figure.update_xaxes(title_text="step")
    return figure


def _per_step(history: pd.DataFrame, by: list[str], how: list[str]) -> dict[tuple, dict[str, np.ndarray]]:
    """Per line (the values of ``by``, none missing): each step's ``how`` (e.g. mean, std) over the line's runs,
    arrays by column (step and those). One grouping for every line: the same values as grouping each line's rows by
    step (pandas reduces each group alike), without selecting each line's rows from the history (issue 60)."""
    stats = history.groupby([*by, "step"], sort=True)["value"].agg(how).reset_index()
    columns = {column: stats[column].to_numpy() for column in ("step", *how)}
    return {tuple(line): {column: values[positions] for column, values in columns.items()}
            for line, positions in stats.groupby(by, sort=True).indices.items()}


def _axes(figure: go.Figure, row: int, col: int) -> dict[str, str]:
    """The axes a trace on subplot (row, col) of a `make_subplots` figure is drawn on (as ``add_trace(row=, col=)``
    sets them)."""
    axes = figure.get_subplot(row, col)
    return {"xaxis": axes.xaxis.plotly_name.replace("axis", ""), "yaxis": axes.yaxis.plotly_name.replace("axis", "")}


def _with_traces(figure: go.Figure, traces: list[dict]) -> go.Figure:
    """``figure`` (its layout and subplot grid, as built and validated) with ``traces`` appended: plain trace
    dicts of orch's own properties (numpy arrays, strings, numbers), taken as they are rather than validated
    property by property and value by value (3,571 traces in a Table-4 sweep's training curves: seconds, issue 60).
    The figure is the same; what is set on it afterwards is validated again."""
    import plotly.graph_objects as go

    built = figure.to_dict()
    spec = {"data": [*built["data"], *traces], "layout": built["layout"], "_grid_ref": figure._grid_ref,
            "_grid_str": figure._grid_str}
    out = go.Figure(spec, _validate=False)
    out._validate = True
    out._layout_obj._validate = True
    return out


def diagnostic_scatter(frame: pd.DataFrame, diagnostic: str, target: str, stats: dict | None) -> go.Figure:
    """One point per run: ``diagnostic`` (x) against ``target`` (y), coloured by task; the title carries the
    correlation (``stats``: a row of :func:`analysis.stats.correlations.diagnostic_correlations`)."""
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

    from analysis.stats.predictor import PredictorThresholds

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


def calibration_figure(record: dict) -> go.Figure:
    """The predictor's calibration on orch's archived sweeps (:mod:`analysis.stats.predictor_record`): the kept
    reading's ratio (x) against each condition's measured filter gain with its 95% interval (y), fit half hollow
    and held-out half filled; the thresholds dotted, 0 and the gain of interest dashed."""
    import plotly.graph_objects as go

    kept = record.get("kept", "var-first")
    rows = [row for row in record.get("rows") or [] if row["ratios"].get(kept) is not None]
    figure = go.Figure()
    for index, half in enumerate(("fit", "held out")):
        chosen = [row for row in rows if row.get("half") == half]
        if not chosen:
            continue
        figure.add_scatter(
            x=[row["ratios"][kept] for row in chosen], y=[row["gain"] for row in chosen], mode="markers",
            name=f"{half} half", marker={"color": _color(0), "size": 9, "symbol": "circle-open" if index == 0 else "circle"},
            text=[f"{row['sweep']} · {row['task']} · {row['variant']} · {row['filter']}: {row.get('outcome', '')}"
                  for row in chosen],
            error_y={"type": "data", "symmetric": False, "array": [row["hi"] - row["gain"] for row in chosen],
                     "arrayminus": [row["gain"] - row["lo"] for row in chosen]},
        )
    cuts = record.get("thresholds") or {}
    for x in (cuts.get("hurts_below"), cuts.get("helps_above")):
        if x is not None:
            figure.add_vline(x=x, line={"dash": "dot", "color": "grey"})
    figure.add_hline(y=0, line={"color": "grey"})
    figure.add_hline(y=record.get("delta", 0.0), line={"dash": "dash", "color": "grey"})
    figure.update_layout(
        title="the predictor, tested: ratio on the baseline's first batch vs measured filter gain (95% CI)",
        xaxis_title=f"std(RV)/mean(RV) ({kept})", yaxis_title="filter gain (success points)", **LAYOUT,
    )
    return figure


def filter_effect_figure(summary: pd.DataFrame) -> go.Figure:
    """Final success per task (and variant) without and with each filter setting: every seed as a point, the mean
    over seeds as a bar."""
    import plotly.graph_objects as go

    frame = summary.assign(where=summary["task"].astype(str) + summary["variant"].map(
        lambda v: "" if v == "base" else f" · {v}"))
    figure = go.Figure()
    for index, (setting, group) in enumerate(frame.groupby("filter", sort=True)):
        color = "#7f7f7f" if setting == "none" else _color(index)
        means = group.groupby("where", sort=True)["final_success"].mean()
        figure.add_bar(x=list(means.index), y=list(means), name=f"{setting} (mean)", marker={"color": color},
                       opacity=0.45, offsetgroup=str(setting))
        figure.add_scatter(
            x=group["where"], y=group["final_success"], mode="markers", name=f"{setting} (seeds)",
            marker={"color": color, "size": 8}, offsetgroup=str(setting),
            text="seed " + group["seed"].astype(str),
        )
    figure.update_layout(title="did filtering help? final success per seed (bars: mean over seeds)",
                         barmode="group", scattermode="group", yaxis_title="final validation success (%)", **LAYOUT)
    return figure


def collapse_figure(data: RunData, summary: pd.DataFrame) -> go.Figure:
    """Mean over seeds against step of success, retrieval's excess over chance (0 = chance), MI-ZScore-EMA and
    entropy, one panel each; one line per (task, variant, filter setting), filter-off lines dashed; dotted lines
    at the steps where the collapse alert first fired."""
    from plotly.subplots import make_subplots

    from analysis import names

    panels = (names.VAL_SUCCESS, names.RETRIEVAL_EXCESS, names.MI_ZSCORE_EMA, names.ENTROPY)
    titles = ("validation success", "retrieval excess over chance (0 = chance)", "MI-ZScore-EMA", "entropy")
    figure = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.06)
    keys = summary[["run_id", "task", "variant", "filter"]]
    lines = sorted({(t, v, f) for t, v, f in keys[["task", "variant", "filter"]].itertuples(index=False)}, key=str)
    colors = {pair: _color(index) for index, pair in enumerate(dict.fromkeys((t, v) for t, v, _ in lines))}
    traces = []  # set at once, as training_curves'
    for row, key in enumerate(panels, start=1):
        means = _per_step(data.history(key).merge(keys, on="run_id"), ["task", "variant", "filter"], ["mean"])
        axes = _axes(figure, row, 1)
        for task, variant, setting in lines:
            stats = means.get((task, variant, setting))
            if stats is None:
                continue
            name = " · ".join(str(p) for p in (task, None if variant == "base" else variant, setting) if p)
            traces.append({
                "type": "scatter", "x": stats["step"], "y": stats["mean"],
                "mode": "lines+markers", "marker": {"size": 4}, "name": name, "legendgroup": name,
                "showlegend": row == 1,
                "line": {"color": colors[task, variant], "dash": "dash" if setting == "none" else "solid"}, **axes,
            })
    figure = _with_traces(figure, traces)
    figure.add_hline(y=0, line={"dash": "dot", "color": "grey"}, row=2, col=1)
    alerts = data.history(names.COLLAPSE_ALERT)
    first = alerts[alerts["value"] >= 0.5].groupby("run_id")["step"].min()
    # what add_vline draws on every panel with a line (one shape per step and panel), set at once: add_vline scans
    # every trace of every panel for each line (44 s for 28 steps at lab scale, issue 60)
    drawn = sorted({int(trace.xaxis[1:] or 1) for trace in figure.data})
    figure.update_layout(shapes=[*figure.layout.shapes, *(
        {"type": "line", "x0": step, "x1": step, "y0": 0, "y1": 1, "xref": f"x{'' if row == 1 else row}",
         "yref": f"y{'' if row == 1 else row} domain", "line": {"dash": "dot", "color": "#d62728", "width": 1}}
        for step in sorted(set(first.astype(int))) for row in drawn)])
    figure.update_layout(title="did MI collapse before success? (mean over seeds; red dotted: collapse alert fired)",
                         **{**LAYOUT, "height": 820})
    figure.update_xaxes(title_text="step", row=len(panels), col=1)
    return figure


def effect_intervals(effects: pd.DataFrame) -> go.Figure:
    """The filter's effect on final success per (task, variant, filter setting): the delta over seeds with its 95%
    bootstrap interval (``effects``: :func:`analysis.stats.science.filter_effect`)."""
    import plotly.graph_objects as go

    shown = effects.dropna(subset=["delta"])
    labels = [" · ".join(str(p) for p in (row.task, None if row.variant == "base" else row.variant, row.filter) if p)
              for row in shown.itertuples()]
    figure = go.Figure()
    figure.add_scatter(
        x=shown["delta"], y=labels, mode="markers", marker={"size": 10, "color": _color(0)}, name="delta",
        error_x={"type": "data", "symmetric": False, "array": (shown["hi"] - shown["delta"]).fillna(0),
                 "arrayminus": (shown["delta"] - shown["lo"]).fillna(0)},
        text=[f"{b} vs {f} seeds" for b, f in zip(shown["base_n"], shown["filt_n"], strict=True)],
    )
    figure.add_vline(x=0, line={"color": "grey"})
    figure.update_layout(title="filter effect on final success (filtered − baseline, 95% bootstrap interval over seeds)",
                         xaxis_title="success points", **LAYOUT)
    return figure
