"""Seconds from a stop signal to the exit of `orch train`, per phase of a run, and whether the resume then logs every
step exactly once (docs/reliability.md, "Ctrl-C").

For each phase: start `orch train` (the tiny model, FrozenLake, the demo's step shape of 8 prompts x 4 samples, MI
diagnostics and validation at every step, 3 steps) in a scratch folder, read its progress file every 20 ms, and
when step 2 is in the phase send the signal; time the exit; then run the same command again (the resume) and check
that it finishes with steps 1-3 each logged once. `warm start` instead starts with an empty warm-start cache and
signals 10 s into the warm start (no resume: the warm start's own resume is tested in
`tests/recipes/test_warmstart.py`).

    python benchmarks/bench_stop.py [--signal TERM] [--phases rollout diagnostics scoring update validation between "warm start"]
    python benchmarks/bench_stop.py --backend verl [--phases rollout diagnostics update validation between]

`--backend verl` runs veRL's own trainer on this CPU (Ray, FSDP2, HF rollouts) with the same run; its trainer reports
the phases rollout, diagnostics, update, validation (no separate scoring phase; no warm-start phase: the warm start
runs before veRL starts, as on the torch backend).

The warm start of the other phases comes from `$ORCH_CACHE_DIR` (trained once if missing). Timings are wall
seconds on this machine; under other load they are upper bounds.
"""

from __future__ import annotations

import argparse
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
PHASES = ["rollout", "diagnostics", "scoring", "update", "validation", "between", "warm start"]
OVERRIDES = ["model=tiny", "task=frozenlake", "trainer=cpu", "trainer.total_steps=3", "trainer.samples_per_prompt=4",
             "trainer.val_every=1", "trainer.save_every=0", "trainer.threads=1", "trainer.progress=false",
             "hooks=[collapse]", "diagnostics.mi_every=1", "diagnostics.num_samples=32"]


VERL_PHASES = ["rollout", "diagnostics", "update", "validation", "between"]
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
    if phase == "warm start":
        return state.get("phase") == "warm start"
    return state.get("step") == 2 and state.get("phase") == phase


def one(phase: str, signame: str, scratch: Path) -> dict:
    folder = scratch / phase.replace(" ", "_")
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if phase == "warm start":
        env["ORCH_CACHE_DIR"] = str(folder / "cache")
    process = subprocess.Popen(command(folder), cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 1800
    while not reached(progress(folder), phase):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            return {"phase": phase, "error": f"never reached (exit {process.returncode})"}
        time.sleep(0.02)
    if phase == "warm start":
        time.sleep(10)
    sent = time.monotonic()
    process.send_signal(getattr(signal, f"SIG{signame}"))
    out, err = process.communicate()
    seconds = time.monotonic() - sent
    row = {"phase": phase, "exit": process.returncode, "seconds": seconds,
           "said": (out.strip().splitlines() or [""])[-1][:160],
           "tracebacks": err.count("Traceback")}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", default="TERM", choices=["TERM", "USR2", "INT"])
    parser.add_argument("--phases", nargs="+", choices=PHASES)
    parser.add_argument("--backend", default="torch", choices=["torch", "verl"])
    args = parser.parse_args()
    if args.backend == "verl":
        BACKEND.append("backend=verl")
    phases = args.phases or (VERL_PHASES if args.backend == "verl" else PHASES)
    with tempfile.TemporaryDirectory(prefix="orch-bench-stop-") as scratch:
        for phase in phases:
            row = one(phase, args.signal, Path(scratch))
            if "error" in row:
                print(f"{phase:12s} {row['error']}", flush=True)
                continue
            resume = ""
            if "steps" in row:
                once = row["steps"] == [1, 2, 3] and row["val_steps"] == [0, 1, 2, 3]
                resume = (f"  resume: exit {row['resume_exit']}, steps logged {row['steps']}, validations "
                          f"{row['val_steps']} ({'each once' if once else 'NOT each once'})")
            print(f"{phase:12s} SIG{args.signal} -> exit {row['exit']} in {row['seconds']:5.1f} s, "
                  f"{row['tracebacks']} tracebacks: {row['said']}{resume}", flush=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
