"""Executors `debug` and `local` end to end with the TEST-ONLY `orch-test` backend (state transitions,
idempotency, failure, cancel/resume, requeue on a time limit, lost jobs). The real torch backend is exercised in
test_sweep_e2e.py."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.engine import cancel, resume, submit_plan, wait
from orchestrator.executors.base import process_alive
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchestrator.store import Store
from tests.orchestrator.gate import Gate

SWEEP = """
    name: {name}
    backend: orch-test
    base: {{trainer: test, trainer.total_steps: {steps}}}
    grid:
      task: [sokoban, frozenlake]
    seeds: {seeds}
    cluster: {{signal_delay_s: {delay}, max_requeues: {requeues}}}
    resources: {{default: {{time_min: {time_min}}}}}
"""


@pytest.fixture
def make_sweep(sweep_file, test_backend):
    def make(name: str = "exec", steps: int = 4, seeds: str = "[1, 2]", delay: int = 30, time_min: int = 30,
             requeues: int = 5) -> Path:
        text = SWEEP.format(name=name, steps=steps, seeds=seeds, delay=delay, time_min=time_min, requeues=requeues)
        return sweep_file(text, f"{name}.yaml")

    return make


def submit(path: Path, executor: str, tracking: str, **kwargs):
    plan = build_plan(load_sweep(path, sets=kwargs.pop("sets", [])))
    store = Store.open()
    return plan, store, submit_plan(plan, store, executor, tracking_uri=tracking, **kwargs)


def runs_by_cell(tracking: str, sweep: str) -> dict[str, object]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name(sweep)
    runs = client.search_runs([experiment.experiment_id])
    return {run.data.tags["cell"]: run for run in runs if "cell" in run.data.tags}


def metric_values(tracking: str, run_id: str, key: str) -> list[float]:
    from mlflow.tracking import MlflowClient

    return [metric.value for metric in MlflowClient(tracking).get_metric_history(run_id, key)]


def wait_for(predicate, timeout: float = 120.0, step: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)


def held_at(sweep: str, step: int, cells: int = 2) -> bool:
    """Every one of the sweep's `cells` jobs has checkpointed `step` (and, behind a gate allowing `step`, waits)."""
    done = [path.read_text() for path in Path(f".orch/sweeps/{sweep}/checkpoints").glob("*/step.txt")]
    return len(done) == cells and all(text == str(step) for text in done)


def test_debug_executor_runs_in_process_and_a_rerun_submits_nothing(make_sweep, tracking: str) -> None:
    path = make_sweep()
    plan, store, report = submit(path, "debug", tracking)
    assert (report.cells, report.new, report.submitted) == (4, 4, 4)
    sweep = store.require_sweep("exec")
    assert store.counts(sweep.id) == {"finished": 4}
    runs = runs_by_cell(tracking, "exec")
    assert set(runs) == {cell.digest for cell in plan.cells}
    for cell in plan.cells:
        run = runs[cell.digest]
        assert run.info.status == "FINISHED"
        assert run.data.tags["sweep"] == "exec" and run.data.tags["seed"] == str(cell.seed)
        assert run.data.tags["task"] == cell.settings["task"]
        assert run.data.tags["mlflow.parentRunId"] == sweep.parent_run_id
    _, _, again = submit(path, "debug", tracking)
    assert (again.new, again.submitted, again.not_submitted) == (0, 0, {"finished": 4})


def test_an_orphaned_debug_attempt_is_marked_lost_so_wait_returns(make_sweep, tracking: str) -> None:
    """An attempt no process will ever end (its `orch` died before the job reported a pid) must not keep
    `orch sweep --wait` / `orch status` waiting forever."""
    _, store, _ = submit(make_sweep(name="orphan", seeds="[1]"), "debug", tracking)
    sweep = store.require_sweep("orphan")
    cell = store.cell_rows(sweep.id)[0]
    columns = ("position", "axis", "seed", "backend", "settings_json", "overrides_json", "varied_json",
               "resources_json")
    store.add_cells(sweep.id, [{**{key: getattr(cell, key) for key in columns}, "digest": "0" * 16}])
    (orphan,) = store.cell_rows(sweep.id, states=["pending"])  # a finished cell cannot be submitted again
    store.record_submissions("debug", [orphan.id])  # queued, no job id, never started
    assert store.counts(sweep.id) == {"finished": 2, "queued": 1}
    assert wait(store, "orphan", timeout_s=30) == {"finished": 2, "lost": 1}


