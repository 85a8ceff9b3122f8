"""The Ray cluster of one veRL run: a private local one, or one spanning the nodes of a multi-node SLURM cell.

    with ray_cluster(cfg, plan) as address:      # ray.init() done; torn down on exit, whatever happened
        ...

* One node (a laptop, or a cell with `nodes: 1`): `ray.init(address="local")` starts a cluster of its own, never
  attaching to another one running on the machine, with its own temp folder and free ports, so several cells
  sharing a node never collide. On cpu it declares logical GPUs (veRL schedules every worker on a "GPU" bundle).
* SLURM signals every process of a job step (SIGUSR2 before the time limit, SIGTERM on preemption or `scancel`), Ray's
  included, and Ray's processes die of them: a local cluster's processes start with the stop signals blocked
  (`orchlib.signals.held_by_children` around `ray.init`), the `ray start` processes of a multi-node cell with them
  ignored (set in the child alone, by `_IGNORING` before it execs `ray`: a blocked SIGTERM would also block the one
  `ray start --block` tears its node down on; the mask and the dispositions survive `exec`), so that only the job's
  own process reacts -- by asking the trainer to checkpoint and stop. The job's process keeps its handlers
  throughout: through `ray.init` (which installs a SIGTERM handler of its own: `_init_keeping_handlers`), and while a
  multi-node cell's head starts and its nodes join, waits that poll the run's stop (`should_stop`) and end with
  `StopRequested` (before, the driver itself ignored the signals while the head started, for up to `HEAD_START_S`, so
  a stop then was lost, and the join was not polled).
* Several nodes (a SLURM allocation with `SLURM_JOB_NUM_NODES > 1`): `ray start --head --block` on the first node
  of the allocation, `srun ... ray start --address=<head> --block` on the others (one task per node), then wait
  until every node and every GPU has joined (`verl.ray_join_timeout_s`; the error names the nodes missing), and
  tear both down by ending those two processes (`--block` stops Ray's processes with them). The nodes use the
  Ray authentication this process uses: none by default; with `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN` in the
  job's environment (e.g. a sweep's `cluster.setup` lines) every node gets the token.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError
from orchlib.signals import held_by_children

AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@dataclass(frozen=True)
class ClusterPlan:
    """The Ray cluster a run needs.

    nodes: hostnames, the head first (one entry: a local cluster).
    gpus_per_node: GPUs each node contributes.
    logical_gpus: declare `gpus_per_node` logical GPUs (a cpu run: veRL schedules workers on "GPU" bundles).
    cpus: logical CPUs of a local cluster (None: Ray counts them).
    env: environment variables of every Ray process (the plug-in, threads).
    join_timeout_s: how long a multi-node cluster may take to assemble.
    launcher: the command that starts one process on each worker node (srun inside a SLURM allocation; tests
        start the "worker nodes" on this machine with an empty launcher).
    """

    nodes: tuple[str, ...]
    gpus_per_node: int
    logical_gpus: bool = False
    cpus: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    join_timeout_s: float = 300.0
    launcher: tuple[str, ...] = ()


def slurm_nodes() -> tuple[str, ...]:
    """The hostnames of the SLURM allocation this process runs in (this host alone outside one)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist or int(os.environ.get("SLURM_JOB_NUM_NODES", "1")) <= 1:
        return (socket.gethostname(),)
    names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return tuple(names.stdout.split())


