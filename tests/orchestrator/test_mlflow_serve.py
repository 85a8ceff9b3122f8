"""`orch mlflow serve`: loopback by default, --host/--port for a lab, a warning when it listens beyond loopback
without authentication, and MLflow's basic-auth app behind --auth (the server itself is not started: os.execv is
replaced by a recorder)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app


@pytest.fixture
def exec_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr("os.execv", lambda path, argv: calls.append(list(argv)))
    return calls


def test_loopback_by_default_without_warning(exec_calls: list[list[str]]) -> None:
    result = CliRunner().invoke(app, ["mlflow", "serve"])
    assert result.exit_code == 0, result.output
    command = exec_calls[0]
    assert command[command.index("--host") + 1] == "127.0.0.1" and "--app-name" not in command
    assert "warning" not in result.stderr


def test_listening_beyond_loopback_warns_unless_authenticated(exec_calls: list[list[str]]) -> None:
    result = CliRunner().invoke(app, ["mlflow", "serve", "--host", "0.0.0.0", "--port", "5050"])
    assert result.exit_code == 0, result.output
    assert "warning: MLflow will listen on 0.0.0.0:5050 without authentication" in result.stderr
    assert "--auth" in result.stderr
    command = exec_calls[0]
    assert command[command.index("--host") + 1] == "0.0.0.0" and command[command.index("--port") + 1] == "5050"

    result = CliRunner().invoke(app, ["mlflow", "serve", "--host", "0.0.0.0", "--auth"])
    assert result.exit_code == 0 and "warning" not in result.stderr
    assert exec_calls[1][exec_calls[1].index("--app-name") + 1] == "basic-auth"


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "70000"], "--port"),
    (["--host", "a b"], "--host 'a b'"),
    (["--workers", "0"], "--workers"),
])
def test_bad_options_are_one_line_and_start_nothing(exec_calls: list[list[str]], args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["mlflow", "serve", *args])
    assert result.exit_code == 2 and not exec_calls
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
