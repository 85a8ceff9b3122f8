"""Terminal output of the sweep commands: the dry-run table, the submit summary and `orch status`."""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

from orchestrator.states import ORDER, State

if TYPE_CHECKING:
    from orchestrator.plan import Plan

DEFAULT_MAX_ARRAY = 1001  # SLURM's default MaxArraySize, for dry-run estimates
STATE_STYLE = {
    State.FINISHED: "green", State.STOPPED: "green", State.RUNNING: "cyan", State.QUEUED: "blue",
    State.REQUEUED: "magenta", State.FAILED: "red", State.LOST: "red", State.CANCELLED: "yellow",
    State.PENDING: "dim", State.PRUNED: "yellow", "stalled": "bold red",
}
STALLED = "stalled"  # shown instead of `running` for a running cell whose heartbeat is too old


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if not isinstance(value, list | dict) else json.dumps(value)


def print_plan(plan: Plan, limit: int) -> None:
    """The dry run: a table of the varied keys, resources, resource groups, sbatch count and GPU-hours."""
    from rich.table import Table

    console = _console()
    definition = plan.definition
    spec = definition.spec
    profile = f", profile {definition.profile}" if definition.profile else ""
    backends = ", ".join(sorted({cell.backend for cell in plan.cells}))
    console.print(f"[bold]sweep {plan.name}[/] ({definition.path}{profile}): {len(plan.cells)} cells, backend {backends}")
    groups = plan.resource_groups()
    group_of = {resources: index for index, resources in enumerate(groups, start=1)}
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for column in ("#", "cell", *plan.varied, "res"):
        table.add_column(column, no_wrap=True, justify="right" if column == "#" else "left")
    shown = plan.cells if limit <= 0 else plan.cells[:limit]
    for cell in shown:
        values = plan.varied_values(cell)
        table.add_row(str(cell.index), cell.digest[:12], *(_text(values.get(key)) for key in plan.varied),
                      f"r{group_of[cell.resources]}")
    if console.measure(table, options=console.options.update(max_width=10**6)).maximum <= console.width:
        console.print(table)
    else:  # too wide for the terminal (80 columns): a line per cell, its settings as key=value, wrapped, none cut
        import textwrap

        width = len(str(shown[-1].index)) if shown else 1
        console.print(f"{'#':>{width}}  cell          res  settings (the keys that vary, where set)", style="bold",
                      highlight=False)
        for cell in shown:
            values = plan.varied_values(cell)
            settings = " ".join(f"{key}={_text(values[key])}" for key in plan.varied if values.get(key) is not None)
            head = f"{cell.index:>{width}}  {cell.digest[:12]}  r{group_of[cell.resources]:<3}"
            for line in textwrap.wrap(f"{head}{settings}", width=max(console.width, 40),
                                      subsequent_indent=" " * len(head), break_on_hyphens=False):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    if len(shown) < len(plan.cells):
        console.print(f"... {len(plan.cells) - len(shown)} more cells (--limit 0 shows all)")
    max_array = spec.cluster.max_array_size or DEFAULT_MAX_ARRAY
    sbatch = sum(math.ceil(len(cells) / max_array) for cells in groups.values())
    console.print(f"resource groups: {len(groups)} -> {sbatch} sbatch call(s) with --cluster slurm "
                  f"(arrays split at {max_array} cells)")
    for resources, cells in groups.items():
        console.print(f"  r{group_of[resources]}: {resources.label()}: {len(cells)} cells")
    console.print(f"estimated GPU-hours (every cell at its time limit): {plan.gpu_hours():,.1f}")
    problems = plan.problems()
    if problems:
        console.print(f"[bold red]problems[/] ({len(problems)}; `orch sweep` without --dry-run refuses the sweep):",
                      highlight=False)
        for line in problems:
            console.print(f"  - {line}", highlight=False, markup=False, soft_wrap=True)
    for note in plan.notes:
        console.print(f"note: {note}")
    console.print("[dim]dry run: nothing written, nothing submitted[/]")