def test_local_executor_gives_the_same_cells_and_results(make_sweep, tracking: str) -> None:
    plan, store, report = submit(make_sweep(name="loc"), "local", tracking)
    assert report.submitted == 4
    assert wait(store, "loc", poll_s=0.5, timeout_s=300) == {"finished": 4}
    runs = runs_by_cell(tracking, "loc")
    for cell in plan.cells:
        assert metric_values(tracking, runs[cell.digest].info.run_id, "test/step")[-1] == 4
    rows = store.cell_rows(store.require_sweep("loc").id)
    assert all(row.job_id and Path(store.attempts(row.id)[-1].stdout_path).exists() for row in rows)
    logs = CliRunner().invoke(app, ["logs", "loc", rows[0].digest[:8], "--stream", "err"])
    assert logs.exit_code == 0 and f"orch: cell {rows[0].digest} finished after step 4" in logs.output
    debug_plan = build_plan(load_sweep(make_sweep(name="loc")))
    assert [cell.digest for cell in debug_plan.cells] == [cell.digest for cell in plan.cells]


def test_a_test_backend_run_imports_neither_torch_nor_transformers(workdir: Path, tracking: str) -> None:
    """Most of the sweep engine's tests run jobs of the test backend: none pays for importing torch (about 2 s of CPU
    a process), which only the trainers that write model checkpoints need (`run_training`'s space check)."""
    import subprocess
    import sys

    code = f"""
import sys
from recipes.run.training import run_training
from recipes.config.schema import compose_train_config
result = run_training(compose_train_config(["backend=orch-test", "trainer=test", "trainer.total_steps=2",
                                            "mlflow.tracking_uri={tracking}", "trainer.checkpoint_dir=ck"]))
print(result.status, "torch" in sys.modules, "transformers" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["finished", "False", "False"], done.stdout


def test_failures_are_recorded_and_retried_only_on_request(make_sweep, tracking: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_sweep(name="fail")
    flag = path.parent / "bug"
    flag.touch()
    monkeypatch.setenv("ORCH_TEST_FAIL_SEED", "2")
    monkeypatch.setenv("ORCH_TEST_FAIL_FLAG", str(flag))
    _, store, _ = submit(path, "local", tracking)
    assert wait(store, "fail", poll_s=0.5, timeout_s=300) == {"finished": 2, "failed": 2}
    failed = store.cell_rows(store.require_sweep("fail").id, states=["failed"])
    assert all("failing seed 2 on purpose" in row.reason for row in failed)
    flag.unlink()  # the bug is fixed
    _, _, report = submit(path, "local", tracking)
    assert report.submitted == 0 and report.not_submitted == {"finished": 2, "failed": 2}
    _, _, report = submit(path, "local", tracking, retry_failed=True)
    assert report.submitted == 2
    assert wait(store, "fail", poll_s=0.5, timeout_s=300) == {"finished": 4}


def test_a_changed_sweep_adds_only_its_new_cells(make_sweep, tracking: str) -> None:
    _, store, _ = submit(make_sweep(name="grow", seeds="[1]"), "debug", tracking)
    _, _, report = submit(make_sweep(name="grow", seeds="[1, 2]"), "debug", tracking)
    assert (report.cells, report.new, report.submitted) == (4, 2, 2)
    assert store.counts(store.require_sweep("grow").id) == {"finished": 4}


@pytest.mark.slow
def test_cancel_then_resume_continues_the_same_mlflow_run(make_sweep, tracking: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(Path("gate.json"), allowed=3).install(monkeypatch)  # both cells stop before step 4
    _, store, _ = submit(make_sweep(name="stop", steps=30, seeds="[1]"), "local", tracking)
    wait_for(lambda: held_at("stop", 3))
    sweep = store.require_sweep("stop")
    jobs = [store.attempts(row.id)[-1].pid for row in store.cell_rows(sweep.id)]
    assert cancel(store, "stop") == 2
    assert wait(store, "stop", poll_s=0.5, timeout_s=120) == {"cancelled": 2}
    # `cancel` marks the cells at once; their jobs end on their own (checkpoint, then exit). Open the gate only
    # once they have: a job still alive would run step 4 first (the CI run of 9c96120 caught it).
    wait_for(lambda: not any(process_alive(pid, None) for pid in jobs))
    gate.open()
    report = resume(store, "stop")
    assert report.submitted == 2
    assert wait(store, "stop", poll_s=0.5, timeout_s=300) == {"finished": 2}
    runs = runs_by_cell(tracking, "stop")
    resumed = [metric_values(tracking, run.info.run_id, "test/resumed_from") for run in runs.values()]
    assert all(max(values) == 3 for values in resumed), resumed  # each cell stopped mid-way resumed its checkpoint
    assert all(metric_values(tracking, run.info.run_id, "test/step")[-1] == 30 for run in runs.values())


@pytest.mark.slow
def test_a_cell_resumed_while_its_cancelled_job_still_runs_waits_for_it(make_sweep, tracking: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One writer per checkpoint folder (`orchlib.lease`): `orch resume` right after `orch cancel` starts a new job
    while the old one may still be stopping (here: frozen with SIGSTOP). The new job waits, naming the old one's
    PID, and trains only once it has ended: no step runs twice, none is lost."""
    gate = Gate(Path("gate.json"), allowed=3).install(monkeypatch)
    path = make_sweep(name="overlap", steps=12, seeds="[1]")
    path.write_text(path.read_text().replace("[sokoban, frozenlake]", "[sokoban]"))  # 1 cell: 2 cores, old + new
    _, store, _ = submit(path, "local", tracking)
    wait_for(lambda: held_at("overlap", 3, cells=1))
    sweep = store.require_sweep("overlap")
    old = {row.id: store.attempts(row.id)[-1].pid for row in store.cell_rows(sweep.id)}
    for pid in old.values():
        os.kill(pid, signal.SIGSTOP)  # alive, but it cannot stop (nor release its folder) until thawed
    try:
        assert cancel(store, "overlap") == 1
        assert wait(store, "overlap", poll_s=0.5, timeout_s=120) == {"cancelled": 1}
        gate.open()
        assert resume(store, "overlap").submitted == 1

        def waiting() -> bool:
            logs = [store.attempts(cell)[-1].stderr_path for cell in old]
            return all(log and Path(log).exists() and f"in use by PID {old[cell]} on" in Path(log).read_text()
                       for cell, log in zip(old, logs, strict=True))

        wait_for(waiting)
        runs = runs_by_cell(tracking, "overlap")
        assert all(max(metric_values(tracking, run.info.run_id, "test/step")) == 3 for run in runs.values())
    finally:
        for pid in old.values():
            os.kill(pid, signal.SIGCONT)
    assert wait(store, "overlap", poll_s=0.5, timeout_s=300) == {"finished": 1}
    (cell,) = old
    assert [attempt.state for attempt in store.attempts(cell)] == ["cancelled", "finished"]
    for run in runs_by_cell(tracking, "overlap").values():
        assert sorted(metric_values(tracking, run.info.run_id, "test/step")) == list(range(1, 13))
        resumed = metric_values(tracking, run.info.run_id, "test/resumed_from")
        # The old job, thawed with the gate open, may finish step 4 before it sees its stop: the new one resumes
        # from whatever the old one checkpointed last, which is the last step the old one logged.
        assert max(resumed) == resumed.count(0) in (3, 4), resumed


