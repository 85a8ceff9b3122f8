"""`orch env ...` commands: list, show, play and demos.

Only typer is imported at module level (the rule of `orchestrator/cli.py`); the environments are imported inside
the commands.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from orchlib.errors import error_line

app = typer.Typer(no_args_is_help=True)

TaskArg = Annotated[str, typer.Argument(help="Environment name (see `orch env list`).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Episode seed (same seed, same episode).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="Config override KEY=VALUE (repeatable); VALUE is read as JSON, else as text."
    ),
]


def _overrides(pairs: list[str] | None) -> dict[str, Any]:
    from orchlib.errors import OrchError

    config: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise OrchError(f"--set {pair!r}: expected KEY=VALUE")
        try:
            config[key] = json.loads(raw)
        except json.JSONDecodeError:
            config[key] = raw
    return config


def _run(command: Callable[[], None]) -> None:
    """Run `command`, turning OrchError into one line on stderr and exit code 2."""
    from orchlib.errors import OrchError

    try:
        command()
    except OrchError as err:
        typer.echo(error_line(err), err=True)
        raise typer.Exit(2) from None


def _print_messages(messages: list[dict[str, str]]) -> None:
    for message in messages:
        typer.echo(f"[{message['role']}]\n{message['content']}\n")


@app.command("list", short_help="List the environments and their action formats.")
def list_command() -> None:
    """List the registered environments with their action format and turn budget."""

    def command() -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        from envs.registry import env_class, env_config_class, list_envs

        table = Table("name", "task", "answer", "max turns", "actions/turn")
        for name in list_envs():
            cls, defaults = env_class(name), env_config_class(name)()
            summary = (cls.__doc__ or "").strip().split("\n")[0]
            table.add_row(  # escaped: `search[query]` is not rich markup
                name, escape(summary), escape(cls.answer_format), str(defaults.max_turns),
                str(defaults.max_actions_per_turn),
            )
        Console().print(table)

    _run(command)


@app.command("show", short_help="Print the first prompt of one episode.")
def show_command(
    task: TaskArg,
    seed: SeedOpt = 0,
    overrides: SetOpt = None,
    image: Annotated[
        Path | None, typer.Option("--image", help="Also write the state as PNG (grid tasks).")
    ] = None,
) -> None:
    """Print the system prompt and first user turn of one episode (optionally its image)."""

    def command() -> None:
        from envs.episode import Episode
        from envs.grid import GridEnv
        from envs.registry import env_class, list_envs, make_env
        from orchlib.errors import OrchError

        env = make_env(task, **_overrides(overrides))
        if image is not None and not isinstance(env, GridEnv):
            grid = [name for name in list_envs() if issubclass(env_class(name), GridEnv)]
            raise OrchError(f"--image: task {task!r} has no image; tasks with images: {', '.join(grid)}")
        episode = Episode(env, seed)
        _print_messages(episode.messages)
        if image is not None:
            typer.echo(f"image written to {env.save_png(image)}")

    _run(command)


@app.command("play", short_help="Play one episode in the terminal.")
def play_command(task: TaskArg, seed: SeedOpt = 0, overrides: SetOpt = None) -> None:
    """Play one episode in the terminal: type actions (e.g. `Up || Left`) or a full reply, one line per turn.
    Reads stdin, so a pipe works too; end of input stops the game."""

    def command() -> None:
        from envs.episode import Episode
        from envs.protocol import ANSWER_OPEN, FAILURES, format_response
        from envs.registry import make_env

        episode = Episode(make_env(task, **_overrides(overrides)), seed)
        _print_messages(episode.messages)
        while not episode.done:
            typer.echo("> ", nl=False)
            line = sys.stdin.readline()
            if not line:
                typer.echo("\n(end of input)")
                break
            line = line.strip()
            reply = line if ANSWER_OPEN in line else format_response("", [line])
            turn = episode.act(reply)
            failure = turn.info["failure"]
            status = f"invalid: {FAILURES[failure]}" if failure else "ok"
            typer.echo(f"actions {turn.actions} | reward {turn.reward:g} | {status}\n")
            if not episode.done:
                typer.echo(episode.messages[-1]["content"] + "\n")
        trajectory = episode.trajectory()
        typer.echo(
            f"episode over: return {trajectory.episode_return:g}, success {trajectory.success}, "
            f"turns {trajectory.num_turns}\nfinal state:\n{episode.env.render_text()}"
        )

    _run(command)


@app.command("demos", short_help="Print solver demonstrations as chat transcripts.")
def demos_command(
    task: TaskArg,
    n: Annotated[int, typer.Option("--n", min=1, help="Number of transcripts.")] = 3,
    seed: SeedOpt = 0,
    overrides: SetOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='One JSON object per line: {"messages": [...]}.')
    ] = False,
) -> None:
    """Print solver-based demonstration transcripts in the exact chat protocol."""

    def command() -> None:
        from envs.demos import demonstrations

        for index, messages in enumerate(demonstrations(task, n, seed, _overrides(overrides))):
            if as_json:
                typer.echo(json.dumps({"messages": messages}, ensure_ascii=False))
            else:
                typer.echo(f"=== demonstration {index + 1}/{n} ===")
                _print_messages(messages)

    _run(command)
