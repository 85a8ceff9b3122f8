"""Seconds from a stop signal to the exit of `orch train`, per phase of a run, and whether the resume then logs every
step exactly once (docs/reliability.md, "Ctrl-C").

For each phase: start `orch train` (the tiny model, FrozenLake, the demo's step shape of 8 prompts x 4 samples, MI
diagnostics and validation at every step, 3 steps) in a scratch folder, read its progress file every 20 ms, and
when step 2 is in the phase send the signal; time the exit; then run the same command again (the resume) and check
that it finishes with steps 1-3 each logged once. `warm start` instead starts with an empty warm-start cache and
signals 10 s into the warm start (no resume: the warm start's own resume is tested in
`tests/recipes/torch_trainer/test_warmstart.py`).

    python benchmarks/bench_stop.py [--signal TERM] [--phases setup rollout diagnostics scoring update validation between "warm start"]
    python benchmarks/bench_stop.py --backend verl [--phases setup "warm start" rollout diagnostics update validation between]
    python benchmarks/bench_stop.py --entry job [--backend verl] [--phases rollout]   # a sweep cell's job (local executor)
    python benchmarks/bench_stop.py --entry commands [--signal TERM INT USR2]        # eval, export, tune, preflight, sweep --wait

`--entry job` runs the same run as a one-cell sweep on the local executor and signals the job's process (as
`orch cancel`, a preemption or SLURM's warning does): the seconds until the job's process is gone, the attempt's
state and reason, and whether the cell, restarted by submitit's controller, then logs every step once.
`--entry commands` signals the commands that train nothing, each at a moment it is busy: `orch eval` of a torch run
(256 episodes) and of a veRL checkpoint (veRL's model merger, then the episodes), `orch export` of both (veRL's: its
merger), `orch tune --wait` (a study of two trials on the local executor), `orch sweep --preflight` of
sweeps/table4.yaml and `orch sweep --wait`; it reports what each left behind (processes of its session still alive,
a scratch folder, an MLflow run left RUNNING).

`--backend verl` runs veRL's own trainer on this CPU (Ray, FSDP2, HF rollouts) with the same run; its trainer reports
the phases rollout, diagnostics, update, validation (no separate scoring phase; no warm-start phase: the warm start
runs before veRL starts, as on the torch backend).

The warm start of the other phases comes from `$ORCH_CACHE_DIR` (trained once if missing). Timings are wall
seconds on this machine; under other load they are upper bounds. `--signal` takes several signals: each phase is
measured under each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ["setup", "rollout", "diagnostics", "scoring", "update", "validation", "between", "warm start"]
OVERRIDES = ["model=tiny", "task=frozenlake", "trainer=cpu", "trainer.total_steps=3", "trainer.samples_per_prompt=4",
             "trainer.val_every=1", "trainer.save_every=0", "trainer.threads=1", "trainer.progress=false",
             "hooks=[collapse]", "diagnostics.mi_every=1", "diagnostics.num_samples=32"]


VERL_PHASES = ["setup", "warm start", "rollout", "diagnostics", "update", "validation", "between"]
BACKEND: list[str] = []  # ["backend=verl"] with --backend verl


def command(folder: Path) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", "train", *OVERRIDES, *BACKEND,
            f"mlflow.tracking_uri=sqlite:///{folder / 'mlflow.db'}", f"trainer.checkpoint_dir={folder / 'ck'}"]


def progress(folder: Path) -> dict:
    try:
        return json.loads((folder / "ck" / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def reached(state: dict, phase: str) -> bool:
    if phase == "between":
        return state.get("done") == 1 and state.get("phase") == "logging"
    if phase == "setup":  # the run's set-up with a cached warm start: models loading, (veRL) Ray starting
        return state.get("phase") in ("setup", "warm start")
    if phase == "warm start":
        return state.get("phase") == phase
    return state.get("step") == 2 and state.get("phase") == phase


def session_left(leader: int) -> list[str]:
    """The processes still alive in the session `leader` started (its children, Ray's, a merger's, ...)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == leader and fields[0] != "Z":  # fields: state, ppid, pgrp, session, ...
            comm = stat.read_text().split("(", 1)[1].rsplit(")", 1)[0]
            left.append(f"{stat.parent.name}:{comm}")
    return left


def kill_session(leader: int) -> None:
    for pid in session_left(leader):
        with contextlib.suppress(OSError):
            os.kill(int(pid.split(":")[0]), signal.SIGKILL)


