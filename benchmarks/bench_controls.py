"""The controls of the MI diagnostics over seeds (docs/diagnostics.md#controls): how often the early warning fires
with nothing planted (the false-alarm rate) and with a planted collapse (the detection rate), and how far the
trajectory set's retrieval accuracy sits above chance before and after step 3.

The runs are those of `tests/recipes/diagnostics/test_controls.py` (same overrides; CI runs seed 0 only): the tiny model after
a small FrozenLake warm start, 6 steps of 8 prompts x 2 samples, MI at every step on 16 samples, a learning rate of
1e-6; the planted run generates every reply from one fixed chat from step 3 on (`control.blind_from_step=3`).

    python benchmarks/bench_controls.py [--seeds 10] [--first-seed 0] [--steps 6] [--task frozenlake] [--record]
    python benchmarks/bench_controls.py --backend verl --seeds 1     # the same runs through veRL's own trainer
    python benchmarks/bench_controls.py --entropy [--seeds 5]    # the entropy-collapse control instead

Prints one line per run and the two rates with Wilson 95% intervals. With `--entropy`, the entropy-collapse arm of
the test (a negative entropy coefficient) per seed: how far entropy fell, the retrieval excess over chance and the
MI estimate's ratio to its first steps', and in how many seeds the dissociation held (the test's three checks: entropy
below `ENTROPY_LEFT` of its first step's, retrieval above chance beyond the test's tolerance, MI at least half). Each run takes about 30 s on 2 idle cores.
`--record` writes the task's rates into `analysis/controls.yaml`, where `orch report` reads whether the MI proxies
have been shown to move on the task (`analysis.controls`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from pathlib import Path

from mlflow import MlflowClient

from analysis.verdicts import wilson
from recipes.config.backends import run_training
from recipes.config.schema import compose_train_config


def _test_settings():
    """The control runs' settings, from the test module itself (loaded by path: no second copy to drift)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "recipes" / "test_controls.py"
    spec = importlib.util.spec_from_file_location("orch_test_controls", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SETTINGS = _test_settings()
ALERT, BLIND_FROM, CHANCE, CONTROL, RETRIEVAL = (_SETTINGS.ALERT, _SETTINGS.BLIND_FROM, _SETTINGS.CHANCE,
                                                 _SETTINGS.CONTROL, _SETTINGS.RETRIEVAL)
ENTROPY, MI = _SETTINGS.ENTROPY, _SETTINGS.MI


BACKEND = ["backend=torch"]  # --backend verl: the same runs through veRL's trainer (Ray, FSDP2, the agent loop)


def control(seed: int, blind_from: int, steps: int, folder: Path, task: str,
            extra: tuple[str, ...] = ()) -> tuple[dict[str, dict[int, float]], float]:
    """One control run's metric histories and its wall seconds."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    overrides = [*CONTROL, *BACKEND, f"task={task}", f"seed={seed}", f"trainer.total_steps={steps}", f"control.blind_from_step={blind_from}",
                 f"mlflow.tracking_uri={uri}", f"trainer.checkpoint_dir={folder / f'ck-{seed}-{blind_from}-{len(extra)}'}",
                 "trainer.progress=false", *extra]
    started = time.perf_counter()
    result = run_training(compose_train_config(overrides))
    if result.status != "finished":
        raise SystemExit(f"bench_controls: the {BACKEND[0]} run (seed {seed}) ended {result.status}: {result.reason}")
    client = MlflowClient(uri)
    return ({key: {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, key)}
             for key in (RETRIEVAL, CHANCE, ALERT, ENTROPY, MI)}, time.perf_counter() - started)


def one_entropy(seed: int, steps: int, folder: Path, task: str) -> dict:
    """The entropy-collapse control at `seed`: the figures the test's three checks read, and whether all held
    (`entropy_collapse_checks` of the test module)."""
    seen, seconds = control(seed, 0, steps, folder, task, tuple(_SETTINGS.ENTROPY_COLLAPSE))
    mean = _SETTINGS.mean
    first, after = range(1, BLIND_FROM), range(BLIND_FROM, steps + 1)
    return {"seed": seed, "seconds": seconds,
            "entropy_ratio": mean(seen[ENTROPY][s] for s in (steps - 1, steps)) / seen[ENTROPY][1],
            "excess": mean(seen[RETRIEVAL][s] for s in after) - mean(seen[CHANCE][s] for s in after),
            "mi_ratio": mean(seen[MI][s] for s in after) / mean(seen[MI][s] for s in first),
            "held": all(_SETTINGS.entropy_collapse_checks(seen, steps).values())}


def one(seed: int, blind_from: int, steps: int, folder: Path, task: str) -> dict:
    seen, seconds = control(seed, blind_from, steps, folder, task)
    excess = {step: seen[RETRIEVAL][step] - seen[CHANCE][step] for step in seen[RETRIEVAL]}
    fired = [step for step, value in sorted(seen[ALERT].items()) if value]
    return {"seed": seed, "planted": bool(blind_from), "fired": fired[0] if fired else None,
            "before": sum(excess[s] for s in range(1, BLIND_FROM)) / (BLIND_FROM - 1),
            "after": sum(excess[s] for s in range(BLIND_FROM, steps + 1)) / (steps + 1 - BLIND_FROM),
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--task", default="frozenlake")
    parser.add_argument("--record", action="store_true", help="write the rates into analysis/controls.yaml")
    parser.add_argument("--entropy", action="store_true", help="run the entropy-collapse control instead")
    parser.add_argument("--backend", choices=["torch", "verl"], default="torch")
    args = parser.parse_args()
    BACKEND[:] = [f"backend={args.backend}"]
    if args.record and args.backend != "torch":
        parser.error("--record keeps the torch backend's rates (analysis/controls.yaml has one entry per task)")
    if args.entropy:
        return entropy_main(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-controls-") as scratch:
        os.chdir(scratch)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for blind_from in (0, BLIND_FROM):
                row = one(seed, blind_from, args.steps, Path(scratch), args.task)
                rows.append(row)
                print(f"seed {seed:3d}  {'planted ' if row['planted'] else 'negative'}  alert at step "
                      f"{row['fired'] if row['fired'] is not None else '-':>2}  retrieval excess over chance: steps "
                      f"1-{BLIND_FROM - 1} {row['before']:+.3f}, steps {BLIND_FROM}-{args.steps} {row['after']:+.3f}"
                      f"  ({row['seconds']:.0f} s)", flush=True)
    counts = {}
    for planted, what in ((False, "false alarms (nothing planted)"), (True, "detections (collapse planted)")):
        group = [row for row in rows if row["planted"] == planted]
        hits = sum(row["fired"] is not None for row in group)
        counts[planted] = (hits, len(group))
        low, high = wilson(hits, len(group))
        print(f"{what}: {hits}/{len(group)} = {hits / len(group):.0%} (Wilson 95%: {low:.0%}-{high:.0%})")
    if args.record:
        record(args, counts)


def entropy_main(args: argparse.Namespace) -> None:
    held = 0
    with tempfile.TemporaryDirectory(prefix="orch-controls-") as scratch:
        os.chdir(scratch)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            row = one_entropy(seed, args.steps, Path(scratch), args.task)
            held += row["held"]
            print(f"seed {seed:3d}  entropy at the end / step 1 {row['entropy_ratio']:.2f}  retrieval excess over "
                  f"chance {row['excess']:+.3f}  MI / its first steps' {row['mi_ratio']:.2f}  "
                  f"{'held' if row['held'] else 'NOT held'}  ({row['seconds']:.0f} s)", flush=True)
    low, high = wilson(held, args.seeds)
    print(f"entropy fell, MI did not: {held}/{args.seeds} (Wilson 95%: {low:.0%}-{high:.0%})")


def record(args: argparse.Namespace, counts: dict[bool, tuple[int, int]]) -> None:
    """Write this task's rates into analysis/controls.yaml (the other tasks' entries stay)."""
    import datetime

    import yaml

    path = Path(__file__).resolve().parents[1] / "analysis" / "controls.yaml"
    text = path.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    entries = yaml.safe_load(text) or {}
    entries[args.task] = {
        "detected": counts[True][0], "planted": counts[True][1], "false_alarms": counts[False][0],
        "negative": counts[False][1],
        "setting": (f"tiny model after its warm start, {args.steps} steps of 8 prompts x 2 samples, MI at every "
                    f"step on 16 samples, learning rate 1e-6, collapse planted from step {BLIND_FROM}"),
        "source": (f"python benchmarks/bench_controls.py --task {args.task} --seeds {args.seeds} --first-seed "
                   f"{args.first_seed}, {datetime.date.today().isoformat()}"),
    }
    path.write_text(header + yaml.safe_dump(entries, sort_keys=True, width=200))
    print(f"recorded in {path}")


if __name__ == "__main__":
    main()
