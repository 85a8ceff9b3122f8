"""Terminal and JSON presentation of predictor reports (`orch predict-filter-gain`): per step the ratio's score,
the verdict with how it fared on held-out runs, what the trainer's filter keeps; once per command the record's line
(:func:`analysis.stats.predictor_record.hit_rate_line`)."""

from __future__ import annotations

import json

from analysis.stats.predictor import SCORE_NAMES, PredictorReport

VERDICT_STYLE = {"likely helps": "bold green", "unlikely to help": "bold red", "uncertain": "bold yellow"}


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_reports(reports: list[PredictorReport], *, metric: str, as_json: bool) -> None:
    """Print reports as a JSON document (``{"metric", "reports": [...], "record": {...}}``) or as rich tables, one
    block per step, and the predictor's measured record once."""
    from analysis.stats.predictor_record import hit_rate_line, load_record, verdict_note

    record = load_record()
    line, note = hit_rate_line(record), verdict_note(record)
    if as_json:
        held = {key: record.get(key) for key in ("n", "decided", "hits", "misses", "undecided", "no_call", "net",
                                                 "wilson", "delta", "kept", "best", "beats", "source")}
        print(json.dumps({"metric": metric, "reports": [r.to_json() for r in reports],
                          "record": {"line": line, "verdict_note": note, **held}}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for report in reports:
        title = report.source if report.step is None else f"{report.source} - step {report.step}"
        summary = Table(title=title, show_header=False, title_justify="left")
        summary.add_row("prompts x trajectories", f"{report.num_prompts} prompts, {report.num_trajectories} trajectories")
        for name in ("var", "std"):
            marker = "  <- the verdict's ratio" if name == report.metric else ""
            summary.add_row(
                f"RV as {SCORE_NAMES[name]}: mean / std / ratio",
                f"{_fmt(report.rv_mean[name])} / {_fmt(report.rv_std[name])} / {_fmt(report.ratio[name], 2)}{marker}",
            )
        summary.add_row("zero-variance prompts", f"{report.zero_variance_share:.1%}")
        summary.add_row("verdict", f"[{VERDICT_STYLE[report.verdict]}]{report.verdict}[/] ({note})")
        console.print(summary)

        kept = Table(title=f"kept by top-p, groups ranked by reward {SCORE_NAMES[report.kept_metric]} (the trainer's "
                           "filter score) - prompts / trajectories", title_justify="left")
        kept.add_column("prob mode")
        rhos = sorted({k.rho for k in report.kept})
        for rho in rhos:
            kept.add_column(f"rho={rho:g}", justify="right")
        for mode in dict.fromkeys(k.prob_mode for k in report.kept):
            rows = {k.rho: k for k in report.kept if k.prob_mode == mode}
            zero = "zero-var kept" if rows[rhos[0]].include_zero else "zero-var dropped"
            label = f"{mode} ({zero}{', the trainer default' if mode == 'linear' else ''})"
            kept.add_row(label, *(f"{rows[r].prompts:.0%} / {rows[r].trajectories:.0%}" for r in rhos))
        console.print(kept)
        console.print(report.reason, highlight=False)
        console.print(
            f"thresholds: helps >= {report.thresholds.helps_above:g}, hurts < {report.thresholds.hurts_below:g}",
            style="dim",
        )
        console.print()
    console.print(line, style="dim", highlight=False)  # once per command: how often the verdict was right
