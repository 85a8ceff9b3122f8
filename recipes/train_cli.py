"""`orch train key=value ...`: one training run from `conf/` with Hydra-syntax overrides.

Exit codes: 0 finished (or stopped early by the run itself, e.g. nothing left to learn from), 2 bad config,
75 (`recipes.runtime.checkpoint.REQUEUE_EXIT_CODE`) checkpointed after SIGUSR2/SIGTERM/SIGINT (requeue me), 130 a second
Ctrl-C (stopped at once), 1 failed.
Only `typer` is imported at module level (the CLI must start fast).
"""

from __future__ import annotations

from typing import Annotated

import typer

OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(help="Hydra overrides, e.g. task=frozenlake algorithm=grpo filter.value=0.95 trainer.total_steps=5",
                   show_default=False),
]


def train_command(
    ctx: typer.Context,
    overrides: OverridesArg = None,
    print_config: Annotated[bool, typer.Option("--print-config", help="Print the composed config and exit.")] = False,
) -> None:
    """Train one agent with RL (rollouts, SNR-Aware Filtering, update, validation; metrics to MLflow)."""
    from orchlib.errors import OrchError, error_line, fault_line
    from recipes.config.resolve import resolve_cell

    arguments = [*(overrides or []), *ctx.args]
    try:
        cfg = resolve_cell(overrides=arguments, host=True).config
        if cfg.evaluation.source is not None:
            raise OrchError("config key evaluation.source: set, but `orch train` trains; evaluate a checkpoint with "
                            "`orch eval SOURCE`, or every finished cell of a sweep with `orch eval --sweep S --best`")
    except OrchError as err:
        typer.echo(error_line(err), err=True)
        raise typer.Exit(2) from None
    if print_config:
        import yaml

        typer.echo(yaml.safe_dump(cfg.to_tree(), sort_keys=False).rstrip())
        if cfg.backend == "verl":
            from recipes.verl.backend import describe

            typer.echo("# --- veRL's config for this run (recipes/verl/config_map.py) ---")
            typer.echo(describe(cfg).rstrip())
        return

    from recipes.run.tracking import check_run_targets

    try:
        check_run_targets(cfg.infra)  # before the backend's heavy imports (`tracked_run` checks again, for jobs)
    except OrchError as err:
        typer.echo(error_line(err), err=True)
        raise typer.Exit(2) from None
    from recipes.run.progress import setup_logging
    from recipes.run.training import run_training
    from recipes.runtime.checkpoint import REQUEUE_EXIT_CODE
    from recipes.runtime.stop import StopRequest

    setup_logging()
    try:
        with StopRequest() as stop_requested:
            result = run_training(cfg, should_stop=stop_requested)
    except OrchError as err:
        typer.echo(error_line(err), err=True)
        raise typer.Exit(2) from None
    except OSError as err:
        line = fault_line(err)
        if line is None:
            raise
        typer.echo(error_line(line), err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("orch: interrupted (Ctrl-C twice): stopped at once, without a checkpoint of this step; the run "
                   "resumes from its last checkpoint", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"{result.status}: {result.reason} (steps done: {result.steps_done}, "
               f"MLflow run {result.mlflow_run_id})")
    raise typer.Exit({"finished": 0, "stopped": 0, "preempted": REQUEUE_EXIT_CODE, "failed": 1}[result.status])
