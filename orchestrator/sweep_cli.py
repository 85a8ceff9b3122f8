"""`orch sweep | status | cancel | resume | logs` and `orch mlflow serve`.

Only typer is imported at module level: `orch --help` must not pay for sqlalchemy, submitit, mlflow or hydra.
Mounted into `orchestrator.cli` with `app.add_typer(sweep_cli.app)` (its commands become top-level commands).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from orchlib.errors import error_line
from orchlib.signals import StopSignal

app = typer.Typer(no_args_is_help=True)
mlflow_app = typer.Typer(no_args_is_help=True)
app.add_typer(mlflow_app, name="mlflow", help="Run a local MLflow tracking server for a sweep's jobs.",
              short_help="Run a local MLflow server for a sweep's jobs.")

StoreOpt = Annotated[
    str | None,
    typer.Option("--store", help="Store URL (default: $ORCH_STORE, else sqlite:///.orch/orch.db here)."),
]
SweepArg = Annotated[str, typer.Argument(help="Sweep name (the `name:` of its file).")]
ClusterOpt = Annotated[str, typer.Option("--cluster", help="Executor: local | slurm | debug.")]
STATUS_ROWS = 50  # cells `orch status` shows without --all


def _fail(message: str, code: int = 2) -> None:
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)


def _open_store(url: str | None, create: bool = False, readonly: bool = False):
    """The store at `url`; `readonly` for commands that only read it: nothing is written to a file that is not
    an orch store (one error line instead)."""
    from orchestrator.store import Store

    return Store.open_readonly(url) if readonly else Store.open(url, create=create)


def _reconcile(store, sweep) -> None:
    """Mark lost (or stalled, under the sweep's `cluster.stall` rule) the cells whose job vanished or hung, through
    a writable connection to the store (opened only when some cell is active: `store` was checked already)."""
    from orchestrator.engine import reconcile
    from orchestrator.states import ACTIVE

    if any(store.counts(sweep.id).get(state) for state in ACTIVE):
        reconcile(_open_store(store.url), sweep)


@app.command("sweep", short_help="Plan a sweep file's cells; submit those not done.")
def sweep_command(
    file: Annotated[Path, typer.Argument(help="Sweep file (YAML), e.g. sweeps/demo.yaml.")],
    cluster: ClusterOpt = "local",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the cells, resources and GPU-hours; write nothing.")] = False,
    preflight: Annotated[bool, typer.Option("--preflight", help="Check every cell as its job would start it (veRL's validation, model and data paths, memory, cost); exit 1 on a problem (what only you can supply is listed apart and does not fail it); write nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --preflight: one JSON object per cell class.")] = False,
    model_config: Annotated[Path | None, typer.Option("--model-config", help="A config.json for models whose folder is not on this host (--preflight, and the fit check before a submission).")] = None,
    submit_anyway: Annotated[bool, typer.Option("--submit-anyway", help="Submit a verl sweep's GPU cells even when the fit check before submission (memory, vLLM, veRL's validation, model and data paths) refuses them; its findings are printed as warnings.")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE: a config key forced on every cell, or a sweep field (cluster.*, resources.*, seeds, backend). Repeatable.")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="A named profile (the file's `profiles:` or sweeps/profiles.yaml), e.g. cpu.")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Also resubmit failed cells.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Block until every submitted cell has ended, showing progress.")] = False,
    limit: Annotated[int, typer.Option("--limit", help="Dry run: rows to print (0: all).")] = 200,
    tracking_uri: Annotated[str | None, typer.Option("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here).")] = None,
    store_url: StoreOpt = None,
    done_in: Annotated[list[Path] | None, typer.Option("--done-in", help="An archive folder (`orch archive`): its sweep's cells with a finished run there are done and not submitted (a long sweep run session by session). Repeatable.")] = None,
) -> None:
    """Expand a sweep file into cells and submit the ones not done yet (only what is missing)."""
    from orchlib.errors import OrchError

    try:
        from orchestrator.executors import get_executor
        from orchestrator.plan import build_plan
        from orchestrator.spec import load_sweep

        executor = get_executor(cluster)
        if as_json and not preflight:
            raise OrchError("--json goes with --preflight")
        if submit_anyway and (preflight or dry_run):
            raise OrchError("--submit-anyway goes with a submission, not with --preflight or --dry-run")
        if preflight:
            _run_preflight(file, profile, sets or [], as_json, model_config, tracking_uri)
            return
        plan = build_plan(load_sweep(file, profile=profile, sets=sets or []))
        if done_in:
            from analysis.stores.archive import finished_cells

            plan.drop_done(finished_cells(done_in, plan.name), ", ".join(map(str, done_in)))
        if dry_run:
            from orchestrator.views import print_plan

            print_plan(plan, limit)
            return
        from orchestrator.engine import submit_plan
        from orchestrator.views import print_submit

        plan.check_submittable()  # before the store is created: nothing is written for a sweep that cannot run
        executor.check_available()
        _fit_check(plan, model_config, submit_anyway)
        _preflight(tracking_uri)
        store = _open_store(store_url, create=True)
        report = submit_plan(plan, store, cluster, tracking_uri=tracking_uri, retry_failed=retry_failed,
                             sets=sets or [])
        print_submit(report)
        for note in plan.notes:
            typer.echo(f"note: {note}")
        if wait:
            _wait(store, plan.name)
    except OrchError as err:
        _fail(str(err))


@app.command("tune", short_help="Run an Optuna study whose trials are sweep cells.")
def tune_command(
    file: Annotated[Path, typer.Argument(help="Sweep file with a `study:` section, e.g. sweeps/tune_rho.yaml.")],
    cluster: ClusterOpt = "local",
    trials: Annotated[int | None, typer.Option("--trials", min=1, help="Trials in all (default: the study's `trials`).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate the study, print its space and first trials; write nothing.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Run the study here until it is done, one line per event (default: in the background).")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE forced on every trial's cells, or a sweep field. Repeatable.")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="A named profile, e.g. cpu.")] = None,
    tracking_uri: Annotated[str | None, typer.Option("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here).")] = None,
    submit_anyway: Annotated[bool, typer.Option("--submit-anyway", help="Submit a verl study's GPU trials even when the fit check (memory, vLLM, veRL's validation, model and data paths) refuses them; without it a refused trial fails and the study goes on, and a study none of whose corners fits is refused.")] = False,
    store_url: StoreOpt = None,
) -> None:
    """Run an Optuna study whose trials are cells of the sweep (ask/tell here, jobs as in any sweep, resumable)."""
    from orchlib.errors import OrchError

    try:
        from orchestrator.executors import get_executor
        from orchestrator.spec import load_sweep
        from orchestrator.tune import best_settings, first_trials, fit_refusal, plan_study

        executor = get_executor(cluster)
        if submit_anyway and dry_run:
            raise OrchError("--submit-anyway goes with a study that runs, not with --dry-run")
        study = plan_study(load_sweep(file, profile=profile, sets=sets or []))
        if dry_run:
            from orchestrator.views import print_study

            print_study(study, first_trials(study, 5), trials or study.spec.trials)
            return
        executor.check_available()
        refusal = fit_refusal(study)  # before the store is created: nothing is written for a study that cannot run
        if refusal and not submit_anyway:
            raise OrchError(refusal)
        if refusal:
            typer.echo(f"orch: warning (--submit-anyway): {refusal}", err=True)
        _preflight(tracking_uri)
        store = _open_store(store_url, create=True)
        if not wait:
            from orchestrator.engine import run_dir_for
            from orchestrator.tune import start_detached

            existing = store.sweep(study.name)
            run_dir = Path(existing.run_dir) if existing else run_dir_for(study.name)
            pid, log = start_detached(store.url, file.resolve(), profile, sets or [], cluster, tracking_uri, trials,
                                      run_dir, submit_anyway)
            typer.echo(f"study {study.name}: tuning in the background (pid {pid}, log {log}); "
                       f"follow it with `orch status {study.name}`, run `orch tune {file}` again to resume it")
            return
        from orchestrator.tune import Tuner

        tuner = Tuner(store, study, cluster, tracking_uri=tracking_uri, sets=sets or [], trials=trials,
                      submit_anyway=submit_anyway)

        def show(report) -> None:
            for event in report.events:
                typer.echo(f"study {study.name}: {event}")

        report = tuner.run(on_poll=show)
        states = ", ".join(f"{count} {state.lower()}" for state, count in sorted(report.states.items()))
        typer.echo(f"study {study.name}: {report.trials} trials ({states})")
        for best in report.best:
            typer.echo(f"best trial {best['number']}: {best['values']} with {best['params']}")
        line = best_settings(report)
        if line:
            typer.echo(f"use it: {line}")
    except OrchError as err:
        _fail(str(err))


def _run_preflight(file: Path, profile: str | None, sets: list[str], as_json: bool, model_config: Path | None,
                   tracking_uri: str | None) -> None:
    """`orch sweep FILE --preflight`: exit 1 when any cell class has a problem."""
    import sys

    from orchestrator.plan import build_plan
    from orchestrator.preflight import load_model_config, preflight_plan
    from orchestrator.spec import load_sweep
    from orchestrator.views import print_preflight

    extra = load_model_config(model_config)
    plan = build_plan(load_sweep(file, profile=profile, sets=sets))

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():
            print(f"\rpreflight: {done}/{total} configs", end="" if done < total else "\n", file=sys.stderr,
                  flush=True)

    from recipes.run.tracking import default_tracking_uri

    report = preflight_plan(plan, lambda cell: cell.resolved.config, extra, progress,
                            default_tracking_uri(tracking_uri))
    print_preflight(report, as_json)
    if report.problem_count:
        raise typer.Exit(1)


def _fit_check(plan, model_config: Path | None, submit_anyway: bool) -> None:
    """Before anything is written: a verl sweep's GPU cells pass `--preflight`'s memory, vLLM and veRL checks and
    their model and data paths exist (`orchestrator.preflight.fit_gate`), or the submission stops (exit 2, one line
    per class); `submit_anyway` prints the same lines as warnings and goes on."""
    from orchestrator.preflight import fit_gate, load_model_config
    from orchlib.errors import OrchError

    _, refusal = fit_gate(plan, load_model_config(model_config))
    if refusal is None:
        return
    if not submit_anyway:
        raise OrchError(refusal)
    for line in refusal.splitlines():
        typer.echo(f"orch: warning (--submit-anyway): {line.strip()}", err=True)


def _preflight(tracking_uri: str | None) -> None:
    """Before the store is created: the environment the jobs inherit, the cache and the tracking URI work."""
    from recipes.run.tracking import check_cache_folder, check_tracking_uri, default_tracking_uri

    _check_job_environment()
    check_cache_folder()
    check_tracking_uri(default_tracking_uri(tracking_uri), "--tracking-uri" if tracking_uri else
                       "$MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "tracking URI")


def _check_job_environment() -> None:
    """Environment variables the jobs will read (they inherit this environment)."""
    from orchestrator.job import HEARTBEAT_ENV
    from orchlib.errors import OrchError

    value = os.environ.get(HEARTBEAT_ENV)
    if value is not None:
        try:
            seconds = float(value)
        except ValueError:
            seconds = 0.0
        if not seconds > 0 or seconds == float("inf"):
            raise OrchError(f"${HEARTBEAT_ENV} {value!r}: expected seconds between heartbeats, a number > 0")


def _wait(store, name: str) -> None:
    """Follow a sweep until no cell is active, showing each running cell's step, phase, last success rate and
    heartbeat; exit 1 if any cell failed or was lost. In a terminal one live view; otherwise (a file, a pipe) a
    whole line whenever the counts or a running cell's step or phase change."""
    from rich.live import Live
    from rich.markup import escape

    from orchestrator.engine import wait
    from orchestrator.views import _console, counts_line, running_lines

    console = _console()
    sweep = store.require_sweep(name)

    def view(counts: dict[str, int]) -> tuple[str, list[tuple[str, str]]]:
        running = running_lines(store.status_rows(sweep.id), time.time()) if counts.get("running") else []
        return f"sweep {name}: {counts_line(counts)}", running

    if console.is_terminal:
        def show(counts: dict[str, int]) -> None:
            header, running = view(counts)
            live.update("\n".join([header, *(f"  {escape(what)} · {beat}" for what, beat in running)]))

        with Live(console=console, refresh_per_second=2, transient=False) as live:
            counts = wait(store, name, on_poll=show)
    else:
        shown: set[str] = set()

        def show(counts: dict[str, int]) -> None:
            header, running = view(counts)
            for line, beat in [(header, ""), *running]:
                if line not in shown:  # new counts, or a cell at a new step or phase
                    console.print(escape(f"  {line} ({beat})") if beat else line, soft_wrap=True)
                    shown.add(line)

        counts = wait(store, name, on_poll=show)
    if counts.get("failed") or counts.get("lost"):
        raise typer.Exit(1)


@app.command("status", short_help="Show a sweep's cells and their states.")
def status_command(
    sweep: Annotated[str | None, typer.Argument(help="Sweep name; omit to list every sweep.")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh every few seconds until no cell is active.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Counts and every cell as JSON.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Show every cell (default: the first 50, active first).")] = False,
    store_url: StoreOpt = None,
) -> None:
    """Counts per state and one row per cell, from the store (reconciled with squeue where jobs run on SLURM); a
    running cell whose heartbeat is older than the sweep's cluster.stall.after_s shows as stalled."""
    from orchlib.errors import OrchError

    try:
        store = _open_store(store_url, readonly=True)
        if sweep is None:
            from orchestrator.views import print_sweeps

            print_sweeps(store.sweep_summaries())
            return
        row = store.require_sweep(sweep)
        if watch:
            _watch(store, row, None if show_all else STATUS_ROWS)
            return
        _reconcile(store, row)
        if as_json:
            _print_json(store, row)
        else:
            from orchestrator.views import print_status

            print_status(row, store.counts(row.id), store.status_rows(row.id, None if show_all else STATUS_ROWS))
    except OrchError as err:
        _fail(str(err))


def _print_json(store, sweep) -> None:
    import json

    from orchestrator.views import mark_stalled

    cells = store.status_rows(sweep.id)
    mark_stalled(sweep, cells, time.time())
    for cell in cells:
        cell["varied"] = json.loads(cell.pop("varied_json"))
    typer.echo(json.dumps({"sweep": sweep.name, "executor": sweep.executor, "counts": store.counts(sweep.id),
                           "cells": cells}, indent=1))


def _watch(store, sweep, limit: int | None) -> None:
    from rich.live import Live
    from rich.text import Text

    from orchestrator.states import ACTIVE
    from orchestrator.views import _console, status_table

    console = _console()
    with Live(console=console, refresh_per_second=1) as live:
        try:
            while True:
                _reconcile(store, sweep)
                counts = store.counts(sweep.id)
                live.update(Text.from_markup(status_table(sweep, counts, store.status_rows(sweep.id, limit),
                                                          console.width)))
                if not any(counts.get(state) for state in ACTIVE):
                    return
                time.sleep(2)
        except StopSignal as stop:  # Ctrl-C ends the watch (the jobs go on); another stop signal ends the command
            if stop.number != signal.SIGINT:
                raise


@app.command("cancel", short_help="Cancel a sweep's queued and running cells.")
def cancel_command(
    sweep: SweepArg,
    cells: Annotated[list[str] | None, typer.Option("--cell", help="Cell digest (or a unique prefix); repeatable. Default: every cell.")] = None,
    store_url: StoreOpt = None,
) -> None:
    """Cancel the queued, running and pending cells of a sweep (running ones checkpoint and stop)."""
    from orchestrator.engine import cancel
    from orchlib.errors import OrchError

    try:
        count = cancel(_open_store(store_url), sweep, cells or [])
    except OrchError as err:
        _fail(str(err))
    typer.echo(f"sweep {sweep}: {count} cell(s) cancelled")


@app.command("resume", short_help="Resubmit a sweep's pending, cancelled or lost cells.")
def resume_command(
    sweep: SweepArg,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Executor (default: the sweep's last one).")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Also resubmit failed cells.")] = False,
    replan: Annotated[bool, typer.Option("--replan", help="First resolve every cell that may still run against conf/ as it is now, say which identities changed, and replace each changed cell by its new identity (without it, a cell runs the config it was planned with). A verl sweep's GPU cells pass orch sweep's fit check first.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --replan: list each identity that would change (old -> new cell, which keys changed) and the fit check's findings; write nothing, submit nothing.")] = False,
    submit_anyway: Annotated[bool, typer.Option("--submit-anyway", help="With --replan: replan and submit even when the fit check (memory, vLLM, veRL's validation, model and data paths) refuses the replanned cells; its findings are printed as warnings.")] = False,
    model_config: Annotated[Path | None, typer.Option("--model-config", help="With --replan: a config.json for models whose folder is not on this host (the fit check).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Block until every cell has ended.")] = False,
    store_url: StoreOpt = None,
) -> None:
    """Submit again the cells of a stored sweep that are pending, cancelled or lost (no sweep file needed)."""
    from orchestrator.engine import resume
    from orchlib.errors import OrchError

    try:
        if (dry_run or submit_anyway or model_config) and not replan:
            raise OrchError("--dry-run, --submit-anyway and --model-config go with --replan")
        if dry_run and (submit_anyway or wait):
            raise OrchError("--submit-anyway and --wait go with a resume, not with --dry-run")
        store = _open_store(store_url, readonly=dry_run)
        from orchestrator.views import print_replan, print_submit

        if replan:
            from orchestrator.engine import plan_replan
            from orchestrator.engine import replan as replan_sweep

            planned = plan_replan(store, sweep, reconciled=False)  # nothing written until the fit check passes
            if dry_run:
                from orchestrator.preflight import fit_gate, load_model_config

                print_replan(planned, dry_run=True)
                _, refusal = fit_gate(planned.plan, load_model_config(model_config))
                typer.echo(f"fit check: {refusal}" if refusal else "fit check: passed (or no verl GPU cell)")
                return
            if cluster is not None:
                from orchestrator.executors import get_executor

                get_executor(cluster).check_available()
            _fit_check(planned.plan, model_config, submit_anyway)
            print_replan(replan_sweep(store, sweep))
        print_submit(resume(store, sweep, executor=cluster, retry_failed=retry_failed))
        if wait:
            _wait(store, sweep)
    except OrchError as err:
        _fail(str(err))


@app.command("logs", short_help="Print the log files of a cell's job.")
def logs_command(
    sweep: SweepArg,
    cell: Annotated[str, typer.Argument(help="Cell digest or a unique prefix (see `orch status`).")],
    attempt: Annotated[int | None, typer.Option("--attempt", help="Attempt number (default: the latest).")] = None,
    stream: Annotated[str, typer.Option("--stream", help="out | err | both.")] = "both",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new output until the attempt ends.")] = False,
    store_url: StoreOpt = None,
) -> None:
    """Print the log files of a cell's job (stdout and stderr of the latest attempt)."""
    from orchlib.errors import OrchError, choices_error

    try:
        if stream not in ("out", "err", "both"):
            raise choices_error("stream", stream, ["out", "err", "both"], where="--stream")
        store = _open_store(store_url, readonly=True)
        row = store.require_sweep(sweep)
        (cell_row,) = store.find_cells(row.id, [cell])
        attempts = store.attempts(cell_row.id)
        if not attempts:
            raise OrchError(f"cell {cell_row.digest} has never been submitted")
        chosen = attempts[-1] if attempt is None else next((a for a in attempts if a.number == attempt), None)
        if chosen is None:
            raise choices_error("attempt", attempt, [str(a.number) for a in attempts], where=f"cell {cell_row.digest}")
        paths = [path for kind, path in (("out", chosen.stdout_path), ("err", chosen.stderr_path))
                 if path and stream in (kind, "both")]
        if not paths and chosen.executor == "debug":
            raise OrchError(f"cell {cell_row.digest} ran with --cluster debug: its output went to the terminal "
                            f"of `orch sweep`")
        if not paths:
            raise OrchError(f"attempt {chosen.number} of cell {cell_row.digest} has no log files yet "
                            f"(state {chosen.state})")
        _print_logs(store, chosen.id, [Path(path) for path in paths], follow)
    except OrchError as err:
        _fail(str(err))


def _print_logs(store, attempt_id: int, paths: list[Path], follow: bool) -> None:
    from orchestrator.states import ACTIVE

    offsets = dict.fromkeys(paths, 0)
    while True:
        for path in paths:
            if not path.exists():
                continue
            with path.open(errors="replace") as handle:
                handle.seek(offsets[path])
                text = handle.read()
                offsets[path] = handle.tell()
            if text:
                prefix = f"==> {path} <==\n" if len(paths) > 1 and not follow else ""
                typer.echo(prefix + text, nl=not text.endswith("\n"))
        if not follow:
            return
        state = next((a.state for a in store.attempts_by_id([attempt_id])), None)
        if state not in ACTIVE:
            return
        time.sleep(1)


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@mlflow_app.command("serve", short_help="Start a local MLflow server for the jobs.")
def mlflow_serve(
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface; then use --auth).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 5000,
    backend_store_uri: Annotated[str, typer.Option(help="Where runs are stored.")] = "sqlite:///mlflow.db",
    artifacts: Annotated[Path, typer.Option(help="Artifact folder.")] = Path("mlartifacts"),
    workers: Annotated[int, typer.Option(min=1, help="Server worker processes.")] = 2,
    auth: Annotated[bool, typer.Option("--auth", help="MLflow's basic-auth app (--app-name basic-auth): users and "
                                                     "passwords; the first start creates user admin with the password "
                                                     "in $MLFLOW_AUTH_ADMIN_PASSWORD.")] = False,
) -> None:
    """Start `mlflow server` (loopback by default); point jobs at it with --tracking-uri http://HOST:PORT."""
    import shutil
    import sys

    from orchlib.errors import OrchError

    try:
        if not host or any(ord(char) < 33 for char in host):
            raise OrchError(f"--host {host!r}: expected an address such as 127.0.0.1 or 0.0.0.0")
        if artifacts.exists() and not artifacts.is_dir():
            raise OrchError(f"--artifacts {artifacts}: is a file, not a folder")
    except OrchError as err:
        _fail(str(err))
    if host not in LOOPBACK and not auth:
        typer.echo(f"orch: warning: MLflow will listen on {host}:{port} without authentication: anyone who reaches "
                   f"this port can read, change and delete every run; add --auth for MLflow's basic-auth app",
                   err=True)
    command = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port),
               "--backend-store-uri", backend_store_uri, "--artifacts-destination", str(artifacts.resolve()),
               "--workers", str(workers)]
    if auth:
        command += ["--app-name", "basic-auth"]
    if shutil.which("mlflow", path=os.path.dirname(sys.executable)):
        command = [os.path.join(os.path.dirname(sys.executable), "mlflow"), *command[3:]]
    typer.echo(f"orch: {' '.join(command)}", err=True)
    os.execv(command[0], command)
