"""The controls of the MI diagnostics over seeds (docs/diagnostics.md#controls): how often the collapse alert fires
with nothing planted (the false-alarm rate) and with a planted collapse (the detection rate), and how far the
trajectory set's retrieval accuracy sits above chance before and after step 3.

The runs are those of `tests/recipes/diagnostics/test_controls.py` (its `ControlRuns`, same overrides; CI runs seed 0
only): the tiny model after a small FrozenLake warm start, 5 steps of 8 prompts x 2 samples, MI at every step on 16
samples, a learning rate of 1e-6, the collapse alert's legacy rule without its success guard; the planted run generates
every reply from one fixed chat from step 3 on (`control.blind_from_step=3`). As in the test, the arms of a seed
resume one shared run of steps 1-2; `--straight` runs each arm uninterrupted instead (what a branch stands for: the
figures must be the same; the verl backend always runs straight).

    python benchmarks/bench_controls.py [--seeds 10] [--first-seed 0] [--steps 5] [--task frozenlake]
    python benchmarks/bench_controls.py --backend verl --seeds 1     # the same runs through veRL's own trainer
    python benchmarks/bench_controls.py --entropy [--seeds 5]    # the entropy-collapse control instead
    python benchmarks/bench_controls.py --graded [--seeds 6]     # the graded plant (blind_strength 0.5) instead

Prints one line per run and the two rates with Wilson 95% intervals. With `--entropy`, the entropy-collapse arm of
the test (a negative entropy coefficient, 6 steps) per seed: how far entropy fell, the retrieval excess over chance and
the MI estimate's ratio to its first steps', and in how many seeds the dissociation held (the test's three checks:
entropy below `ENTROPY_LEFT` of its first step's, retrieval above chance beyond the test's tolerance, MI at least
half). With `--graded`, per seed the retrieval excess over chance and MI-ZScore over the planted steps of the
negative, graded (half the rows blinded) and planted arms, the graded arm's share of the negative arm's and its
position between the planted (0) and the negative (1), when the collapse alert fired on the graded arm, and in how
many seeds the test's graded checks held (`graded_checks`). Each arm takes about 20-50 s on
2 cores, with other work beside it. `--record` is gone: the controls `orch report` prints (`analysis.stats.controls`) are re-derived from the archived
graded plants under the shipped alert rule (`benchmarks/bench_collapse_alert.py --record`); this bench's 6-step runs are
not kept.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from pathlib import Path

from analysis.stats.verdicts import wilson


def _test_settings():
    """The control runs and checks, from the test module itself (loaded by path: no second copy to drift)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "recipes" / "diagnostics" / "test_controls.py"
    spec = importlib.util.spec_from_file_location("orch_test_controls", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


T = _test_settings()


def runs(args: argparse.Namespace, seed: int, scratch: Path):
    """Seed `seed`'s arms (the test's `ControlRuns`) in `scratch`, on the chosen task and backend."""
    return T.ControlRuns(scratch / f"seed-{seed}", seed=seed, steps=args.steps, entropy_steps=args.steps,
                         extra=[f"backend={args.backend}", f"task={args.task}", "trainer.progress=false"],
                         straight=args.straight or args.backend != "torch")


def arm(runs, name: str):
    try:
        return runs.arm(name)
    except AssertionError as err:  # a run that did not finish
        raise SystemExit(f"bench_controls: the {name} arm (seed {runs.seed}) failed: {err}") from None


def one(runs, name: str) -> dict:
    seen, steps = arm(runs, name), runs.steps
    fired = [step for step, value in sorted(seen[T.ALERT].items()) if value]
    return {"seed": runs.seed, "planted": name == "planted", "fired": fired[0] if fired else None,
            "before": T.excess(seen, range(1, T.BLIND_FROM)),
            "after": T.excess(seen, T.measured(seen, range(T.BLIND_FROM, steps + 1))),
            "seconds": runs.seconds[name]}


def one_entropy(runs) -> dict:
    """The entropy-collapse control at one seed: the figures the test's three checks read, and whether all held
    (`entropy_collapse_checks` of the test module)."""
    seen, steps, mean = arm(runs, "entropy"), runs.entropy_steps, T.mean
    first, after = range(1, T.BLIND_FROM), range(T.BLIND_FROM, steps + 1)
    return {"seed": runs.seed, "seconds": runs.seconds["entropy"],
            "entropy_ratio": mean(seen[T.ENTROPY][s] for s in (steps - 1, steps)) / seen[T.ENTROPY][1],
            "excess": T.excess(seen, after),
            "mi_ratio": mean(seen[T.MI][s] for s in after) / mean(seen[T.MI][s] for s in first),
            "held": all(T.entropy_collapse_checks(seen, steps).values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help=f"steps per arm (default: the test's, {T.STEPS}; the entropy arm's {T.ENTROPY_STEPS})")
    parser.add_argument("--task", default="frozenlake")
    parser.add_argument("--entropy", action="store_true", help="run the entropy-collapse control instead")
    parser.add_argument("--graded", action="store_true", help="run the graded plant (and its two references) instead")
    parser.add_argument("--straight", action="store_true", help="each arm uninterrupted (no shared prefix)")
    parser.add_argument("--backend", choices=["torch", "verl"], default="torch")
    args = parser.parse_args()
    if args.entropy:
        args.steps = args.steps or T.ENTROPY_STEPS
        return entropy_main(args)
    args.steps = args.steps or T.STEPS
    if args.graded:
        return graded_main(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-controls-") as scratch:
        os.chdir(scratch)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            arms = runs(args, seed, Path(scratch))
            for name in ("negative", "planted"):
                row = one(arms, name)
                rows.append(row)
                print(f"seed {seed:3d}  {'planted ' if row['planted'] else 'negative'}  alert at step "
                      f"{row['fired'] if row['fired'] is not None else '-':>2}  retrieval excess over chance: steps "
                      f"1-{T.BLIND_FROM - 1} {row['before']:+.3f}, steps {T.BLIND_FROM}-{args.steps} "
                      f"{row['after']:+.3f}  ({row['seconds']:.0f} s)", flush=True)
            if "prefix" in arms.seconds:
                print(f"seed {seed:3d}  (the shared steps 1-{T.BLIND_FROM - 1}: {arms.seconds['prefix']:.0f} s)")
    counts = {}
    for planted, what in ((False, "false alarms (nothing planted)"), (True, "detections (collapse planted)")):
        group = [row for row in rows if row["planted"] == planted]
        hits = sum(row["fired"] is not None for row in group)
        counts[planted] = (hits, len(group))
        low, high = wilson(hits, len(group))
        print(f"{what}: {hits}/{len(group)} = {hits / len(group):.0%} (Wilson 95%: {low:.0%}-{high:.0%})")


def graded_main(args: argparse.Namespace) -> None:
    held = 0
    with tempfile.TemporaryDirectory(prefix="orch-controls-") as scratch:
        os.chdir(scratch)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            arms = runs(args, seed, Path(scratch))
            seen = {name: arm(arms, name) for name in ("negative", "graded", "planted")}
            figures = T.graded_figures(seen["negative"], seen["graded"], seen["planted"], args.steps)
            checks = T.graded_checks(figures)
            held += all(checks.values())
            planted_steps = range(T.BLIND_FROM, args.steps + 1)
            unmeasured = {name: sorted(set(planted_steps) - set(T.measured(history, planted_steps)))
                          for name, history in seen.items()}
            fired = [step for step, value in sorted(seen["graded"][T.ALERT].items()) if value]
            print(f"seed {seed:3d}  retrieval excess over chance, steps {T.BLIND_FROM}-{args.steps}: negative "
                  f"{figures['excess_negative']:+.3f}  graded {figures['excess_graded']:+.3f}  planted "
                  f"{figures['excess_planted']:+.3f}  (graded: share {figures['excess_share']:.2f}, position "
                  f"{figures['excess_position']:.2f});  MI-ZScore: {figures['zscore_negative']:+.2f}  "
                  f"{figures['zscore_graded']:+.2f}  {figures['zscore_planted']:+.2f}  (share "
                  f"{figures['zscore_share']:.2f}, position {figures['zscore_position']:.2f});  graded alert at step "
                  f"{fired[0] if fired else '-'};  "
                  f"{'held' if all(checks.values()) else 'NOT held: ' + ', '.join(k for k, v in checks.items() if not v)}"
                  f"  (unmeasured steps: {unmeasured}; "
                  f"{', '.join(f'{name} {s:.0f} s' for name, s in arms.seconds.items())})", flush=True)
    low, high = wilson(held, args.seeds)
    print(f"graded checks held: {held}/{args.seeds} (Wilson 95%: {low:.0%}-{high:.0%})")


def entropy_main(args: argparse.Namespace) -> None:
    held = 0
    with tempfile.TemporaryDirectory(prefix="orch-controls-") as scratch:
        os.chdir(scratch)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            row = one_entropy(runs(args, seed, Path(scratch)))
            held += row["held"]
            print(f"seed {seed:3d}  entropy at the end / step 1 {row['entropy_ratio']:.2f}  retrieval excess over "
                  f"chance {row['excess']:+.3f}  MI / its first steps' {row['mi_ratio']:.2f}  "
                  f"{'held' if row['held'] else 'NOT held'}  ({row['seconds']:.0f} s)", flush=True)
    low, high = wilson(held, args.seeds)
    print(f"entropy fell, MI did not: {held}/{args.seeds} (Wilson 95%: {low:.0%}-{high:.0%})")


if __name__ == "__main__":
    main()