@pytest.mark.slow
def test_local_time_limit_checkpoints_and_requeues(make_sweep, tracking: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit's local controller sends SIGUSR2 `signal_delay_s` before `time_min`: the job checkpoints, exits with
    the requeue code, and runs again into the same MLflow run."""
    monkeypatch.setenv("ORCH_TEST_STEP_S", "1.0")
    # 45 one-second steps cannot fit before the signal at 30 s (time limit 120 s, signal 90 s before it): at least
    # one requeue, whatever the machine's load. The job then has 90 s to checkpoint and exit before the controller
    # kills it at the limit (a few seconds idle; under a load average of 12 one job needed more than 30 s: it was
    # killed after recording its requeue, and the cell ended lost, see test_sweep_store.py).
    path = make_sweep(name="limit", steps=45, seeds="[1]", delay=90, time_min=2, requeues=10)
    _, store, _ = submit(path, "local", tracking)
    assert wait(store, "limit", poll_s=0.5, timeout_s=900) == {"finished": 2}
    sweep = store.require_sweep("limit")
    for row in store.cell_rows(sweep.id):
        assert row.requeues >= 1 and row.attempts >= 2
        assert [attempt.state for attempt in store.attempts(row.id)][-1] == "finished"
    for run in runs_by_cell(tracking, "limit").values():
        assert max(metric_values(tracking, run.info.run_id, "test/resumed_from")) > 0


@pytest.mark.slow
def test_a_job_killed_by_sigkill_is_lost_and_a_plain_resume_finishes_it(make_sweep, tracking: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_TEST_STEP_S", "0.3")
    gate = Gate(Path("gate.json"), allowed=2).install(monkeypatch)
    _, store, _ = submit(make_sweep(name="kill", steps=20, seeds="[1]"), "local", tracking)
    sweep = store.require_sweep("kill")
    wait_for(lambda: held_at("kill", 2))  # a step is checkpointed
    victim = store.cell_rows(sweep.id, states=["running"])[0]
    gate.allow("*", 3)
    os.kill(store.attempts(victim.id)[-1].pid, signal.SIGKILL)  # dies without a word (OOM kill), in step 3
    gate.open()
    wait(store, "kill", poll_s=0.5, timeout_s=300)
    (dead,) = store.cell_rows(sweep.id, digests=[victim.digest])
    assert dead.state == "lost", dead.reason
    assert "killed by SIGKILL" in dead.reason and "without reporting" in dead.reason
    report = resume(store, "kill")  # no --retry-failed: a killed cell is resumable as it is
    assert report.submitted == 1
    assert wait(store, "kill", poll_s=0.5, timeout_s=300) == {"finished": 2}
    run = runs_by_cell(tracking, "kill")[victim.digest]
    assert max(metric_values(tracking, run.info.run_id, "test/resumed_from")) > 0  # from its checkpoint
    assert sorted(metric_values(tracking, run.info.run_id, "test/step"))[-1] == 20  # no step lost


def _stall_sweep(make_sweep, name: str, action: str) -> Path:
    path = make_sweep(name=name, steps=400, seeds="[1]")
    text = path.read_text().replace("max_requeues: 5}", f"max_requeues: 5, stall: {{after_s: 10, action: {action}}}}}")
    path.write_text(text)
    return path


def _status_json(name: str) -> dict:
    import json

    result = CliRunner().invoke(app, ["status", name, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow
def test_running_cells_show_their_step_phase_success_and_heartbeat(make_sweep, tracking: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Live progress: each running cell's step k/N and phase (the trainer's progress file, copied by the job's
    heartbeat into the store), its last success rate and its heartbeat's age, in `orch status` (table and JSON)
    and `orch sweep --wait` (whole lines when not on a terminal)."""
    import orchestrator.engine

    gate = Gate(Path("gate.json"), allowed=2).install(monkeypatch)  # the cells hold after step 2 until opened
    path = make_sweep("live", steps=8, seeds="[1]")
    _, store, _ = submit(path, "local", tracking)
    sweep = store.require_sweep("live")

    def progressed() -> bool:
        rows = [row for row in store.status_rows(sweep.id) if row["state"] == "running" and row["progress"]]
        return len(rows) == 2 and all(row["progress"]["done"] >= 2 for row in rows)

    wait_for(progressed, timeout=120)
    real_wait = orchestrator.engine.wait

    def wait_then_open(*args, on_poll=None, **kwargs):  # `--wait` shows the held cells once, then they go on
        def poll(counts):
            on_poll(counts)
            gate.open()
        return real_wait(*args, on_poll=poll, **kwargs)

    monkeypatch.setattr(orchestrator.engine, "wait", wait_then_open)
    cells = _status_json("live")["cells"]
    for cell in cells:
        assert cell["progress"]["total"] == 8 and cell["progress"]["phase"] in ("update", "logging")
        assert 0 < cell["progress"]["success"] <= 1 and cell["heartbeat_at"] is not None
    table = CliRunner().invoke(app, ["status", "live"]).stdout
    assert "/8 " in table and "heartbeat" in table and "s ago" in table
    waited = CliRunner().invoke(app, ["sweep", str(path), "--cluster", "local", "--wait"])
    assert waited.exit_code == 0, waited.output
    lines = waited.output.splitlines()
    assert any("cell " in line and "step " in line and "/8 " in line and "heartbeat" in line for line in lines)
    assert lines[-1] == "sweep live: finished 2"


def test_a_hung_job_is_flagged_stalled_then_recovers(make_sweep, tracking: str) -> None:
    """A job frozen with SIGSTOP (heartbeats every second here) stops beating: `orch status` flags its cell after
    `cluster.stall.after_s`, and nothing more under the default `flag` action; once thawed it beats again."""
    _, store, _ = submit(_stall_sweep(make_sweep, "hang", "flag"), "local", tracking)
    sweep = store.require_sweep("hang")
    wait_for(lambda: store.counts(sweep.id).get("running", 0) == 2)
    victim = store.cell_rows(sweep.id)[0]
    pid = store.attempts(victim.id)[-1].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: any(cell["stalled"] for cell in _status_json("hang")["cells"]), timeout=60)
        cells = {cell["digest"]: cell for cell in _status_json("hang")["cells"]}
        assert cells[victim.digest]["stalled"] and cells[victim.digest]["state"] == "running"
        assert sum(cell["stalled"] for cell in cells.values()) == 1
        assert "stalled" in CliRunner().invoke(app, ["status", "hang"]).stdout
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not any(cell["stalled"] for cell in _status_json("hang")["cells"]), timeout=60)
    cancel(store, "hang")
    wait(store, "hang", poll_s=0.5, timeout_s=120)


