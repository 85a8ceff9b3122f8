"""`orch runs`, `orch report` and `orch archive`: query MLflow runs as a table, write a sweep's HTML report, and
keep a sweep's results as a small folder that can be committed and reported from later.

Only typer is imported at module level (`orch --help` stays fast); pandas, mlflow, sqlalchemy and plotly are
imported inside the commands.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchlib.errors import error_line

if TYPE_CHECKING:
    import pandas as pd

    from analysis.stores.mlflow_store import Progress, RunData

app = typer.Typer(add_completion=False, rich_markup_mode=None)

RUN_FORMATS = ("table", "csv", "json", "parquet")
AGGREGATES = ("last", "max", "min", "mean")
UriOpt = Annotated[
    str | None,
    typer.Option("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)."),
]


def _fail(message: str) -> None:
    typer.echo(error_line(message), err=True)
    raise typer.Exit(2)


@contextmanager
def _progress_bar() -> Iterator[Progress | None]:
    """A transient progress bar on stderr when it is a terminal; yields the (stage, done, total) callback the
    loaders take (a no-op otherwise, so logs and pipes stay clean)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as bar:
        task = bar.add_task("loading", total=None)

        def update(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        yield update


def runs_frame(data: RunData, agg: str, wide: bool) -> pd.DataFrame:
    """One row per run: identity, status, setting, and the ``agg`` of each loaded metric (a column per metric)."""
    from analysis.stats.summary import settings

    frame = data.runs[["run_id", "run_name", "experiment", "status", "start_time", "end_time"]]
    setting = settings(data.runs)[["run_id", "task", "algorithm", "model", "filter", "seed"]]
    frame = frame.merge(setting, on="run_id", how="left")
    if wide:
        extra = [c for c in data.runs.columns if c.startswith(("params.", "tags."))]
        frame = frame.merge(data.runs[["run_id", *extra]], on="run_id", how="left")
    if not data.metrics.empty:
        values = data.metrics.groupby(["run_id", "key"], sort=True)["value"].agg(agg).unstack("key")
        frame = frame.merge(values, left_on="run_id", right_index=True, how="left")
    return frame


def _cell(value: object) -> str:
    import pandas as pd

    if pd.api.types.is_scalar(value) and pd.isna(value):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _print_table(frame: pd.DataFrame) -> None:
    """A compact terminal table: short run ids, start time to the minute, no end time."""
    from rich.console import Console
    from rich.table import Table

    shown = frame.drop(columns=["end_time"], errors="ignore").assign(
        run_id=frame["run_id"].str.slice(0, 8), start_time=frame["start_time"].dt.strftime("%Y-%m-%d %H:%M")
    )
    table = Table(title=f"{len(frame)} runs", title_justify="left")
    for column in shown.columns:
        table.add_column(str(column), overflow="fold")
    for row in shown.itertuples(index=False):
        table.add_row(*(_cell(value) for value in row))
    console = Console()
    if not console.is_terminal:  # piped: do not fold the table into 80 columns
        console = Console(width=max(160, 12 * len(shown.columns)))
    console.print(table)


def _emit(frame: pd.DataFrame, fmt: str, out: Path | None) -> None:
    """Write the frame to ``out`` (or stdout) as csv, json, parquet (a file only) or a table."""
    if fmt == "parquet":
        if out is None:
            _fail("--format parquet needs --out FILE")
        out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(out, index=False)
        return
    if fmt == "csv":
        text = frame.to_csv(index=False)
    elif fmt == "json":
        text = frame.to_json(orient="records", date_format="iso", indent=2) + "\n"
    elif out is not None:
        text = frame.to_string(index=False) + "\n"
    else:
        _print_table(frame)
        return
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")


def _check_output(out: Path) -> None:
    """`--out` names a file in a folder this process may write or create (checked before any run is read)."""
    from orchlib.errors import OrchError
    from recipes.run.tracking import check_writable_folder

    if out.is_dir():
        raise OrchError(f"--out {out}: is a directory; give a file name")
    check_writable_folder(out.parent, "--out")


def _check_tracking(uri: str | None, archive: bool = False) -> None:
    """The tracking URI answers and (SQLite) already holds an MLflow database: reading must not create one. When
    the database is missing, the line says where one may be found (`archive`: the command reads archives too)."""
    import os

    from orchlib.errors import OrchError
    from recipes.run.tracking import check_tracking_uri, default_tracking_uri

    key = "--tracking-uri" if uri else "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "tracking URI"
    try:
        check_tracking_uri(default_tracking_uri(uri), key, existing=True)
    except OrchError as err:
        if "no MLflow database there" not in str(err):
            raise
        where = ("pass --tracking-uri URI (e.g. sqlite:////path/to/mlflow.db), or run it in the sweep's folder, "
                 "where its jobs wrote mlflow.db")
        raise OrchError(f"{err}; {where}" + ("; or read an archive with --archive DIR" if archive else "")) from None


@app.command("runs", short_help="Query MLflow runs as a table, CSV, JSON or Parquet.")
def runs(
    sweep: Annotated[str | None, typer.Option(help="Only this sweep's runs (its experiment and runs tagged sweep=S).")] = None,
    experiment: Annotated[list[str] | None, typer.Option(help="Only runs of this experiment (repeatable).")] = None,
    filter_string: Annotated[
        str | None, typer.Option("--filter", help="MLflow filter syntax, e.g. \"params.filter.value = '0.9'\".")
    ] = None,
    metrics: Annotated[str | None, typer.Option(help="Comma-separated metric names or globs: a column each.")] = None,
    agg: Annotated[str, typer.Option(help=f"Per-run value of each metric: {' | '.join(AGGREGATES)}.")] = "last",
    history: Annotated[bool, typer.Option("--history", help="Print the metric histories (long format) instead.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Add every params.* and tags.* column.")] = False,
    fmt: Annotated[str, typer.Option("--format", help=f"{' | '.join(RUN_FORMATS)}.")] = "table",
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout.")] = None,
    tracking_uri: UriOpt = None,
    reader: Annotated[str, typer.Option(help="auto (bulk SQL where possible) | sql | client.")] = "auto",
    archive: Annotated[list[Path] | None, typer.Option(
        "--archive", help="Read the runs from this archive folder (`orch archive`) instead of the tracking store; "
                          "repeatable (one sweep's archives from different sessions).")] = None,
) -> None:
    """Query MLflow runs as a table (params, tags, status, metric values), from the tracking store or archives."""
    from orchlib.errors import OrchError, choices_error

    try:
        if fmt not in RUN_FORMATS:
            raise choices_error("--format", fmt, RUN_FORMATS)
        if fmt == "parquet" and out is None:
            raise OrchError("--format parquet needs --out FILE")
        if agg not in AGGREGATES:
            raise choices_error("--agg", agg, AGGREGATES)
        if archive and (tracking_uri or experiment or filter_string or reader != "auto"):
            raise OrchError("orch runs: --archive reads archive folders: not with --tracking-uri, --experiment, "
                            "--filter or --reader")
        if out is not None:
            _check_output(out)
        if not archive:
            _check_tracking(tracking_uri, archive=True)
        from analysis.stores.mlflow_store import RunQuery, load_runs

        wanted = tuple(m.strip() for m in metrics.split(",") if m.strip()) if metrics else ()
        query = RunQuery(
            experiments=tuple(experiment or ()), sweep=sweep, filter_string=filter_string,
            metrics=wanted if (wanted or not history) else None,
        )
        if archive:
            data = _archived_runs(archive, sweep, query.metrics)
        else:
            with _progress_bar() as progress:
                data = load_runs(query, tracking_uri, reader=reader, progress=progress)
        frame = data.metrics if history else runs_frame(data, agg, wide)
    except OrchError as err:
        _fail(str(err))
    _emit(frame, fmt, out)


def _archived_runs(folders: list[Path], sweep: str | None, metrics: tuple[str, ...] | None) -> RunData:
    """The runs of archive folders (one sweep's; `sweep`: they must be its), with the metric histories `metrics`
    selects as the tracking store's reader does (names or globs; None all, () none)."""
    from dataclasses import replace

    from analysis.stores.archive import read_archives
    from analysis.stores.mlflow_query import select_metric_keys

    data, _ = read_archives(list(folders), sweep)
    keys = select_metric_keys(data.metrics["key"].unique(), metrics)
    return replace(data, metrics=data.metrics[data.metrics["key"].isin(keys)].reset_index(drop=True))


@app.command("rollouts", short_help="Write a run's rollout batches as JSONL or Parquet.")
def rollouts(
    run_id: Annotated[str, typer.Argument(help="The MLflow run whose rollout batches to write.")],
    step: Annotated[list[int] | None, typer.Option("--step", help="Only this dumped step (repeatable; default: all).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="jsonl | parquet.")] = "jsonl",
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of stdout (needed for parquet).")] = None,
    tracking_uri: UriOpt = None,
) -> None:
    """Write a run's rollout batches, one record per trajectory (every turn with its text and reward; whether the
    filter kept it), as JSONL or Parquet (docs/rollout_batch.md)."""
    import json
    import sys

    from orchlib.errors import OrchError, choices_error

    try:
        if fmt not in ("jsonl", "parquet"):
            raise choices_error("--format", fmt, ("jsonl", "parquet"))
        if fmt == "parquet" and out is None:
            raise OrchError("--format parquet needs --out FILE")
        if out is not None:
            _check_output(out)
        _check_tracking(tracking_uri)
        from analysis.stores.rollout_artifacts import run_batches, trajectory_records
        from recipes.run.tracking import default_tracking_uri

        frame = run_batches(default_tracking_uri(tracking_uri), run_id, step)
    except OrchError as err:
        _fail(str(err))
    if fmt == "parquet":
        from recipes.stats.rollouts import write_rollout_batch

        write_rollout_batch(frame, out)
        return
    lines = (json.dumps(record, ensure_ascii=False) + "\n" for record in trajectory_records(frame))
    if out is None:
        sys.stdout.writelines(lines)
    else:
        with open(out, "w", encoding="utf-8") as handle:
            handle.writelines(lines)


@app.command("report", short_help="Write a sweep's offline HTML report.")
def report(
    sweep: Annotated[str | None, typer.Argument(
        help="Sweep name (its MLflow experiment, or the sweep tag of its runs); omit with --paper.")] = None,
    out: Annotated[Path, typer.Option(help="The HTML file to write.")] = Path("report.html"),
    whole_paper: Annotated[bool, typer.Option(
        "--paper", help="Every item of the paper map from every paper sweep in the tracking store "
                        "(published beside measured; `orch paper` lists the map).")] = False,
    fmt: Annotated[
        str, typer.Option("--format", help="html, or png | pdf to also export every figure (needs kaleido).")
    ] = "html",
    bootstrap: Annotated[int, typer.Option(min=0, help="Bootstrap resamples for correlation CIs.")] = 1000,
    rollouts: Annotated[
        bool, typer.Option("--rollouts/--no-rollouts", help="Read rollout-batch artifacts (predictor, RV histograms).")
    ] = True,
    tracking_uri: UriOpt = None,
    store: Annotated[
        str | None, typer.Option("--store", help="orch state store URL (default: $ORCH_STORE, else .orch/orch.db here).")
    ] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="With --paper: exit 1 when a finished cell lacks a finite value of a metric its map item "
                         "needs (the CI rehearsal's check).")] = False,
    archive: Annotated[list[Path] | None, typer.Option(
        "--archive", help="Read the sweep's runs from this archive folder (`orch archive`) instead of the tracking "
                          "store; repeatable (archives of one sweep's cells from different sessions). With --paper: "
                          "each folder is read as the paper sweep its archive names, or SWEEP=DIR as that "
                          "sweep's.")] = None,
) -> None:
    """Write a sweep's report: tables, training curves, correlations, predictor verdicts (offline HTML)."""
    from orchlib.errors import OrchError

    try:
        from analysis.reports.report import FORMATS, build_report, kaleido_available, write_report

        if sweep is None and archive and not whole_paper:  # the sweep the archives name (archive.json)
            sweep = _archived_sweep(archive)
        if (sweep is None) == (not whole_paper):
            raise OrchError("orch report: give a sweep name or --paper (not both)")
        if strict and not whole_paper:
            raise OrchError("orch report: --strict checks the paper map's metrics: use it with --paper")
        if archive and tracking_uri:
            raise OrchError("orch report: --archive reads archive folders: not with --tracking-uri")
        if fmt not in FORMATS:
            raise OrchError(f"unknown --format {fmt!r}; valid choices: {', '.join(FORMATS)}")
        _check_output(out)
        paper_archives = None
        if archive and whole_paper:  # each folder read as its own paper sweep's, or SWEEP=DIR
            from analysis.reports.report import paper_archives as group_archives

            paper_archives = group_archives([str(folder) for folder in archive])
        elif archive:
            from analysis.stores.archive import check_archive

            for folder in archive:
                check_archive(folder)
        else:
            _check_tracking(tracking_uri, archive=True)
        if fmt != "html" and not kaleido_available():
            raise OrchError(f"--format {fmt} needs the kaleido package (pip install kaleido); use --format html")
        with _progress_bar() as progress:
            if whole_paper:
                from analysis.reports.report import build_paper_report

                built = build_paper_report(tracking_uri, n_boot=bootstrap, rollouts=rollouts, progress=progress,
                                           archives=paper_archives)
            else:
                cells = study = None
                if not archive:  # what the orch store knows of the sweep: its cells, and `orch tune`'s study
                    from orchestrator.api import sweep_cells, sweep_study

                    cells, study = sweep_cells(sweep, store), sweep_study(sweep, store)
                built = build_report(
                    sweep, tracking_uri, cells=cells, study=study, n_boot=bootstrap, rollouts=rollouts,
                    progress=progress, archives=archive or (),
                )
        written = write_report(built, out, fmt)
    except OrchError as err:
        _fail(str(err))
    for note in built.notes:
        typer.echo(f"note: {note}", err=True)
    for gap in built.gaps:
        typer.echo(f"gap: {gap}", err=True)
    typer.echo(f"wrote {written[0]}" + (f" and {len(written) - 1} figure files" if len(written) > 1 else ""))
    if built.held:
        typer.echo(built.held)
    for question, lines in built.headlines:  # the report's first screen, in brief
        typer.echo(question)
        for line in lines:
            typer.echo(f"  {line}")
    if whole_paper and built.comparisons:  # the verdicts in brief, each path's measured error rates beside
        from analysis.reports.paper_report import verdict_lines

        typer.echo("paper verdicts (published beside measured, with reasons: the report):")
        for line in verdict_lines(built.comparisons):
            typer.echo(f"  {line}")
    found = built.science
    for line in found.alert if found is not None else []:  # the alert: fired where, and its measured rates
        typer.echo(line if line.startswith("The collapse alert") else f"  {line}")
    if found is not None and found.reason:
        typer.echo(f"note: the paper's findings were not tested: {found.reason}", err=True)
    elif found is not None:
        typer.echo("findings over seeds (rules: docs/science.md):")
        for finding in found.findings:
            typer.echo(f"  {finding.line()}")
        if any(finding.key == "4" for finding in found.findings):  # beside the predictor's verdict: its record
            from analysis.stats.predictor_record import hit_rate_line

            typer.echo(f"  {hit_rate_line()}")
        from analysis.stats.science import trend_lines

        for line in trend_lines(found.trends):
            typer.echo(f"  {line}")
        for gap in found.untested:
            typer.echo(f"note: not tested yet: {gap}", err=True)
    if strict and built.gaps:
        typer.echo(f"orch report --strict: {len(built.gaps)} gap(s): a map item's metric without a finite value "
                   "in a finished cell", err=True)
        raise typer.Exit(1)


def _archived_sweep(folders: list[Path]) -> str:
    """The one sweep the archive folders name in their archive.json; OrchError when they name none or several."""
    from analysis.stores.archive import check_archive
    from orchlib.errors import OrchError

    named = {str(check_archive(folder).get("sweep")): folder for folder in folders}
    if len(named) != 1:
        raise OrchError(f"--archive: the folders are archives of sweeps {', '.join(sorted(named))}; give the sweep "
                        "name (orch report SWEEP --archive DIR ...)")
    return next(iter(named))


@app.command("paper", short_help="Map RAGEN-2's tables and figures to sweeps.")
def paper_command(
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 1 with one line per map item that has no sweep, needs a metric some cell of its sweep "
                        "does not log, or has no report section, and per paper sweep's cell class that does not "
                        "fit its declared GPUs (preflight's memory and vLLM checks).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the map (and problems) as JSON.")] = False,
    profile: Annotated[str | None, typer.Option(
        "--profile", help="Plan the sweeps under this profile of sweeps/profiles.yaml (--check).")] = None,
    store: Annotated[
        str | None, typer.Option("--store", help="orch state store URL (default: $ORCH_STORE, else .orch/orch.db here).")
    ] = None,
) -> None:
    """RAGEN-2, item by item: every table and figure -> its sweeps (and their cells' states in the store) -> the
    metrics they must log -> the report section -> the published values (docs/paper.md)."""
    import json

    from analysis import paper
    from orchestrator.paper_check import state_counts, sweep_gpu_hours
    from orchlib.errors import OrchError

    try:
        rows = paper.status(state_counts(paper.paper_sweeps(), store))
        hours: dict[str, float | None] = {}
        for row in rows:
            row["data"] = sorted({need for sweep in row["sweeps"] for need in paper.data_needs(sweep)})
            for sweep in row["sweeps"]:
                if sweep not in hours and paper.sweep_path(sweep).exists():
                    hours[sweep] = sweep_gpu_hours(paper.sweep_path(sweep))
            row["gpu_hours"] = {sweep: None if hours.get(sweep) is None else round(hours[sweep])
                                for sweep in row["sweeps"]}
        if check:
            from analysis.reports.paper_report import SECTIONS

            problems = paper_problems(set(SECTIONS), profile)
        else:
            problems = []
    except OrchError as err:
        _fail(str(err))
    if as_json:
        typer.echo(json.dumps({"items": rows, "problems": problems} if check else {"items": rows}, indent=1))
    else:
        for row in rows:
            typer.echo(f"{row['ref']} ({row['key']}): {row['title']}")
            for sweep, counts in row["sweeps"].items():
                state = ("not in the store" if counts is None else
                         ", ".join(f"{count} {name}" for name, count in sorted(counts.items())) or "no cells")
                cost = row["gpu_hours"][sweep]
                estimate = f"; ~{cost:,} GPU-hours (est., `orch sweep --preflight` for more)" if cost else ""
                typer.echo(f"  sweeps/{sweep}.yaml: {state}{estimate}")
            typer.echo(f"  logs: {', '.join(row['metrics'])}")
            typer.echo(f"  report section: {row['section']}; published values: {row['published']}")
            typer.echo(f"  settings: {row['settings']}")
            if row["data"]:
                typer.echo(f"  data: {'; '.join(row['data'])}")
        if check:
            for line in problems:
                typer.echo(f"paper --check: {line}", err=True)
            typer.echo(f"paper --check: {len(problems)} problem(s) in {len(rows)} items", err=bool(problems))
    if problems:
        raise typer.Exit(1)


