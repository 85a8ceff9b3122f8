# orch-deepcoder-harness
"""Runs inside the sandbox (standard library only; its source is passed to `python -c`, never imported by orch).

Reads one JSON object from stdin: {"code", "mode": "call"|"stdio", "fn_name", "inputs": [...], "cpu": s,
"wall": s, "memory": bytes, "output_bytes": n, "nproc": n, "own_pid_namespace": bool}. It compiles the code once, then runs each input in
its own forked child under CPU, address-space and file-size limits, kills its process group after each test
(and, in the sandbox's own pid namespace, every other process but this one), and prints one JSON line per test as soon as it ends:
{"i", "status": "ok"|"error"|"timeout"|"crash", "output" (stdio: stdout text; call: the return value as JSON),
"detail"}. The expected outputs never enter the sandbox: the caller compares.
"""

import contextlib
import io
import json
import os
import resource
import select
import signal
import sys

WORKDIR = os.getcwd()


def _kill_others():
    """SIGKILL every process of the sandbox's pid namespace except its init (1) and this harness."""
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(int(name), signal.SIGKILL)


def _child(job, compiled, test_input, out_path, result_path):
    status, output, detail = "ok", None, ""
    try:
        os.setpgid(0, 0)
        in_path = out_path + ".in"
        with open(in_path, "w") as stdin_file:
            stdin_file.write(test_input if job["mode"] == "stdio" else "")
        limits = ((resource.RLIMIT_CPU, job["cpu"]), (resource.RLIMIT_AS, job["memory"]),
                  (resource.RLIMIT_FSIZE, job["output_bytes"]), (resource.RLIMIT_CORE, 0))
        for kind, value in limits:
            resource.setrlimit(kind, (value, value))
        os.dup2(os.open(in_path, os.O_RDONLY), 0)
        os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
        os.dup2(os.open("/dev/null", os.O_WRONLY), 2)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False))
        namespace = {"__name__": "__main__" if job["mode"] == "stdio" else "solution"}
        exec(compiled, namespace)
        if job["mode"] == "call":
            function = namespace.get(job["fn_name"])
            if not callable(function) and isinstance(namespace.get("Solution"), type):
                function = getattr(namespace["Solution"](), job["fn_name"], None)
            if not callable(function):
                raise NameError(f"no function {job['fn_name']!r}")
            output = json.dumps(function(*test_input))
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            status, detail = "error", f"SystemExit({exit_.code!r})"
    except BaseException as err:  # the program's own failure, whatever it is
        status, detail = "error", f"{type(err).__name__}: {str(err)[:200]}"
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
    with open(result_path, "w") as result:
        json.dump({"status": status, "output": output, "detail": detail}, result)
    os._exit(0)


def _read(path, limit):
    try:
        with open(path, "rb") as file:
            return file.read(limit)
    except OSError:
        return b""


def _run_one(job, compiled, i, test_input):
    out_path, result_path = os.path.join(WORKDIR, f"test{i}.out"), os.path.join(WORKDIR, f"test{i}.json")
    try:
        return _judge(job, compiled, test_input, out_path, result_path)
    finally:
        for path in (out_path, out_path + ".in", result_path):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _judge(job, compiled, test_input, out_path, result_path):
    pid = os.fork()
    if pid == 0:
        _child(job, compiled, test_input, out_path, result_path)
    pidfd = os.pidfd_open(pid)
    finished = select.select([pidfd], [], [], job["wall"])[0]
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    if job["own_pid_namespace"]:
        _kill_others()
    _, wait_status = os.waitpid(pid, 0)
    os.close(pidfd)
    if not finished:
        return {"status": "timeout", "detail": f"over {job['wall']} s wall clock"}
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return {"status": "timeout", "detail": f"over {job['cpu']} s CPU ({signal.Signals(sig).name})"}
        return {"status": "crash", "detail": f"killed by {signal.Signals(sig).name}"}
    try:
        result = json.loads(_read(result_path, job["output_bytes"]) or b"null")
    except ValueError:
        result = None
    if not isinstance(result, dict):
        return {"status": "crash", "detail": "exited without a result"}
    if job["mode"] == "stdio" and result.get("status") == "ok":
        result["output"] = _read(out_path, job["output_bytes"]).decode("utf-8", "replace")
    return result


def main():
    job = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_NPROC, (job["nproc"], job["nproc"]))
    try:
        compiled = compile(job["code"], "<answer>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        print(json.dumps({"compile_error": f"{type(err).__name__}: {err}"[:300]}), flush=True)
        return
    for i, test_input in enumerate(job["inputs"]):
        result = _run_one(job, compiled, i, test_input)
        result["i"] = i
        print(json.dumps(result), flush=True)


main()