@pytest.mark.slow
def test_a_hung_job_is_killed_and_failed_under_the_fail_rule(make_sweep, tracking: str) -> None:
    _, store, _ = submit(_stall_sweep(make_sweep, "hangfail", "fail"), "local", tracking)
    sweep = store.require_sweep("hangfail")
    wait_for(lambda: store.counts(sweep.id).get("running", 0) == 2)
    victim, other = store.cell_rows(sweep.id)
    pid = store.attempts(victim.id)[-1].pid
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: _status_json("hangfail")["counts"].get("failed") == 1, timeout=60)  # status reconciles
    (row,) = store.cell_rows(sweep.id, digests=[victim.digest])
    assert row.state == "failed" and "stalled: no heartbeat for" in row.reason and "its job was killed" in row.reason
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2])
    assert store.cell_rows(sweep.id, digests=[other.digest])[0].state == "running"  # the healthy cell runs on
    cancel(store, "hangfail")
    assert wait(store, "hangfail", poll_s=0.5, timeout_s=120) == {"failed": 1, "cancelled": 1}


@pytest.mark.slow
def test_sigterm_to_a_job_mid_step_checkpoints_requeues_and_loses_no_step(make_sweep, tracking: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM straight to the job process (a preemption, an admin's kill): it stops at the step boundary,
    checkpoints, reports requeued, and submitit's local controller starts it again from the checkpoint."""
    monkeypatch.setenv("ORCH_TEST_STEP_S", "0.3")
    gate = Gate(Path("gate.json"), allowed=2).install(monkeypatch)
    _, store, _ = submit(make_sweep(name="term", steps=20, seeds="[1]"), "local", tracking)
    sweep = store.require_sweep("term")
    wait_for(lambda: held_at("term", 2))
    victim = store.cell_rows(sweep.id, states=["running"])[0]
    gate.allow("*", 3)  # step 3 starts (0.3 s): the signal lands in it or at its boundary, never after the last
    os.kill(store.attempts(victim.id)[-1].pid, signal.SIGTERM)
    gate.open()
    assert wait(store, "term", poll_s=0.5, timeout_s=300) == {"finished": 2}
    (row,) = store.cell_rows(sweep.id, digests=[victim.digest])
    assert row.requeues == 1 and [a.state for a in store.attempts(row.id)] == ["requeued", "finished"]
    assert "checkpointed at step" in store.attempts(row.id)[0].reason
    run = runs_by_cell(tracking, "term")[victim.digest]
    assert max(metric_values(tracking, run.info.run_id, "test/resumed_from")) > 0
    assert sorted(set(metric_values(tracking, run.info.run_id, "test/step"))) == list(range(1, 21))


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _mlflow_server(folder: Path, port: int):
    import subprocess
    import sys
    import urllib.request

    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'served.db'}", "--artifacts-destination", str(folder / "art")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def up() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
        except OSError:
            return False

    wait_for(up, timeout=120, step=0.5)
    return process


class _Link:
    """A TCP link from `port` to the MLflow server's port: `cut()` drops it (open connections too), as a network
    partition would; `restore()` opens it again on the same port."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target, self.server, self.open = port, target, None, set()
        self.restore()

    def restore(self) -> None:
        import socket
        import socketserver
        import threading

        link = self

        class Pipe(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                upstream = socket.create_connection(("127.0.0.1", link.target))
                link.open.update({self.request, upstream})

                def pump(source, sink) -> None:
                    try:
                        while data := source.recv(65536):
                            sink.sendall(data)
                    except OSError:
                        pass
                    for end in (source, sink):
                        with contextlib.suppress(OSError):
                            end.shutdown(socket.SHUT_RDWR)

                back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
                back.start()
                pump(self.request, upstream)
                back.join()

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", self.port), Pipe)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def cut(self) -> None:
        import socket

        self.server.shutdown()
        self.server.server_close()
        for connection in list(self.open):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _served_mlflow(workdir: Path, monkeypatch: pytest.MonkeyPatch):
    """A real `mlflow server` behind a TCP link the test can cut (fast client retries: one, no backoff)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
    server_port, port = _free_port(), _free_port()
    server = _mlflow_server(workdir, server_port)
    link = _Link(port, server_port)
    try:
        yield link, f"http://127.0.0.1:{port}"
    finally:
        link.cut()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _every_step_once(tracking: str, sweep: str, steps: int) -> None:
    for run in runs_by_cell(tracking, sweep).values():
        assert sorted(metric_values(tracking, run.info.run_id, "test/step")) == list(range(1, steps + 1))


@pytest.mark.slow
def test_mlflow_unreachable_for_a_while_buffers_and_training_goes_on(make_sweep, workdir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracking server becomes unreachable mid-run (the link to it is cut) while the jobs train steps 3 to 6:
    they buffer those metrics and go on; once the link is back the buffer is written. One attempt per cell, every
    step logged exactly once."""
    gate = Gate(Path("gate.json"), allowed=2).install(monkeypatch)
    with _served_mlflow(workdir, monkeypatch) as (link, tracking):
        _, store, _ = submit(make_sweep(name="blip", steps=12, seeds="[1]"), "local", tracking)
        sweep = store.require_sweep("blip")
        wait_for(lambda: held_at("blip", 2))
        link.cut()
        gate.allow("*", 6)
        wait_for(lambda: held_at("blip", 6))  # trained on without the store
        link.restore()
        gate.open()
        assert wait(store, "blip", poll_s=0.5, timeout_s=300) == {"finished": 2}
        assert all(row.attempts == 1 for row in store.cell_rows(sweep.id))
        _every_step_once(tracking, "blip", 12)
        logs = "".join(Path(store.attempts(row.id)[-1].stderr_path).read_text() for row in store.cell_rows(sweep.id))
        assert "tracking store unreachable" in logs and "the buffered metrics are written" in logs


@pytest.mark.slow
def test_mlflow_unreachable_to_the_end_fails_resumably_and_a_retry_loses_no_step(make_sweep, workdir: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The store stays unreachable until the jobs end: each keeps its unwritten metrics beside its checkpoint and
    ends failed with one line saying so; once the link is back, `--retry-failed` writes them, and every step is
    there exactly once."""
    gate = Gate(Path("gate.json"), allowed=2).install(monkeypatch)
    with _served_mlflow(workdir, monkeypatch) as (link, tracking):
        _, store, _ = submit(make_sweep(name="nomlflow", steps=12, seeds="[1]"), "local", tracking)
        sweep = store.require_sweep("nomlflow")
        wait_for(lambda: held_at("nomlflow", 2))
        link.cut()
        gate.open()
        assert wait(store, "nomlflow", poll_s=0.5, timeout_s=300) == {"failed": 2}
        for row in store.cell_rows(sweep.id):
            assert row.reason.startswith("tracking store unreachable (") and "\n" not in row.reason, row.reason
            assert "stopped after step 12" in row.reason and "pending_metrics.jsonl" in row.reason, row.reason
        link.restore()
        assert resume(store, "nomlflow", retry_failed=True).submitted == 2
        assert wait(store, "nomlflow", poll_s=0.5, timeout_s=300) == {"finished": 2}
        _every_step_once(tracking, "nomlflow", 12)
        assert not list(Path(".orch/sweeps/nomlflow/checkpoints").glob("*/pending_metrics.jsonl"))


def test_each_executor_is_found_by_the_name_it_carries() -> None:
    """The registry names each executor class as `module:Class` (the class never imports the registry); the name
    a class carries, which its jobs report back to the store, is the name it is looked up by."""
    from orchestrator.executors import executor_names, get_executor
    from orchestrator.executors.local import LocalExecutor

    assert executor_names() == ["debug", "local", "slurm"]
    assert [get_executor(name).name for name in executor_names()] == executor_names()
    assert get_executor("local") is LocalExecutor and LocalExecutor.name == "local"