def print_preflight(report: Any, as_json: bool) -> None:
    """`orch sweep --preflight`: one block per cell class (model, GPUs, memory, fit, cost, veRL's validation, every
    problem), then what only the user can supply ("needs from you"); or with `as_json` one JSON object per class on
    stdout (its `needs` among its fields; the plan's problems and needs on stderr)."""
    import sys

    if as_json:
        for line in report.plan_problems:
            print(f"problem: {line}", file=sys.stderr)
        for line in report.plan_needs:
            print(f"needs: {line}", file=sys.stderr)
        for group in report.classes:
            print(json.dumps(group.as_json()))
        return
    console = _console()
    console.print(f"[bold]preflight {report.sweep}[/]: {sum(g.cells for g in report.classes)} cells in "
                  f"{len(report.classes)} classes", highlight=False)
    for line in report.plan_problems:
        console.print(f"  problem: {line}", highlight=False, markup=False, soft_wrap=True)
    for index, group in enumerate(report.classes, start=1):
        if group.fits is None:
            fit = "no memory estimate"
        else:
            fit = (f"~{group.est_gb_per_gpu:.0f} of {group.gpu_mem_gb:g} GB per GPU (rollout {group.rollout_gb:.0f}, "
                   f"update {group.update_gb:.0f}): {'fits' if group.fits else 'DOES NOT FIT'}, micro-batch <= "
                   f"{group.max_micro_batch}")
        console.print(f"[bold]c{index}[/] {group.model} on {group.nodes}n x {group.gpus_per_node} GPU "
                      f"({group.backend}): {group.cells} cells, {group.configs} configs", highlight=False)
        if group.architecture:
            console.print(f"    model {group.architecture}; prompt budget {group.prompt_tokens}", highlight=False,
                          markup=False)
        if group.training:
            console.print(f"    training: {'; '.join(group.training)}", highlight=False, markup=False, soft_wrap=True)
        console.print(f"    memory {fit}", highlight=False, markup=False, soft_wrap=True)
        if group.gpu_hours:
            requeues = f", > time limit {group.limit_h:g} h: requeued" if group.wall_h > group.limit_h else ""
            console.print(f"    cost ~{group.gpu_hours:,.0f} GPU-hours, ~{group.wall_h:.1f} h per cell{requeues} "
                          f"({group.cost_basis})", highlight=False, markup=False, soft_wrap=True)
        console.print(f"    veRL validate_config: {group.validation}", highlight=False, markup=False)
        for line in group.lines():
            console.print(f"    problem: {line}", highlight=False, markup=False, soft_wrap=True)
    hours = report.gpu_hours
    console.print(f"estimated GPU-hours (throughput model, docs/verl.md#preflight): {hours:,.0f}" if hours else
                  "no GPU cells", highlight=False)
    if any(group.fits is not None for group in report.classes):
        from recipes.verl.memory_calibration import record_line

        console.print(record_line(), highlight=False, markup=False, soft_wrap=True)
    needs = report.need_lines()
    if needs:
        console.print("[bold]needs from you[/] (only you can supply these: they do not fail a preflight, they stop a "
                      "submission):", highlight=False, soft_wrap=True)
        for line in needs:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
    count = report.problem_count
    console.print(f"[bold red]{count} problem(s)[/]" if count else "[bold green]no problems[/]")
    console.print(f"[dim]preflight: {report.composed} veRL configs composed, {report.validated} validated, "
                  f"{report.seconds:.1f} s; nothing written, nothing submitted[/]", highlight=False, soft_wrap=True)


def print_study(study: Any, first: list[tuple[dict[str, Any], list[str]]], trials: int) -> None:
    """`orch tune --dry-run`: the search space, the objectives, the sampler and pruner, and the first trials."""
    from rich.markup import escape

    console = _console()
    spec = study.spec
    console.print(f"[bold]study {escape(study.name)}[/]: {trials} trials, {spec.parallel} at once, "
                  f"{spec.seeds_per_trial} seed(s) per trial; sampler {spec.sampler.name}, pruner {spec.pruner.name}"
                  + (f" on {escape(spec.pruner_metric())}" if spec.pruner.name != "none" else ""))
    for key, param in spec.space.items():
        if param.type == "categorical":
            where = f"one of {param.choices}"
        else:
            where = f"{param.type} in [{param.low:g}, {param.high:g}]" + (" (log)" if param.log else "") + (
                f" step {param.step:g}" if param.step else "")
        console.print(f"  {escape(key)}: {escape(where)}")
    for objective in spec.objectives:
        console.print(f"  objective: {objective.direction} the {objective.reduce} of {escape(objective.metric)} "
                      "(mean over the trial's seeds)")
    console.print("first trials (the sampler's first draws; later ones depend on the results):")
    for number, (params, digests) in enumerate(first):
        values = ", ".join(f"{key}={value}" for key, value in params.items())
        console.print(f"  trial {number}: {escape(values)} -> cell(s) {', '.join(d[:12] for d in digests)}")
    console.print("[dim]dry run: nothing written, nothing submitted[/]")


