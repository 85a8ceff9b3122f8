"""Commands that only read (`orch status`, `orch logs`, `orch runs`) open databases read-only: pointed at an empty
file, a file that is no database, or someone else's SQLite database, they exit 2 with one line naming the file and
leave it (and its folder) byte for byte as it was: no schema, no WAL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def _foreign(path: Path, wal: bool = False) -> None:
    with sqlite3.connect(path) as connection:
        if wal:  # a WAL-mode file: even SQLite's read-only mode would create its -shm and -wal files beside it
            connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        connection.execute("INSERT INTO invoices (total) VALUES (12.5)")
    connection.close()


KINDS = {
    "empty": lambda path: path.write_bytes(b""),
    "text": lambda path: path.write_text("not a database\n" * 20),
    "foreign": _foreign,
    "foreign-wal": lambda path: _foreign(path, wal=True),
}
COMMANDS = {
    "status": (lambda url: ["status", "--store", url], "not an orch store"),
    "status-sweep": (lambda url: ["status", "s", "--store", url], "not an orch store"),
    "logs": (lambda url: ["logs", "s", "abc", "--store", url], "not an orch store"),
    "runs": (lambda url: ["runs", "--tracking-uri", url], "not an MLflow tracking database"),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", COMMANDS)
def test_reading_a_file_that_is_not_a_store_writes_nothing(tmp_path: Path, kind: str, command: str) -> None:
    path = tmp_path / "data.db"
    KINDS[kind](path)
    before = _snapshot(tmp_path)
    argv, expected = COMMANDS[command]
    result = CliRunner().invoke(app, argv(f"sqlite:///{path}"))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orch: error: ") and str(path) in lines[0], result.stderr
    if kind != "text":  # a file SQLite cannot read is reported as such
        assert expected in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert _snapshot(tmp_path) == before  # no schema, no -wal/-shm, no change


def test_status_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["status", "--store", f"sqlite:///{tmp_path / 'sub' / 'orch.db'}"])
    assert result.exit_code == 2 and "no orch store here" in result.stderr
    assert list(tmp_path.iterdir()) == []