def srun_launcher(workers: int, head: str) -> tuple[str, ...]:
    """srun starting one task on each of the allocation's other `workers` nodes."""
    return ("srun", f"--nodes={workers}", f"--ntasks={workers}", "--ntasks-per-node=1", f"--exclude={head}",
            "--overlap", "--kill-on-bad-exit=1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@contextmanager
def ray_cluster(plan: ClusterPlan, should_stop: Callable[[], bool] | None = None) -> Iterator[str]:
    """Start the cluster, `ray.init` into it, yield its address; shut everything down on exit. A multi-node start
    (the head's, then the nodes' join) polls `should_stop` and ends with `StopRequested` once it is true."""
    import ray

    scratch = Path(tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp"))  # short: Ray's socket paths are length-limited
    processes: list[subprocess.Popen] = []
    try:
        if len(plan.nodes) == 1:
            if plan.logical_gpus and os.environ.get("CUDA_VISIBLE_DEVICES") == "":
                # on cpu the "GPUs" are logical; submitit's local executor sets CUDA_VISIBLE_DEVICES="" for a job
                # without GPUs, and Ray then refuses to start a raylet with num_gpus=1 ("contains []")
                os.environ.pop("CUDA_VISIBLE_DEVICES")
            # Ray's processes start with the stop signals blocked (the mask survives `exec`: they never act on
            # them), while this process keeps its handlers: a signal meanwhile is delivered once the start is over
            # (or to another of its threads at once), never lost -- with the signals ignored instead, a SIGINT or
            # SIGUSR2 during the start was dropped and the run trained on (benchmarks/bench_stop.py).
            with held_by_children():
                _init_keeping_handlers(
                    address="local", num_cpus=plan.cpus,
                    num_gpus=plan.gpus_per_node if plan.logical_gpus else None, include_dashboard=False,
                    _temp_dir=str(scratch), runtime_env={"env_vars": plan.env}, log_to_driver=True)
            yield ray.get_runtime_context().gcs_address
            return
        auth = {name: os.environ[name] for name in AUTH_VARIABLES if name in os.environ}
        auth.setdefault("RAY_AUTH_MODE", "disabled")  # as this process connects (Ray reads it once, at import)
        address = _start_multi_node(plan, scratch, processes, auth, should_stop)
        _stop_point(should_stop, "the Ray head started")
        _init_keeping_handlers(address=address, runtime_env={"env_vars": plan.env}, log_to_driver=True)
        _wait_for_nodes(plan, should_stop)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for process in reversed(processes):
            _end(process)
        shutil.rmtree(scratch, ignore_errors=True)


def _init_keeping_handlers(**options: Any) -> None:
    """`ray.init(**options)` with the job's stop handlers kept. `ray.init` installs its own SIGTERM handler
    (`sys.exit(15)`, ray/_private/worker.py: "terminate any signal before connecting driver") and leaves it there: a
    preemption's SIGTERM during or after the start then ended the job with exit 15, no checkpoint and no line (seen
    in `benchmarks/bench_stop.py --backend verl --phases setup`; on a multi-node cell for the whole run). The
    handlers in place before come back once it returns; a SIGTERM that Ray's handler caught meanwhile is handed to
    them (the stop is recorded, not lost) and the start ends with `StopRequested`: nothing of the attempt to keep."""
    import ray

    from recipes.runtime.stop import StopRequested

    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(**options)
    except SystemExit as ended:  # Ray's handler: a SIGTERM while Ray started
        if not main or ended.code != signal.SIGTERM:
            raise
        if callable(previous):
            previous(signal.SIGTERM, None)
        raise StopRequested("stop requested while Ray started; nothing to keep") from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _stop_point(should_stop: Callable[[], bool] | None, where: str) -> None:
    """`StopRequested` when the run's stop was asked for (a signal the job's handlers recorded) by now."""
    if should_stop is not None and should_stop():
        from recipes.runtime.stop import StopRequested

        raise StopRequested(f"stop requested while {where}; nothing to keep")


# Run as `python -c _IGNORING COMMAND...`: the stop signals ignored and unblocked in this child alone, then `exec`
# COMMAND (argv, no shell). Started inside `held_by_children`, so the parent's handlers never lapse.
_IGNORING = ("import os, signal, sys\n"
             "numbers = [int(n) for n in sys.argv[1].split(',')]\n"
             "for number in numbers:\n"
             "    signal.signal(number, signal.SIG_IGN)\n"
             "signal.pthread_sigmask(signal.SIG_UNBLOCK, numbers)\n"
             "os.execvp(sys.argv[2], sys.argv[2:])\n")


def _start_ignoring(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`command` started with the stop signals ignored in it (module docstring), this process's handlers kept."""
    from orchlib.signals import STOP_SIGNALS

    python = os.path.realpath("/proc/self/exe") if os.path.exists("/proc/self/exe") else sys.executable
    numbers = ",".join(str(int(number)) for number in STOP_SIGNALS)
    with held_by_children():  # around the start only: a signal meanwhile reaches this process's handlers after it
        return subprocess.Popen([python, "-c", _IGNORING, numbers, *command], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)


HEAD_START_S = 120.0  # the longest `ray start --head` may take to answer on its port


def _start_multi_node(plan: ClusterPlan, scratch: Path, processes: list[subprocess.Popen],
                      auth: dict[str, str], should_stop: Callable[[], bool] | None = None) -> str:
    """`ray start --head` here and `ray start --address` on the other nodes (through `plan.launcher`), each started
    with the stop signals ignored (`_start_ignoring`; only this process acts on them, and keeps its handlers); waits
    for the head's port, polling `should_stop`. Returns the head's address."""
    head = plan.nodes[0]
    port = free_port()
    ip = socket.gethostbyname(head)
    ray = str(Path(sys.executable).with_name("ray"))
    common = ["--block", f"--num-gpus={plan.gpus_per_node}", "--disable-usage-stats"]
    env = {**os.environ, **plan.env, **auth}
    head_command = [ray, "start", "--head", f"--node-ip-address={ip}", f"--port={port}", "--include-dashboard=false",
                    f"--temp-dir={scratch}", *common]
    started = _start_ignoring(head_command, env)
    processes.append(started)
    # the head's own start-up is not the cluster's assembly: it gets HEAD_START_S even under a short join timeout
    # (a loaded machine took more than 5 s to start it), and a head that exits fails at once, with its last words
    _wait_until(lambda: _answers(ip, port) or started.poll() is not None, max(plan.join_timeout_s, HEAD_START_S),
                f"the Ray head on {head}:{port} did not start", should_stop, "the Ray head started")
    if started.poll() is not None:
        said = (started.stderr.read() or b"").decode(errors="replace").strip().splitlines() if started.stderr else []
        raise OrchError(f"the Ray head on {head}:{port} exited with code {started.returncode}"
                        + (f": {said[-1]}" if said else ""))
    worker_command = [*plan.launcher, ray, "start", f"--address={ip}:{port}", *common]
    processes.append(_start_ignoring(worker_command, env))
    return f"{ip}:{port}"


def _wait_for_nodes(plan: ClusterPlan, should_stop: Callable[[], bool] | None = None) -> None:
    """Until every node is alive with its GPUs; OrchError naming the nodes missing after the timeout;
    `StopRequested` once `should_stop` says so."""
    import ray

    expected = len(plan.nodes)

    def joined() -> bool:
        alive = [node for node in ray.nodes() if node["Alive"]]
        return len(alive) >= expected and ray.cluster_resources().get("GPU", 0) >= expected * plan.gpus_per_node

    try:
        _wait_until(joined, plan.join_timeout_s, "", should_stop, "the Ray nodes joined")
    except OrchError:
        alive = {node["NodeManagerHostname"] for node in ray.nodes() if node["Alive"]}
        missing = [name for name in plan.nodes if name not in alive] or ["(the GPUs of the joined nodes)"]
        raise OrchError(
            f"Ray cluster: {len(alive)} of {expected} nodes joined within {plan.join_timeout_s:.0f} s "
            f"(verl.ray_join_timeout_s); missing: {', '.join(missing)}; GPUs seen: "
            f"{ray.cluster_resources().get('GPU', 0):g} of {expected * plan.gpus_per_node}") from None


def _answers(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def _wait_until(condition, timeout_s: float, message: str,  # noqa: ANN001
                should_stop: Callable[[], bool] | None = None, where: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        _stop_point(should_stop, where)
        if time.monotonic() > deadline:
            raise OrchError(message or "timed out")
        time.sleep(0.5)


def _end(process: subprocess.Popen) -> None:
    """SIGTERM (a blocking `ray start` then stops its node's Ray processes), SIGKILL if it lingers. A `ray start`
    that still ignores SIGTERM (the `_start_ignoring` disposition: Ray has not installed its teardown handler yet, it
    is still starting its node) is killed at once with what it started: a stop in the first moments of a head's start
    took 30 s to honour, waiting on a SIGTERM it could not act on (tests/recipes/verl/test_verl_parts.py)."""
    if process.poll() is not None:
        return
    if _ignores_sigterm(process.pid):
        _kill_tree(process)
        return
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _kill_tree(process)


def _ignores_sigterm(pid: int) -> bool:
    """Whether process `pid` has SIGTERM ignored (its /proc status's SigIgn mask); False when it cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split(":", 1)[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL `process` and every process it started (a half-started node's GCS server and raylet)."""
    import psutil

    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        children = []
    process.kill()
    for child in children:
        with suppress(psutil.Error):
            child.kill()
    process.wait()
    psutil.wait_procs(children, timeout=10)