def one(phase: str, signame: str, scratch: Path) -> dict:
    folder = scratch / f"{phase.replace(' ', '_')}_{signame}"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if phase == "warm start":
        env["ORCH_CACHE_DIR"] = str(folder / "cache")
    process = subprocess.Popen(command(folder), cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    deadline = time.monotonic() + 1800
    while not reached(progress(folder), phase):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            return {"phase": phase, "error": f"never reached (exit {process.returncode})"}
        time.sleep(0.02)
    if phase == "warm start":
        time.sleep(10)
    elif phase == "setup" and BACKEND:  # veRL: once Ray's own processes appear (ray.init under way)
        while not any(name.split(":", 1)[1].startswith(("gcs_server", "raylet")) for name in session_left(process.pid)):
            if process.poll() is not None:
                return {"phase": phase, "error": f"Ray never started (exit {process.returncode})"}
            time.sleep(0.02)
    elif phase == "setup":
        time.sleep(0.5)  # into it: the cached warm start takes ~1 s, then the models load
    sent = time.monotonic()
    process.send_signal(getattr(signal, f"SIG{signame}"))
    out, err = process.communicate()
    seconds = time.monotonic() - sent
    time.sleep(2)  # what is still alive 2 s after the exit (a process already exiting is not counted)
    left = session_left(process.pid)
    kill_session(process.pid)
    row = {"phase": phase, "exit": process.returncode, "seconds": seconds,
           "said": (out.strip().splitlines() or [""])[-1][:160],
           "tracebacks": err.count("Traceback"), "left": ",".join(left) or 0}
    if phase == "warm start":
        return row
    resumed = subprocess.run(command(folder), cwd=folder, env=env, capture_output=True, text=True)
    with sqlite3.connect(folder / "mlflow.db") as db:
        steps = [step for (step,) in db.execute(
            "SELECT step FROM metrics WHERE key = 'timing_s/step' ORDER BY step")]
        vals = [step for (step,) in db.execute(
            "SELECT step FROM metrics WHERE key = 'val/success_rate' ORDER BY step")]
    row.update(resume_exit=resumed.returncode, steps=steps, val_steps=vals)
    return row


def job_row(phase: str, signame: str, scratch: Path) -> dict:
    """A one-cell sweep of the same run on the local executor; the signal goes to the job's process."""
    import yaml

    from orchestrator.engine import wait
    from orchestrator.store import Store

    folder = scratch / f"job_{phase.replace(' ', '_')}_{signame}"
    folder.mkdir()
    base = {key: yaml.safe_load(value) for key, value in (o.split("=", 1) for o in [*OVERRIDES, *BACKEND])}
    sweep = {"name": "stopjob", "backend": base.pop("backend", "torch"), "base": base, "seeds": [0],
             "resources": {"default": {"cpus_per_task": 1, "time_min": 60}},
             "cluster": {"signal_delay_s": 30, "max_requeues": 2}}
    (folder / "stopjob.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
           "ORCH_STORE": f"sqlite:///{folder / 'orch.db'}"}
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", "stopjob.yaml"], cwd=folder, env=env,
                   check=True, capture_output=True)
    store = Store.open(env["ORCH_STORE"])
    (cell,) = store.cell_rows(store.require_sweep("stopjob").id)
    state_file = folder / ".orch" / "sweeps" / "stopjob" / "checkpoints" / cell.digest / "progress.json"
    deadline = time.monotonic() + 1800
    while True:
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            state = {}
        if reached(state, phase):
            break
        if time.monotonic() > deadline:
            return {"phase": phase, "error": "never reached"}
        time.sleep(0.02)
    attempt = store.attempts(cell.id)[-1]
    sent = time.monotonic()
    os.kill(attempt.pid, getattr(signal, f"SIG{signame}"))
    while Path(f"/proc/{attempt.pid}").exists() and "Z" not in Path(f"/proc/{attempt.pid}/stat").read_text().split()[2]:
        time.sleep(0.05)
    seconds = time.monotonic() - sent
    ended = store.attempts_by_id([attempt.id])[0]
    counts = wait(store, "stopjob", poll_s=1, timeout_s=1800)
    with sqlite3.connect(folder / "mlflow.db") as db:
        steps = [step for (step,) in db.execute(
            "SELECT step FROM metrics WHERE key = 'timing_s/step' ORDER BY step")]
        vals = [step for (step,) in db.execute(
            "SELECT step FROM metrics WHERE key = 'val/success_rate' ORDER BY step")]
    text = "".join(log.read_text(errors="replace") for log in (folder / ".orch").rglob("*_log.err"))
    return {"phase": phase, "exit": ended.state, "seconds": seconds, "said": (ended.reason or "")[:160],
            "tracebacks": text.count("Traceback"), "left": 0, "resume_exit": counts, "steps": steps,
            "val_steps": vals}


