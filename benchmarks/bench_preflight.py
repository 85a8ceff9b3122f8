"""What preflight costs (issue 49 item 4: `orch sweep sweeps/table4.yaml --preflight` within 20 s on an idle 2-core
machine, cheap enough to run before every submission). Prints figures; asserts nothing.

    python benchmarks/bench_preflight.py [--sweep sweeps/table4.yaml] [--runs 3] [--phases]

1. `orch sweep SWEEP --cluster slurm --preflight` as a fresh process, `--runs` times: CPU time (user + sys of the
   process and its children, from getrusage) and wall time, each run beside the machine's 1-minute load average
   and core count before and after it (the wall time is only comparable on an idle machine; the CPU time is what
   an idle machine would take, within a few per cent: preflight runs on one core).
2. `--phases`: in one process, the CPU time of each phase: importing orch's CLI, planning the sweep, importing
   veRL for its validation (torch, tensordict, transformers come with it), the checks themselves (veRL's config
   composed once and each distinct config validated once: `recipes.verl.preflight.PreflightCache`), the same
   checks again on a warm cache, and the fit check alone (`orch paper --check`'s: no veRL validation, no veRL or
   torch import) on a fresh cache.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> str:
    load = os.getloadavg()
    return f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_command(sweep: Path, runs: int) -> None:
    orch = Path(sys.executable).with_name("orch")
    command = [str(orch), "sweep", str(sweep), "--cluster", "slurm", "--preflight"]
    print(f"command: {' '.join(command)}")
    for index in range(1, runs + 1):
        before, cpu, wall = machine(), children_cpu(), time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        wall, cpu = time.perf_counter() - wall, children_cpu() - cpu
        last = [line for line in result.stdout.splitlines() if line.startswith("preflight:")]
        print(f"run {index}: CPU {cpu:.1f} s (user+sys), wall {wall:.1f} s, exit {result.returncode}; "
              f"before: {before}; after: {machine()}")
        if last:
            print(f"  {last[-1]}")


def phases(sweep: Path) -> None:
    start = self_cpu()

    def mark(label: str, since: float) -> float:
        now = self_cpu()
        print(f"  {label}: CPU {now - since:.2f} s")
        return now

    print(f"phases (one process; {machine()}):")
    from orchestrator.cli import app  # noqa: F401

    now = mark("import orch's CLI", start)
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep

    plan = build_plan(load_sweep(sweep))
    now = mark(f"plan {sweep.name} ({len(plan.cells)} cells)", now)
    import verl.trainer.ppo.utils  # noqa: F401
    import verl.utils.config  # noqa: F401

    now = mark("import veRL for its validation", now)
    from orchestrator.preflight import preflight_plan, unfit_lines
    from recipes.verl.preflight import PreflightCache

    with PreflightCache() as cache:
        report = preflight_plan(plan, lambda cell: cell.resolved.config, cache=cache)
        now = mark(f"the checks ({report.composed} configs composed, {report.validated} validated, "
                   f"{len(report.classes)} classes)", now)
        preflight_plan(plan, lambda cell: cell.resolved.config, cache=cache)
        now = mark("the checks again, warm cache", now)
    with PreflightCache(fit_only=True) as cache:
        lines = unfit_lines([(cell.resolved.config, cell.resources, cell.backend) for cell in plan.cells], cache)
        now = mark(f"the fit check alone, fresh cache ({len(lines)} class(es) do not fit)", now)
    print(f"  total: CPU {now - start:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=REPO / "sweeps" / "table4.yaml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--phases", action="store_true", help="also time each phase in this process")
    args = parser.parse_args()
    sweep = args.sweep.resolve()
    if args.runs:
        run_command(sweep, args.runs)
    if args.phases:
        phases(sweep)


if __name__ == "__main__":
    main()