def paper_problems(sections: set[str], profile: str | None = None) -> list[str]:
    """`orch paper --check`'s lines: the paper map's sweep files planned under `profile` on the orchestrator's side
    (`orchestrator.paper_check`: nothing is written; an unknown profile raises `OrchError`), handed to the map's
    check (`analysis.paper.check`)."""
    from analysis import paper
    from orchestrator.paper_check import plan_sweeps, unfit_by_sweep

    planned = plan_sweeps({sweep: paper.sweep_path(sweep) for sweep in paper.paper_sweeps()}, profile)
    return paper.check(sections, planned, unfit_by_sweep(planned))


@app.command("archive", short_help="Keep a sweep's results as a small folder.")
def archive_command(
    sweep: Annotated[str, typer.Argument(help="Sweep name (its MLflow experiment, or the sweep tag of its runs).")],
    out: Annotated[Path, typer.Option(help="The archive folder to write (must not exist yet).")],
    rollouts: Annotated[bool, typer.Option(
        "--rollouts/--no-rollouts", help="Keep the predictor on the baseline runs' first rollout batch.")] = True,
    tracking_uri: UriOpt = None,
) -> None:
    """Keep a sweep's results -- its runs, every metric history, the predictor on its first rollout batches -- as a
    small folder of Parquet files that `orch report SWEEP --archive DIR` reads without the tracking store (e.g. to
    commit a long run's results, or carry them off a cluster's scratch space). No checkpoint or rollout batch."""
    from orchlib.errors import OrchError

    try:
        if out.exists():
            raise OrchError(f"--out {out}: already exists; an archive is written into a new folder")
        from recipes.run.tracking import check_writable_folder

        check_writable_folder(out.parent, "--out")
        _check_tracking(tracking_uri)
        from analysis.reports.report import archive_sweep

        with _progress_bar() as progress:
            folder, count, notes = archive_sweep(sweep, out, tracking_uri, rollouts=rollouts, progress=progress)
    except OrchError as err:
        _fail(str(err))
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    size = sum(path.stat().st_size for path in folder.iterdir())
    typer.echo(f"wrote {folder}: {count} runs, {size / 1e6:.2f} MB")