def prepare_sources(scratch: Path, env: dict) -> dict[str, str]:
    """A 2-step torch run (its run id and checkpoint) and a 1-step veRL run of the micro model (its actor)."""
    out = {}
    torch_dir = scratch / "src-torch"
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", *OVERRIDES, "trainer.total_steps=2",
                    "trainer.val_every=0", "trainer.save_every=2", f"trainer.checkpoint_dir={torch_dir}",
                    f"mlflow.tracking_uri={env['MLFLOW_TRACKING_URI']}"], env=env, check=True, capture_output=True)
    with sqlite3.connect(scratch / "mlflow.db") as db:
        (out["run"],) = db.execute("SELECT run_uuid FROM runs ORDER BY start_time DESC LIMIT 1").fetchone()
    out["torch_checkpoint"] = str(sorted(torch_dir.glob("step_*"))[-1])
    verl_dir = scratch / "src-verl"
    micro = ["trainer=test", "model.preset.hidden_size=32", "model.preset.num_hidden_layers=1",
             "model.preset.num_attention_heads=2", "model.preset.num_key_value_heads=1",
             "model.preset.intermediate_size=64", "model.warm_start.enabled=false"]
    subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", "backend=verl", *micro, "task=countdown",
                    "algorithm=grpo", "filter=none", "trainer.total_steps=1", "trainer.val_every=0",
                    "trainer.save_every=1", f"trainer.checkpoint_dir={verl_dir}",
                    f"mlflow.tracking_uri={env['MLFLOW_TRACKING_URI']}"], env=env, check=True, capture_output=True)
    out["verl_actor"] = str(verl_dir / "verl" / "global_step_1" / "actor")
    return out


TUNE = """name: stoptune
backend: torch
base: {model: tiny, task: frozenlake, trainer: cpu, algorithm: ppo, trainer.total_steps: 6,
       trainer.samples_per_prompt: 4, trainer.val_every: 2, filter: top_p}
seeds: [0]
study:
  space: {filter.value: {type: float, low: 0.5, high: 1.0}}
  objectives: [{metric: val/success_rate, reduce: max, direction: maximize}]
  sampler: {name: tpe, seed: 0}
  trials: 2
  parallel: 1
resources: {default: {cpus_per_task: 1, time_min: 30}}
"""