def print_submit(report: Any) -> None:
    """One line per fact of a submission."""
    console = _console()
    left = ", ".join(f"{count} {state}" for state, count in sorted(report.not_submitted.items())) or "none"
    console.print(f"sweep {report.sweep}: {report.cells} cells ({report.new} new); submitted {report.submitted} "
                  f"with --cluster {report.executor}; left as they are: {left}")
    if report.lost:
        console.print(f"{report.lost} cell(s) found lost (their job vanished without reporting)")


def print_replan(report: Any, dry_run: bool = False) -> None:
    """`orch resume --replan`: how many cells were resolved again, then one line per identity that changed (whole
    lines: a person greps them); `dry_run`: what would be done, with the keys that changed and the cells refused."""
    console = _console()
    changed = len(report.changed)
    if dry_run:
        console.print(f"sweep {report.sweep} (dry run: nothing written): {report.resolved} cell(s) that may still run "
                      f"resolved again against conf/: {report.unchanged} would keep their identity (config stored "
                      f"again), {changed + len(report.blocked)} changed identity"
                      + (" (would be replaced):" if changed or report.blocked else ""), soft_wrap=True)
        for old, state, new, outcome in report.changed:
            console.print(f"  cell {old} ({state}) -> cell {new}: {outcome}; changed: {report.what.get(old, '?')}",
                          soft_wrap=True, markup=False)
        for line in report.blocked:
            old = line.split()[1]
            console.print(f"  refused: {line}; changed: {report.what.get(old, '?')}", soft_wrap=True, markup=False)
        return
    console.print(f"sweep {report.sweep}: {report.resolved} cell(s) that may still run resolved again against conf/: "
                  f"{report.unchanged} same identity (config stored again), {changed} changed identity"
                  + (" (replaced):" if changed else ""), soft_wrap=True)
    for old, state, new, outcome in report.changed:
        console.print(f"  cell {old} ({state}) -> cell {new}: {outcome}", soft_wrap=True)


def counts_line(counts: dict[str, int]) -> str:
    """`finished 3 · running 2 · queued 1` in a fixed state order."""
    parts = [f"[{STATE_STYLE[state]}]{state} {counts[state]}[/]" for state in ORDER if counts.get(state)]
    return " · ".join(parts) or "no cells"


