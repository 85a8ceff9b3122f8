"""`orch` itself as a new user meets it: `--version`, one-line usage errors with one prefix, and `orch --help`
listing every command with a whole one-sentence summary."""

from __future__ import annotations

from importlib.metadata import version

import click
import pytest
import typer.main
from typer.testing import CliRunner

from orchestrator.cli import app

ROOT = typer.main.get_command(app)


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"orch {version('orch')}\n", result.output


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--bogus"], "orch: error: No such option '--bogus' (see orch --help)"),
        (["sweep", "--bogus"], "orch: error: sweep: No such option '--bogus' (see orch sweep --help)"),
        (["env", "play", "--bogus"], "orch: error: env play: No such option '--bogus' (see orch env play --help)"),
        (["sweep"], "orch: error: sweep: Missing argument 'FILE' (see orch sweep --help)"),
        # a typo gets one suggestion, once (click and Typer each added theirs: two, or the same one twice)
        (["statsu"], "orch: error: No such command 'statsu'; did you mean 'status'? (see orch --help)"),
        (["cach"], "orch: error: No such command 'cach'; did you mean 'cache'? (see orch --help)"),
        (["nothing-near"], "orch: error: No such command 'nothing-near' (see orch --help)"),
        (["env", "plya"], "orch: error: env: No such command 'plya'; did you mean 'play'? (see orch env --help)"),
        (["sweep", "x.yaml", "--dryrun"],
         "orch: error: sweep: No such option '--dryrun'; did you mean '--dry-run'? (see orch sweep --help)"),
        (["--verison"], "orch: error: No such option '--verison'; did you mean '--version'? (see orch --help)"),
    ],
)
def test_usage_error_is_one_line_with_one_prefix(argv: list[str], line: str) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and result.stderr.splitlines() == [line], result.stderr


def _groups(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Group]]:
    found = [(path, group)]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _groups(command, (*path, name))
    return found


GROUPS = _groups(ROOT)


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=[" ".join(("orch", *path)) for path, _ in GROUPS])
def test_help_lists_every_command_with_its_whole_summary(path: tuple[str, ...], group: click.Group) -> None:
    """Each command declares a one-sentence `short_help` that fits the help's line; click would otherwise cut the
    docstring's first sentence at its width or at an abbreviation's period ("type actions (e.g.")."""
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    listed = result.stdout.split("\nCommands:\n", 1)[1].splitlines()
    assert len(listed) == len(group.commands), result.stdout
    for name, command in group.commands.items():
        summary = command.short_help
        assert summary and summary.endswith(".") and summary.count(". ") == 0, (name, summary)
        row = next(line for line in listed if line.split()[0] == name)
        assert row.split(None, 1)[1] == summary, row  # shown whole, on one line
    assert not any(line.endswith("...") for line in listed), result.stdout
