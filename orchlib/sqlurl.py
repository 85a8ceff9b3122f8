"""Database URLs opened read-only: what the commands that only read (`orch status`, `orch logs`, `orch runs`) use,
so that pointing one at the wrong file (an empty file, someone else's database) writes nothing in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from orchlib.errors import OrchError
from orchlib.signals import held_by_children

SQLITE_PREFIX = "sqlite:///"


def readonly_url(url: str, first_look: bool = False) -> str:
    """`url` with SQLite's read-only URI mode (`file:PATH?mode=ro`: SQLite creates no table and changes no journal
    mode, though reading a WAL-mode file creates its `-shm`/`-wal` files); any other URL unchanged (the caller
    makes its sessions read-only). `first_look`, for a file that may not be ours: immutable too (no lock, no file
    created), unless a `-wal` file beside it holds part of its content (then those files exist already)."""
    path = sqlite_path(url)
    if path is None or path == ":memory:":
        return url
    immutable = first_look and not _in_use(path)
    return f"{SQLITE_PREFIX}file:{quote(path)}?mode=ro{'&immutable=1' if immutable else ''}&uri=true"


def sqlite_path(url: str) -> str | None:
    """The file of an `sqlite:///PATH` URL, None for other URLs."""
    return url[len(SQLITE_PREFIX):] if url.startswith(SQLITE_PREFIX) else None


def sqlite_tables(path: Path, where: str) -> set[str]:
    """The tables of the SQLite file `path` (an empty set for a 0-byte file), read as a first look: read-only and,
    unless the file is in use (its `-wal` or `-shm` exists), immutable (no file created beside it, no
    journal-mode change). `OrchError` (prefixed by `where`) for a file that cannot be read or is not an SQLite
    database.

    The look, the file's header included, happens in a child process. SQLite's locks are POSIX locks, owned by the
    process: closing *any* descriptor of the database file in a process that holds SQLite connections to it drops
    their locks, and a process opening the file next then takes itself for its only user and rewinds the WAL
    under them, losing their committed writes (SQLite's documentation warns against it; it lost store writes here
    until the look moved out). A child process has locks of its own."""
    command = [sys.executable, "-I", "-c", _LOOK, str(path.resolve()), "1" if _in_use(path) else "0"]
    try:
        with held_by_children():  # a job's stop signal reaches the look too (SLURM signals every process of the job)
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with process:
            try:
                stdout, stderr = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
    except (OSError, subprocess.TimeoutExpired) as err:
        raise OrchError(f"{where}: cannot read {path} ({err})") from None
    if process.returncode != 0:
        fallback = f"the look at PATH ended with exit status {process.returncode}"
        reason = (stderr.strip().splitlines() or [fallback])[-1]
        raise OrchError(f"{where}: {reason.replace('PATH', str(path))}")
    return set(json.loads(stdout))


# The child's script: argv = path, whether the file is in use. Exit status 1 with one line on stderr on error.
_LOOK = """
import json, sqlite3, sys
from urllib.parse import quote
path, in_use = sys.argv[1], sys.argv[2] == "1"
try:
    with open(path, "rb") as handle:
        header = handle.read(16)
except OSError as err:
    sys.exit(f"cannot read PATH ({err.strerror})")
if not header:
    print("[]")
    sys.exit(0)
if header != b"SQLite format 3\\x00":
    sys.exit("PATH is not an SQLite database")
def tables(immutable):
    uri = f"file:{quote(path)}?mode=ro" + ("&immutable=1" if immutable else "")
    connection = sqlite3.connect(uri, uri=True, timeout=10)
    try:
        return [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    finally:
        connection.close()
try:
    found = tables(not in_use)
except sqlite3.DatabaseError as first:
    if in_use:
        sys.exit(f"cannot read PATH as an SQLite database ({first})")
    # An immutable look takes no lock: a writer creating the file at this moment (many processes opening a new
    # store at once) shows it half-written. Look again as an ordinary reader, which waits for that writer.
    try:
        found = tables(False)
    except sqlite3.Error as err:
        sys.exit(f"cannot read PATH as an SQLite database ({err})")
except sqlite3.Error as err:
    sys.exit(f"cannot read PATH as an SQLite database ({err})")
print(json.dumps(found))
"""


def _in_use(path: str | Path) -> bool:
    """Whether a WAL-mode database may be open: its `-wal` or `-shm` file exists. Then a first look must be an
    ordinary read-only connection (it shares the WAL index and the locks); `immutable=1` would bypass the locks
    that tell SQLite other connections exist, and a process opening the file next could reset the WAL index
    under them, losing their committed writes."""
    return Path(f"{path}-wal").exists() or Path(f"{path}-shm").exists()
