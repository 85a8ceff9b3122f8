"""`orch filter`: which prompt groups SNR-Aware Filtering keeps on a rollout batch, via the trainers' function."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.stats.filtering import FilterConfig, FilterResult, filter_groups


@dataclass(frozen=True)
class FilterReport:
    """The filter's decision on one step of a batch, with each group's statistics."""

    source: str
    step: int | None
    config: FilterConfig
    result: FilterResult
    groups: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "step": self.step,
            "config": self.config.model_dump(),
            "kept_groups": [g["prompt_id"] for g in self.groups if g["kept"]],
            "groups": self.groups,
            "loss_scale": self.result.loss_scale,
            "metrics": self.result.metrics,
        }


def _json_key(value: Any) -> Any:
    """numpy scalars to plain Python for JSON."""
    return value.item() if hasattr(value, "item") else value


def filter_batch_file(path: str | Path, config: FilterConfig, *, step: int | None = None) -> list[FilterReport]:
    """Apply the filter to every step (or one step) of a rollout-batch file."""
    from orchlib.errors import OrchError
    from recipes.stats.rollouts import iter_steps, load_rollout_batch

    source = str(path)
    reports = []
    for value, rows in iter_steps(load_rollout_batch(path), source, step):
        rewards, prompt_ids = rows["reward"].to_numpy(), rows["prompt_id"].to_numpy()
        try:
            result = filter_groups(rewards, prompt_ids, config)
        except ValueError as err:
            where = source if value is None else f"{source} (step {value})"
            raise OrchError(f"{where}: {err}") from None
        stats = result.stats
        groups = [
            {
                "prompt_id": _json_key(stats.keys[g]),
                "size": int(stats.size[g]),
                "mean": float(stats.mean[g]),
                "std": float(stats.std[g]),
                "var": float(stats.var[g]),
                "kept": bool(result.keep_groups[g]),
            }
            for g in range(stats.num_groups)
        ]
        reports.append(FilterReport(source=source, step=value, config=config, result=result, groups=groups))
    return reports


def print_filter_reports(reports: list[FilterReport], *, as_json: bool) -> None:
    """Print the decisions as JSON (``{"reports": [...]}``) or as a rich table per step."""
    if as_json:
        print(json.dumps({"reports": [r.to_json() for r in reports]}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for report in reports:
        title = report.source if report.step is None else f"{report.source} - step {report.step}"
        table = Table(title=f"{title}  [{_describe(report.config)}]", title_justify="left")
        for column in ("prompt_id", "size", "mean", "std", "var", "kept"):
            table.add_column(column, justify="left" if column == "prompt_id" else "right")
        by_score = sorted(report.groups, key=lambda g: -g[report.config.metric])
        for g in by_score:
            style = None if g["kept"] else "dim"
            table.add_row(
                str(g["prompt_id"]), str(g["size"]), f"{g['mean']:.3f}", f"{g['std']:.3f}", f"{g['var']:.3f}",
                "yes" if g["kept"] else "no", style=style,
            )
        console.print(table)
        m = report.result.metrics
        console.print(
            f"kept {int(m['rollout/kept_groups'])}/{int(m['rollout/total_groups'])} groups, "
            f"{int(m['rollout/kept_samples'])} trajectories (kept ratio {m['rollout/kept_ratio']:.1%}), "
            f"{int(m['rollout/zero_variance_groups'])} zero-variance groups, loss scale {report.result.loss_scale:.3f}"
        )
        if report.result.is_empty:
            console.print("[bold red]the filter keeps nothing: a trainer would skip this step[/]")
        console.print()


def _describe(config: FilterConfig) -> str:
    parts = [f"{config.strategy} {config.value:g}", f"metric={config.metric}"]
    if config.strategy == "top_p":
        parts.insert(1, config.prob_mode)
    if config.select_type != "largest":
        parts.append(config.select_type)
    parts.append("zero-var kept" if config.include_zero else "zero-var dropped")
    return ", ".join(parts)
