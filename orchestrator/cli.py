"""The `orch` command line.

Every command imports its heavy dependencies (numpy, pandas, torch, mlflow, verl) inside its body, so that
`orch --help` and `orch COMMAND --help` stay fast. Sub-command groups live next to the code they drive and are
registered below; their modules must obey the same rule (only `typer` at module level).
"""

from __future__ import annotations

import functools
import sys
import typing
from pathlib import Path
from typing import Annotated

import click
import typer
from typer.core import TyperCommand, TyperGroup

from orchlib.errors import OrchError, error_line, fault_line, validation_error
from orchlib.signals import StopSignal, stop_ends_command


class OneLineErrors(TyperGroup):
    """The root command: click's usage errors (an unknown option, a missing argument, a bad number) become ONE line
    on stderr, `orch: error: SUBCOMMAND: message` (`orch: error: message` for orch's own options), with exit code 2,
    like every other error."""

    def main(self, *args: typing.Any, standalone_mode: bool = True, **kwargs: typing.Any) -> typing.Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            with stop_ends_command():
                code = super().main(*args, standalone_mode=False, **kwargs)
        except StopSignal as stop:  # SIGTERM, SIGUSR2 or SIGINT in a command that trains nothing (orchlib.signals)
            click.echo(f"orch {' '.join(sys.argv[1:2])}: stopped by {stop.name}; {_after_stop(sys.argv[1:])}",
                       err=True)
            sys.exit(stop.exit_code)
        except click.exceptions.NoArgsIsHelpError as err:  # `orch`, `orch mlflow`: the help, as click prints it
            err.show()
            sys.exit(err.exit_code)
        except click.ClickException as err:
            path = err.ctx.command_path if getattr(err, "ctx", None) else "orch"
            command = path.partition(" ")[2]  # the sub-command (`sweep`, `env play`); '' for orch itself
            message = " ".join(_usage_message(err).split()).removesuffix(".")
            click.echo(error_line(f"{command + ': ' if command else ''}{message} (see {path} --help)"), err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("orch: aborted", err=True)
            sys.exit(1)
        except Exception as err:  # a fault of the machine (a full disk) is one line in every command
            line = fault_line(err)
            if line is None:
                raise
            click.echo(error_line(line), err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _usage_message(err: click.ClickException) -> str:
    """click's message, but an unknown command or option gets one suggestion, once (`did_you_mean`): click 8.4's own
    'Did you mean' and Typer's on top of it named two, or the same one twice."""
    from orchlib.errors import did_you_mean

    if isinstance(err, click.exceptions.NoSuchOption):
        params = err.ctx.command.get_params(err.ctx) if getattr(err, "ctx", None) else []
        valid = [name for param in params if not getattr(param, "hidden", False)
                 for name in param.opts + param.secondary_opts if name.startswith("-")] or err.possibilities or []
        return f"No such option {err.option_name!r}{did_you_mean(err.option_name, valid)}"
    if isinstance(err, click.exceptions.NoSuchCommand):
        group = err.ctx.command if getattr(err, "ctx", None) else None
        valid = group.list_commands(err.ctx) if isinstance(group, click.Group) else err.possibilities or []
        return f"No such command {err.command_name!r}{did_you_mean(err.command_name, valid)}"
    return err.format_message()


def _after_stop(argv: list[str]) -> str:
    """What a stop signal leaves of the command `argv` (docs/reliability.md, "Every long phase")."""
    if argv[:1] == ["status"]:
        return "its cells go on"
    if argv[:1] == ["tune"]:
        return "its running trials go on; the same command resumes the study"
    if argv[:1] in (["sweep"], ["eval"], ["resume"]) and "--wait" in argv:
        return "the cells it submitted go on (orch status; orch cancel stops them)"
    if argv[:1] == ["sweep"] and "--preflight" in argv:
        return "nothing was written"
    if argv[:1] == ["export"]:
        return "nothing is written (its scratch folder removed); run it again"
    if argv[:1] == ["eval"]:
        return "no evaluation run is kept; run it again"
    return "what it was writing is not kept (run it again)"


app = typer.Typer(
    cls=OneLineErrors,
    name="orch",
    help="Experiment orchestration and sweeps for agentic-RL research (RAGEN-2).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rendering help with rich costs ~0.15 s of start-up
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"orch {version('orch')}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                               help="Print orch's version and exit.")] = False,
) -> None:
    pass  # orch's own options; its help is the Typer's above


# --- sub-command groups (one line each; keep their modules light) -------------------------------------------
from envs.cli import app as env_app  # noqa: E402

app.add_typer(env_app, name="env", help="Inspect, play and demonstrate the environments.",
              short_help="Inspect, play and demonstrate the environments.")
from orchestrator.sweep_cli import app as sweep_app  # noqa: E402

app.add_typer(sweep_app)  # top-level: sweep, status, cancel, resume, logs; and `orch mlflow serve`
from recipes.train_cli import train_command  # noqa: E402

app.command("train", short_help="Train one agent with RL: one run, logged to MLflow.",
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(train_command)
from recipes.cache_cli import app as cache_app  # noqa: E402

app.add_typer(cache_app, name="cache", short_help="List orch's cache; remove what killed writers left.")
from analysis.cli import app as analysis_app  # noqa: E402

app.add_typer(analysis_app)  # top-level: runs, report
# -------------------------------------------------------------------------------------------------------------


BatchArg = Annotated[Path, typer.Argument(help="Rollout batch: .parquet, .jsonl/.json or .csv (see docs/rollout_batch.md).")]
StepOpt = Annotated[int | None, typer.Option("--step", help="Analyse only this `step` of a multi-step file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
MetricOpt = Annotated[str, typer.Option("--metric", help="Per-prompt reward-variance score: 'var' or 'std'.")]


def _fail(message: str, code: int = 2) -> None:
    """Print one clear line to stderr and exit with ``code``."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)


@app.command("eval", short_help="Evaluate a trained policy on validation seeds.")
def eval_command(
    source: Annotated[str | None, typer.Argument(help="An MLflow run id, a checkpoint folder (torch or veRL) or a Hugging Face folder (or --sweep).")] = None,
    task: Annotated[str | None, typer.Option("--task", help="The task to play (default: the run's; needed for a Hugging Face folder).")] = None,
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Validation seeds (problems), disjoint from training.")] = 16,
    samples: Annotated[int, typer.Option("--samples", min=1, help="Samples per problem (n of pass@k).")] = 1,
    temperature: Annotated[float | None, typer.Option("--temperature", min=0.0, help="Sampling temperature, 0 for greedy (default: the run's trainer.val_temperature).")] = None,
    pass_k: Annotated[int, typer.Option("--pass-k", min=1, help="k of pass@k (<= --samples).")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    engine: Annotated[str, typer.Option("--engine", help="Rollout engine: torch (orch's sampler) | vllm (vLLM's offline engine, where vLLM is installed; text tasks).")] = "torch",
    experiment: Annotated[str, typer.Option("--experiment", help="MLflow experiment of the evaluation run.")] = "orch-eval",
    tracking_uri: Annotated[str | None, typer.Option("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here).")] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="Evaluate every finished cell of this stored sweep, as the cells of sweep NAME.eval (instead of SOURCE).")] = None,
    best: Annotated[bool, typer.Option("--best", help="With --sweep: each cell's best checkpoint (peak validation success); else its latest.")] = False,
    cluster: Annotated[str, typer.Option("--cluster", help="With --sweep: executor of the evaluation cells: local | slurm | debug.")] = "local",
    wait: Annotated[bool, typer.Option("--wait", help="With --sweep: block until every evaluation cell has ended, showing progress.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --sweep: print the evaluation cells; write nothing.")] = False,
    store_url: Annotated[str | None, typer.Option("--store", help="With --sweep: store URL (default: $ORCH_STORE, else sqlite:///.orch/orch.db here).")] = None,
) -> None:
    """Evaluate a trained policy on validation seeds into a new MLflow run linked to its source: success, mean
    reward, pass@k, reply length, format validity, turns, and the trajectories as a rollout batch. With `--sweep S
    --best`: every finished cell of S, as sweep-tracked evaluation cells (sweep S.eval) that `orch report` uses."""
    from orchlib.errors import OrchError

    if (sweep is None) == (source is None):
        _fail("give either SOURCE or --sweep NAME")
    if sweep is None and (best or wait or dry_run or store_url):
        _fail("--best, --wait, --dry-run and --store go with --sweep")
    if sweep is not None and task is not None:
        _fail("--task goes with SOURCE: an evaluation cell plays its training cell's task")
    if sweep is not None and engine != "torch":
        _fail("--engine vllm goes with SOURCE: evaluation cells play on the torch engine")
    try:
        if pass_k > samples:
            raise OrchError(f"--pass-k {pass_k} needs --samples >= {pass_k} (got {samples})")
        if sweep is not None and temperature == 0:
            raise OrchError("--temperature 0 (greedy) goes with SOURCE; evaluation cells sample")
        if sweep is not None:
            from orchestrator.evaluation import EvalRequest

            request = EvalRequest("best" if best else "latest", episodes, samples, temperature, pass_k, seed)
            _evaluate_sweep(sweep, request, cluster, wait, dry_run, tracking_uri, store_url)
            return
        from recipes.run.tracking import RunTracker, check_tracking_uri, default_tracking_uri
        from recipes.trained.evaluate import EvalSettings, check_engine, evaluate, load_source

        check_engine(engine)  # before loading anything
        uri = default_tracking_uri(tracking_uri)
        check_tracking_uri(uri, "--tracking-uri" if tracking_uri else "tracking URI")
        policy = load_source(source, tracking_uri, task)
        settings = EvalSettings(episodes=episodes, samples=samples, temperature=temperature, pass_k=pass_k, seed=seed,
                                engine=engine)
        typer.echo(f"evaluating {source} (step {policy.step}) on {policy.cfg.task.name}: {episodes} problems x "
                   f"{samples} samples", err=True)
        metrics, frame = evaluate(policy, settings)
    except OrchError as err:
        _fail(str(err))
    tracker = RunTracker(uri, experiment, run_id=None, run_name=f"eval-{policy.cfg.task.name}-step{policy.step}")
    tracker.set_tags({"orch.eval.source": source, "orch.eval.source_run": policy.source_run or "",
                      "orch.eval.step": str(policy.step), "task": policy.cfg.task.name})
    tracker.log_params({"eval.episodes": str(episodes), "eval.samples": str(samples),
                        "eval.temperature": str(temperature if temperature is not None
                                                else policy.cfg.trainer.val_temperature),
                        "eval.pass_k": str(pass_k), "eval.seed": str(seed), "eval.engine": engine})
    tracker.log_metrics(metrics, step=policy.step)
    tracker.log_frame(frame, "rollouts", f"step_{policy.step:04d}.parquet")
    tracker.end("FINISHED")
    for key, value in sorted(metrics.items()):
        typer.echo(f"{key}: {value:.4f}")
    typer.echo(f"MLflow run {tracker.run_id} (experiment {experiment})")


def _evaluate_sweep(name: str, request, cluster: str, wait: bool, dry_run: bool, tracking_uri: str | None,
                    store_url: str | None) -> None:
    """`orch eval --sweep`: plan the evaluation cells of stored sweep `name` and submit the missing ones."""
    from orchestrator.engine import submit_plan
    from orchestrator.evaluation import plan_evaluation
    from orchestrator.executors import get_executor
    from orchestrator.sweep_cli import _open_store, _wait
    from orchestrator.views import print_plan, print_submit

    executor = get_executor(cluster)
    store = _open_store(store_url)
    plan = plan_evaluation(store, name, request)
    if dry_run:
        print_plan(plan, 0)
        return
    plan.check_submittable()
    executor.check_available()
    report = submit_plan(plan, store, cluster, tracking_uri=tracking_uri)
    print_submit(report)
    for note in plan.notes:
        typer.echo(f"note: {note}")
    if wait:
        _wait(store, plan.name)


@app.command("export", short_help="Write a trained policy as a Hugging Face folder.")
def export_command(
    source: Annotated[str, typer.Argument(help="An MLflow run id, a torch-backend checkpoint folder (trainer.checkpoint_dir) or one checkpoint (step_N/).")],
    hf: Annotated[Path, typer.Option("--hf", help="The Hugging Face folder to write (must not exist, or be empty).")],
    tracking_uri: Annotated[str | None, typer.Option("--tracking-uri", help="With a run id: MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here).")] = None,
    adapter: Annotated[bool, typer.Option("--adapter", help="A LoRA run (model.lora.rank > 0): write its adapter alone (peft's folder) instead of the model with the adapter merged in.")] = False,
) -> None:
    """Write a trained policy as a Hugging Face folder that transformers and vLLM load (weights, tokenizer, card);
    a LoRA run's adapter merged in, or alone with --adapter."""
    from orchlib.errors import OrchError

    try:
        from recipes.trained.export import check_target, export_hf, resolve_checkpoint, run_metrics

        checkpoint = resolve_checkpoint(source, tracking_uri)
        check_target(hf)
        out = export_hf(checkpoint, hf, run_metrics(source, tracking_uri), adapter=adapter)
    except OrchError as err:
        _fail(str(err))
    typer.echo(f"exported {checkpoint} to {out}")


@app.command("predict-filter-gain", short_help="Predict from one rollout batch if filtering helps.")
def predict_filter_gain(
    batch: Annotated[Path | None, typer.Argument(
        help="Rollout batch: .parquet, .jsonl/.json or .csv (see docs/rollout_batch.md); or use --run.")] = None,
    run: Annotated[str | None, typer.Option(
        "--run", help="Instead of a file: the rollout batch this MLflow run logged (its first dumped step, or --step).")] = None,
    tracking_uri: Annotated[str | None, typer.Option(
        "--tracking-uri", help="With --run: MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).")] = None,
    step: StepOpt = None,
    metric: MetricOpt = "var",
    helps_above: Annotated[float, typer.Option(help="Ratio std(RV)/mean(RV) at or above which filtering likely helps.")] = 1.0,
    hurts_below: Annotated[float, typer.Option(help="Ratio below which filtering is unlikely to help.")] = 0.5,
    as_json: JsonOpt = False,
) -> None:
    """Predict from ONE rollout batch (a file, or a run's logged batch) whether SNR-Aware Filtering will help."""
    if (batch is None) == (run is None):
        _fail("give a rollout-batch file (BATCH) or --run RUN_ID, not both or neither")
    if tracking_uri is not None and run is None:
        _fail("--tracking-uri goes with --run RUN_ID")
    try:
        from analysis.stats.predictor import PredictorThresholds, predict_batch_file, predict_frame

        thresholds = PredictorThresholds(helps_above=helps_above, hurts_below=hurts_below)
        if run is None:
            reports = predict_batch_file(batch, step=step, metric=metric, thresholds=thresholds)
        else:
            from analysis.stores.mlflow_store import resolve_tracking_uri
            from analysis.stores.rollout_artifacts import run_batch

            frame, source = run_batch(resolve_tracking_uri(tracking_uri), run, step)
            reports = predict_frame(frame, source, metric=metric, thresholds=thresholds)
    except OrchError as err:
        _fail(str(err))
    from analysis.reports.predictor_view import print_reports

    try:
        print_reports(reports, metric=metric, as_json=as_json)
    except OrchError as err:  # a hand-edited or stale record: one line, before anything is printed
        _fail(str(err))


class ModelOptionsCommand(TyperCommand):
    """A command that also takes one option per field of a pydantic model (`model`, as "module:Class"): the
    field's name, default and description become the option's. The options are built only when the command parses
    its arguments or prints its help, so `orch --help` imports nothing heavy. The values the user gave are in
    `ctx.meta["model_options"]`; the model itself supplies every default and validates."""

    model = ""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        return [*params[:-1], *_model_options(self.model), params[-1]]  # --help stays last


@functools.cache
def _model_options(model: str) -> tuple[click.Option, ...]:
    import importlib

    module, _, name = model.partition(":")
    cls = getattr(importlib.import_module(module), name)

    def given(ctx: click.Context, param: click.Parameter, value: object) -> None:
        if ctx.get_parameter_source(param.name) != click.core.ParameterSource.DEFAULT:
            ctx.meta.setdefault("model_options", {})[param.name] = value

    options = []
    for field, info in cls.model_fields.items():
        flag = "--" + field.replace("_", "-")
        numeric = set(typing.get_args(info.annotation) or (info.annotation,)) <= {int, float}
        extra = dict(is_flag=True) if info.annotation is bool else dict(type=float if numeric else str)
        declaration = f"{flag}/--no-{flag[2:]}" if info.annotation is bool else flag
        options.append(click.Option([declaration, field], default=info.default, show_default=True,
                                    help=info.description or "", expose_value=False, callback=given, **extra))
    return tuple(options)


class FilterCommand(ModelOptionsCommand):
    model = "recipes.stats.filtering:FilterConfig"


@app.command("filter", cls=FilterCommand, short_help="Show which prompt groups the filter keeps.")
def filter_batch(
    ctx: typer.Context,
    batch: BatchArg,
    step: StepOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show which prompt groups SNR-Aware Filtering keeps on a rollout batch (the trainers' own function); every
    option of the filter (`filter.*` of the training config) is an option here."""
    try:
        from pydantic import ValidationError

        from analysis.reports.filter_report import filter_batch_file
        from recipes.stats.filtering import FilterConfig

        try:
            config = FilterConfig(**ctx.meta.get("model_options", {}))
        except ValidationError as err:
            raise validation_error(err, "filter options", model=FilterConfig) from None
        reports = filter_batch_file(batch, config, step=step)
    except OrchError as err:
        _fail(str(err))
    from analysis.reports.filter_report import print_filter_reports

    print_filter_reports(reports, as_json=as_json)


def main() -> None:
    """Console-script entry point."""
    from orchlib.shutdown import before_exit

    try:
        app()
    finally:
        before_exit()  # the process exits now: skip the shutdown collections over torch's and MLflow's objects


if __name__ == "__main__":
    main()
