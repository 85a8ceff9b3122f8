"""Running untrusted code: one bubblewrap sandbox per submission, one forked child per test inside it.

The sandbox (`bwrap`) has its own user, pid, network, IPC, UTS and cgroup namespaces (so no network, not even
loopback, and no other process in sight), sees only read-only system directories (`/usr`, `/bin`, `/lib*`) and the
interpreter's own prefix, gets an empty size-limited tmpfs as its working directory, and dies with orch. When
orch runs as root the sandbox runs as `nobody` (the kernel ignores RLIMIT_NPROC for root, so a fork bomb would
not stop). Inside, `harness.py` runs each test in a child with CPU-time, address-space, file-size and process
limits and a wall-clock timeout; one test's crash or timeout does not lose the others' results.

`sandbox: none` runs the harness directly, with the same limits but no isolation: the code runs with your rights.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError

SANDBOXES = ("bwrap", "none")
NOBODY = 65534
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
STARTUP_SECONDS = 10.0  # allowance for starting bwrap and the interpreter, on top of the per-test budgets
CACHE_SIZE = 4096
ADVICE = ("install bubblewrap (Debian: apt-get install bubblewrap), or set sandbox: none to run generated code "
          "without isolation (dangerous: it runs with your rights)")


@dataclass(frozen=True)
class Limits:
    """Per-test limits (the whole submission gets their sum plus `STARTUP_SECONDS`)."""

    cpu_seconds: int = 2
    wall_seconds: float = 4.0
    memory_mb: int = 512
    output_kb: int = 1024
    processes: int = 16


@dataclass(frozen=True)
class TestRun:
    """One test's run: status ok | error | timeout | crash | missing (no report: the sandbox itself failed);
    `output` is the stdout text (stdio) or the return value as JSON text (call)."""

    status: str
    output: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Execution:
    compile_error: str | None
    runs: tuple[TestRun, ...]


@cache
def harness_source() -> str:
    return Path(__file__).with_name("harness.py").read_text(encoding="utf-8")


def _as_nobody() -> dict[str, Any]:
    """Popen arguments that drop root to nobody (the sandbox never runs as root)."""
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}


def _bwrap_command(bwrap: str, python: str, tmp_bytes: int) -> list[str]:
    command = [bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
    for top in SYSTEM_DIRS:
        if os.path.islink(top):
            command += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            command += ["--ro-bind", top, top]
    prefix = str(Path(python).resolve().parent.parent)
    if not any(prefix == top or prefix.startswith(top + "/") for top in SYSTEM_DIRS):
        command += ["--ro-bind", prefix, prefix]
    command += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp",
                "--remount-ro", "/", "--chdir", "/tmp", "--", python]
    return command


@dataclass(frozen=True)
class Sandbox:
    """How submissions run: `kind` bwrap (the executable `bwrap`) or none, with the interpreter `python`."""

    kind: str
    python: str
    bwrap: str = ""

    def run(self, code: str, mode: str, fn_name: str | None, inputs: list[Any], limits: Limits) -> Execution:
        """Run `code` on every input; never raises for anything the code does."""
        job = {"code": code, "mode": mode, "fn_name": fn_name, "inputs": inputs, "cpu": limits.cpu_seconds,
               "wall": limits.wall_seconds, "memory": limits.memory_mb << 20, "output_bytes": limits.output_kb << 10,
               "nproc": limits.processes, "own_pid_namespace": self.kind == "bwrap"}
        payload = json.dumps(job)
        budget = STARTUP_SECONDS + len(inputs) * (limits.wall_seconds + 0.5)
        interpreter = [self.python, "-I", "-S", "-c", harness_source()]
        environment = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        if self.kind == "bwrap":
            tmp_bytes = 4 * (limits.output_kb << 10) + 2 * len(payload)  # one test's files at a time
            command = _bwrap_command(self.bwrap, self.python, tmp_bytes)[:-1] + interpreter
            stdout = _communicate(command, payload, budget, env=environment, **_as_nobody())
        else:
            with tempfile.TemporaryDirectory(prefix="orch-deepcoder-") as workdir:
                stdout = _communicate(interpreter, payload, budget, env=environment, cwd=workdir)
        return _parse(stdout, len(inputs))


def _communicate(command: list[str], payload: str, budget: float, **popen: Any) -> str:
    """Run `command` in its own session, feed it `payload`, and return its stdout so far when it ends or after
    `budget` seconds (then its whole process group is killed)."""
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, **popen)
    try:
        stdout, _ = process.communicate(payload, timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, _ = process.communicate()
    return stdout


def _parse(stdout: str, count: int) -> Execution:
    runs: dict[int, TestRun] = {}
    for line in stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "compile_error" in record:
            return Execution(str(record["compile_error"]), ())
        i = record.get("i")
        if isinstance(i, int) and 0 <= i < count:
            output = record.get("output")
            runs[i] = TestRun(str(record.get("status")), output if isinstance(output, str) else None,
                              str(record.get("detail", "")))
    return Execution(None, tuple(runs.get(i, TestRun("missing")) for i in range(count)))


@lru_cache(maxsize=8)
def open_sandbox(kind: str, python: str | None = None) -> Sandbox:
    """The sandbox of `kind`, checked once by running a probe in it: OrchError (one line) if bwrap is missing or
    cannot isolate code here. `python` defaults to orch's own interpreter, else the system's /usr/bin/python3
    (when orch runs as root the sandbox runs as nobody, who may not read orch's interpreter)."""
    if kind not in SANDBOXES:
        raise OrchError(f"deepcoder: unknown sandbox {kind!r}; valid choices: {', '.join(SANDBOXES)}")
    bwrap = shutil.which("bwrap") or ""
    if kind == "bwrap" and not bwrap:
        raise OrchError(f"deepcoder: refusing to run generated code: no bwrap on PATH; {ADVICE}")
    candidates = [python] if python else list(dict.fromkeys([os.path.realpath(sys.executable), "/usr/bin/python3"]))
    problem = "no interpreter"
    for candidate in candidates:
        sandbox = Sandbox(kind, candidate, bwrap)
        try:
            probe = sandbox.run("def probe():\n    return 1\n", "call", "probe", [[]], Limits())
        except OSError as err:
            problem = f"{candidate}: {err}"
            continue
        if probe.runs and probe.runs[0] == TestRun("ok", "1"):
            return sandbox
        problem = f"{candidate}: probe failed ({_probe_stderr(sandbox)})"
    raise OrchError(f"deepcoder: refusing to run generated code: {kind} cannot isolate code here ({problem}); "
                    f"{ADVICE}")


def _probe_stderr(sandbox: Sandbox) -> str:
    """The first line bwrap (or the interpreter) wrote to stderr for a trivial command, for the refusal message."""
    command = [sandbox.python, "-I", "-S", "-c", "pass"]
    if sandbox.kind == "bwrap":
        command = _bwrap_command(sandbox.bwrap, sandbox.python, 1 << 20)[:-1] + command
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=STARTUP_SECONDS,
                              **_as_nobody() if sandbox.kind == "bwrap" else {})
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]


class ExecutionCache:
    """Least-recently-used results by submission (code, tests, limits, sandbox): a repeated answer (demonstrations,
    identical samples of one prompt) is not run again."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self.entries: OrderedDict[str, Execution] = OrderedDict()

    def run(self, sandbox: Sandbox, code: str, mode: str, fn_name: str | None, inputs: list[Any],
            limits: Limits) -> Execution:
        key = json.dumps([sandbox.kind, sandbox.python, code, mode, fn_name, inputs, limits.__dict__])
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key]
        execution = sandbox.run(code, mode, fn_name, inputs, limits)
        self.entries[key] = execution
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return execution


EXECUTIONS = ExecutionCache()