def status_table(sweep: Any, counts: dict[str, int], rows: list[dict[str, Any]], width: int = 120) -> str:
    """`orch status SWEEP` as rich markup: counts, then one row per given cell (active and failed first).

    A plain fixed-width table (rich's Table costs a third of a second on 50 rows; `orch status` must stay fast).
    """
    from rich.markup import escape

    varied = list(json.loads(sweep.varied_json))
    now = time.time()
    stalled = mark_stalled(sweep, rows, now)
    header = (f"[bold]sweep {escape(sweep.name)}[/] · {sum(counts.values())} cells · --cluster {sweep.executor} · "
              f"{counts_line(counts)}" + (f" · [red]{stalled} stalled[/]" if stalled else ""))
    rank = {state: index for index, state in enumerate(ORDER)}
    shown = sorted(rows, key=lambda row: (rank.get(row["state"], len(ORDER)), row["position"]))
    columns = ["cell", "state", "tries", "job", "steps", "success", *varied, "heartbeat", "updated", "reason"]
    table = []
    for row in shown:
        values = json.loads(row["varied_json"])
        reason = (row["reason"] or "").strip().splitlines()
        if row["stalled"]:
            reason = [f"stalled: last heartbeat {_age(now - row['heartbeat_at'])}"]
        steps, success = progress_cells(row)
        beat = _age(now - row["heartbeat_at"]) if row["state"] == "running" and row.get("heartbeat_at") else "-"
        table.append([row["digest"][:12], STALLED if row["stalled"] else row["state"], str(row["attempts"]),
                      row["job_id"] or "-", steps, success, *(_text(values.get(key)) for key in varied),
                      beat, _age(now - row["updated_at"]), reason[-1] if reason else ""])
    widths = [min(24, max([len(name), *(len(line[index]) for line in table)])) for index, name in enumerate(columns)]
    widths[-1] = max(12, width - sum(widths[:-1]) - 2 * (len(columns) - 1))
    lines = [header, "[bold]" + escape(_row(columns, widths)) + "[/]"]
    state_column = columns.index("state")
    for line in table:
        cells = [escape(_fit(text, size).ljust(size)) for text, size in zip(line, widths, strict=True)]
        cells[state_column] = f"[{STATE_STYLE.get(line[state_column], '')}]{cells[state_column]}[/]"
        lines.append("  ".join(cells).rstrip())
    total = sum(counts.values())
    if len(shown) < total:
        lines.append(f"... {total - len(shown)} more cells (--all shows every cell, --json gives them all)")
    return "\n".join(lines)


def progress_cells(row: dict[str, Any]) -> tuple[str, str]:
    """(steps, success) of a status row: a running cell's step k/N and phase from its job's progress, else the
    steps its last attempt reported done; the last step's rollout success rate."""
    progress = row.get("progress") or {}
    success = progress.get("success")
    success_text = "-" if success is None else f"{success:.2f}"
    if row["state"] == "running" and progress:
        return f"{progress.get('step', 0)}/{progress.get('total', '?')} {progress.get('phase', '')}".strip(), success_text
    return _text(row["steps_done"]), success_text


def running_lines(rows: list[dict[str, Any]], now: float) -> list[tuple[str, str]]:
    """One line per running cell for `orch sweep --wait`: (what it does, its heartbeat's age), e.g.
    ("cell 3f2a9c01d4e5 (task=sokoban): step 3/10 update, success 0.42", "heartbeat 12s ago")."""
    lines = []
    for row in rows:
        if row["state"] != "running":
            continue
        steps, success = progress_cells(row)
        varied = ", ".join(f"{key}={value}" for key, value in json.loads(row["varied_json"]).items())
        what = f"cell {row['digest'][:12]}" + (f" ({varied})" if varied else "") + f": step {steps}"
        if success != "-":
            what += f", success {success}"
        beat = f"heartbeat {_age(now - row['heartbeat_at'])}" if row.get("heartbeat_at") else "no heartbeat yet"
        lines.append((what, beat))
    return lines


def mark_stalled(sweep: Any, rows: list[dict[str, Any]], now: float) -> int:
    """Set `row["stalled"]` on each status row (running, heartbeat older than the sweep's `cluster.stall.after_s`);
    returns how many are."""
    from orchestrator.spec import ClusterSettings

    rule = ClusterSettings.model_validate_json(sweep.cluster_json).stall
    for row in rows:
        row["stalled"] = rule.stalled(row["state"], row.get("heartbeat_at"), now)
    return sum(row["stalled"] for row in rows)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(_fit(text, size).ljust(size) for text, size in zip(cells, widths, strict=True)).rstrip()


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def print_status(sweep: Any, counts: dict[str, int], rows: list[dict[str, Any]]) -> None:
    """Print `orch status SWEEP` to fit the terminal."""
    console = _console()
    console.print(status_table(sweep, counts, rows, console.width))


def print_sweeps(summaries: list[tuple[Any, dict[str, int]]]) -> None:
    """`orch status` without a sweep: one line per sweep."""
    console = _console()
    if not summaries:
        console.print("no sweeps in this store yet (run `orch sweep FILE`)")
    for sweep, counts in summaries:
        console.print(f"[bold]{sweep.name}[/] ({sweep.executor}): {counts_line(counts)}")
