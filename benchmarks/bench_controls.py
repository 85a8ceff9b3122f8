"""The controls of the MI diagnostics over seeds (docs/diagnostics.md#controls): how often the early warning fires
with nothing planted (the false-alarm rate) and with a planted collapse (the detection rate), and how far the
trajectory set's retrieval accuracy sits above chance before and after step 3.

The runs are those of `tests/recipes/test_controls.py` (same overrides; CI runs seed 0 only): the tiny model after
a small FrozenLake warm start, 6 steps of 8 prompts x 2 samples, MI at every step on 16 samples, a learning rate of
1e-6; the planted run generates every reply from one fixed chat from step 3 on (`control.blind_from_step=3`).

    python benchmarks/bench_controls.py [--seeds 10] [--first-seed 0] [--steps 6]

Prints one line per run and the two rates with Wilson 95% intervals. Each run takes about 30 s on 2 idle cores.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import tempfile
import time
from pathlib import Path

from mlflow import MlflowClient

from recipes.backends import run_training
from recipes.config import compose_train_config


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


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a rate of `hits` in `n`."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def one(seed: int, blind_from: int, steps: int, folder: Path) -> dict:
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    overrides = [*CONTROL, f"seed={seed}", f"trainer.total_steps={steps}", f"control.blind_from_step={blind_from}",
                 f"mlflow.tracking_uri={uri}", f"trainer.checkpoint_dir={folder / f'ck-{seed}-{blind_from}'}",
                 "trainer.progress=false"]
    started = time.perf_counter()
    result = run_training(compose_train_config(overrides))
    client = MlflowClient(uri)
    seen = {key: {m.step: m.value for m in client.get_metric_history(result.mlflow_run_id, key)}
            for key in (RETRIEVAL, CHANCE, ALERT)}
    excess = {step: seen[RETRIEVAL][step] - seen[CHANCE][step] for step in seen[RETRIEVAL]}
    fired = [step for step, value in sorted(seen[ALERT].items()) if value]
    return {"seed": seed, "planted": bool(blind_from), "fired": fired[0] if fired else None,
            "before": sum(excess[s] for s in range(1, BLIND_FROM)) / (BLIND_FROM - 1),
            "after": sum(excess[s] for s in range(BLIND_FROM, steps + 1)) / (steps + 1 - BLIND_FROM),
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-controls-") as scratch:
        os.chdir(scratch)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for blind_from in (0, BLIND_FROM):
                row = one(seed, blind_from, args.steps, Path(scratch))
                rows.append(row)
                print(f"seed {seed:3d}  {'planted ' if row['planted'] else 'negative'}  alert at step "
                      f"{row['fired'] if row['fired'] is not None else '-':>2}  retrieval excess over chance: steps "
                      f"1-{BLIND_FROM - 1} {row['before']:+.3f}, steps {BLIND_FROM}-{args.steps} {row['after']:+.3f}"
                      f"  ({row['seconds']:.0f} s)", flush=True)
    for planted, what in ((False, "false alarms (nothing planted)"), (True, "detections (collapse planted)")):
        group = [row for row in rows if row["planted"] == planted]
        hits = sum(row["fired"] is not None for row in group)
        low, high = wilson(hits, len(group))
        print(f"{what}: {hits}/{len(group)} = {hits / len(group):.0%} (Wilson 95%: {low:.0%}-{high:.0%})")


if __name__ == "__main__":
    main()