def commands_rows(signames: list[str], scratch: Path) -> list[dict]:
    """Each command that trains nothing, signalled while it is busy (see the module docstring)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{scratch / 'mlflow.db'}",
           "ORCH_STORE": f"sqlite:///{scratch / 'orch.db'}"}
    sources = prepare_sources(scratch, env)
    (scratch / "stoptune.yaml").write_text(TUNE)
    orch = [sys.executable, "-m", "orchestrator.cli"]
    demo = REPO / "sweeps" / "demo.yaml"
    cases = [  # name, argv (a function of a fresh output path), what to wait for in stderr (or seconds)
        ("eval (torch run, 256 episodes)", lambda o: [*orch, "eval", sources["run"], "--episodes", "256"],
         "evaluating"),
        ("eval (veRL checkpoint: merge, then episodes)",
         lambda o: [*orch, "eval", sources["verl_actor"], "--task", "countdown", "--episodes", "256"], 3.0),
        ("export (torch checkpoint)", lambda o: [*orch, "export", sources["torch_checkpoint"], "--hf", str(o)], 3.0),
        ("export (veRL checkpoint: veRL's model merger)",
         lambda o: [*orch, "export", sources["verl_actor"], "--hf", str(o)], 4.0),
        ("tune --wait (2 trials, local executor)", lambda o: [*orch, "tune", str(scratch / "stoptune.yaml"),
                                                              "--wait", "--store", f"sqlite:///{o}.db"], 30.0),
        ("sweep --preflight (table4)", lambda o: [*orch, "sweep", str(REPO / "sweeps" / "table4.yaml"), "--cluster",
                                                 "slurm", "--preflight"], 15.0),
        ("sweep --wait (demo)", lambda o: [*orch, "sweep", str(demo), "--wait", "--store", f"sqlite:///{o}.db"],
         20.0),
    ]
    rows = []
    for index, (name, argv, ready) in enumerate(cases):
        for signame in signames:
            out = scratch / f"out{index}_{signame}"
            rows.append(command_row(name, argv(out), ready, signame, out, scratch, env))
            if "store" in " ".join(argv(out)):  # end the jobs a sweep or study left running
                subprocess.run([*orch, "cancel", "stoptune" if "tune" in name else "demo", "--store",
                                f"sqlite:///{out}.db"], env=env, capture_output=True, cwd=scratch)
                time.sleep(5)
    return rows


def command_row(name: str, argv: list[str], ready: str | float, signame: str, out: Path, scratch: Path,
                env: dict) -> dict:
    import threading

    process = subprocess.Popen(argv, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    started = time.monotonic()
    while process.poll() is None:
        if (isinstance(ready, str) and any(ready in line for line in lines)) or (
                isinstance(ready, float) and time.monotonic() - started > ready):
            break
        time.sleep(0.02)
    if process.poll() is not None:
        return {"phase": name, "error": f"ended before the signal (exit {process.returncode}): {''.join(lines)[-300:]}"}
    sent = time.monotonic()
    process.send_signal(getattr(signal, f"SIG{signame}"))
    process.wait()
    seconds = time.monotonic() - sent
    reader.join(timeout=5)
    left = session_left(process.pid)
    with sqlite3.connect(scratch / "mlflow.db") as db:
        running = db.execute("SELECT COUNT(*) FROM runs WHERE status = 'RUNNING'").fetchone()[0]
    scratch_left = [p.name for p in scratch.glob(".*export-tmp")]
    text = "".join(lines)
    row = {"phase": name, "signal": signame, "exit": process.returncode, "seconds": seconds,
           "said": (text.strip().splitlines() or [""])[-1][:160], "tracebacks": text.count("Traceback"),
           "left": len(left), "mlflow_running": running, "scratch": scratch_left}
    if "sweep --wait" not in name and "tune" not in name:
        kill_session(process.pid)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", nargs="+", default=["TERM"], choices=["TERM", "USR2", "INT"])
    parser.add_argument("--phases", nargs="+", choices=PHASES)
    parser.add_argument("--backend", default="torch", choices=["torch", "verl"])
    parser.add_argument("--entry", default="train", choices=["train", "job", "commands"])
    args = parser.parse_args()
    if args.backend == "verl":
        BACKEND.append("backend=verl")
    phases = args.phases or (VERL_PHASES if args.backend == "verl" else PHASES)
    with tempfile.TemporaryDirectory(prefix="orch-bench-stop-") as scratch:
        if args.entry == "commands":
            for row in commands_rows(args.signal, Path(scratch)):
                if "error" in row:
                    print(f"{row['phase']:48s} {row['error']}", flush=True)
                    continue
                print(f"{row['phase']:48s} SIG{row['signal']:4s} -> exit {row['exit']} in {row['seconds']:5.1f} s, "
                      f"{row['tracebacks']} tracebacks, {row['left']} processes left, {row['mlflow_running']} MLflow "
                      f"runs RUNNING, scratch {row['scratch'] or 'none'}: {row['said']}", flush=True)
            print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            return
        for phase in phases:
            for signame in args.signal:
                if args.entry == "job":
                    row = job_row(phase, signame, Path(scratch))
                else:
                    row = one(phase, signame, Path(scratch))
                if "error" in row:
                    print(f"{phase:12s} {row['error']}", flush=True)
                    continue
                resume = ""
                if "steps" in row:
                    once = row["steps"] == [1, 2, 3] and row["val_steps"] == [0, 1, 2, 3]
                    resume = (f"  resume: {row['resume_exit']}, steps logged {row['steps']}, validations "
                              f"{row['val_steps']} ({'each once' if once else 'NOT each once'})")
                print(f"{phase:12s} SIG{signame} -> {row['exit']} in {row['seconds']:5.1f} s, {row['tracebacks']} "
                      f"tracebacks, {row['left']} processes left: {row['said']}{resume}", flush=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
