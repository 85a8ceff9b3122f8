"""Where a tiny-model training step goes, and how far each phase is from what this machine's core can compute
(issue 29 item 2; docs/training.md, "Step time against the compute limit").

One process, one thread (as a sweep cell runs), the warm-started tiny model on the long run's shape
(sweeps/repro_long.yaml: 8 prompts x 4 samples, PPO, MI diagnostics on all 32 trajectories). For `--steps` steps it
times every phase as the trainer does (`timing_s/*`), then counts the arithmetic of each phase on one more step's
batch (2 x parameters per token, plus causal attention; 3x for a forward and backward) and sets it against this
core's float32 matmul at the model's widths: "% of peak" is how much of the phase is arithmetic, the rest overhead
(per-token decoding, small passes, small kernels, Python). Compare two versions with their ratios, run interleaved on
the same machine (issue 59: a worktree of the old commit, `PYTHONPATH=<worktree>`, alternately with this tree).

    python benchmarks/bench_step_limits.py [--task frozenlake] [--steps 3]

Timings are wall seconds: run it on idle cores (compare ratios, not seconds, across machines).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from recipes.config.schema import compose_train_config
from recipes.run.tracking import RunTracker
from recipes.torch_trainer.trainer import rollout_and_score, setup, train_step


def seconds(fn, repeat: int = 3) -> float:
    """The fastest of `repeat` timed calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(width: int, tokens: int = 4096) -> float:
    """GFLOP/s of a (tokens x width) @ (width x 4 width) float32 matmul: the core's peak for the model's shapes."""
    a, b = torch.randn(tokens, width), torch.randn(width, 4 * width)
    return 2 * tokens * width * 4 * width / seconds(lambda: a @ b, 10) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="frozenlake")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="orch-bench-limits-"))
    cfg = compose_train_config([
        "model=tiny", f"task={args.task}", "trainer=cpu", "algorithm=ppo", "filter=none", "trainer.samples_per_prompt=4",
        "trainer.threads=1", "trainer.val_every=0", "trainer.dump_every=0", "trainer.progress=false",
        "hooks=[collapse]", "diagnostics.mi_every=1", "diagnostics.num_samples=32",
        f"trainer.total_steps={args.steps}", f"mlflow.tracking_uri=sqlite:///{scratch / 'mlflow.db'}",
        f"trainer.checkpoint_dir={scratch / 'ck'}",
    ])
    tracker = RunTracker(cfg.infra.mlflow.tracking_uri, "bench", run_id=None, run_name="bench_step_limits")
    run, _ = setup(cfg, tracker, scratch / "ck")
    phases: dict[str, list[float]] = {}
    for step in range(1, args.steps + 1):
        metrics = train_step(run, step).metrics
        for key, value in metrics.items():
            if key.startswith("timing_s/") and key != "timing_s/diagnostics_share":
                phases.setdefault(key.removeprefix("timing_s/"), []).append(value)
    mean = {name: sum(values) / len(values) for name, values in phases.items()}

    # the last step's batch again (the model as it is now): its arithmetic, at the core's matmul peak
    context = rollout_and_score(run, args.steps + 1, {})
    batch, policy = context.batch, run.models.policy
    lengths = batch.attention_mask.sum(dim=-1).double()
    tokens, generated = int(lengths.sum()), int(batch.loss_mask.sum())
    params = sum(p.numel() for p in policy.parameters())
    layers, width = policy.config.num_hidden_layers, policy.config.hidden_size
    # a forward: 2 x parameters per token (the matmuls), plus causal attention's QK^T and AV: 2 x layers x width x
    # length^2 per trajectory; a forward and backward: 3x
    forward = 2 * params * tokens + float(2 * layers * width * (lengths**2).sum())
    decode = 2 * params * generated + float(2 * layers * width * (lengths**2).sum()) / 2  # each new token, its prefix
    peak = matmul_gflops(width) * 1e9
    epochs = run.settings.epochs
    rows = [
        ("rollout (generation)", "gen", decode, f"{generated} tokens decoded one at a time"),
        ("old log-probs", "old_log_prob", forward, f"{run.settings.micro_batch_size} trajectories per pass"
                                                    f"{' (packed)' if run.settings.micro_batch_size > 1 else ''}"),
        ("values", "values", forward, "the critic's forward"),
        ("actor update", "update_actor", 3 * forward * epochs, f"{epochs} epoch(s) of forward + backward"),
        ("critic update", "update_critic", 3 * forward * epochs, "the critic's, the same shapes"),
    ]
    print(f"task {args.task}, {args.steps} steps of {len(batch)} trajectories, 1 thread; policy {params:,} parameters,"
          f" width {width}, {layers} layers; the batch: {tokens} tokens, {generated} generated")
    print(f"step {mean['step']:.2f} s (mean); the core's float32 matmul at the model's widths: {peak / 1e9:.0f} GFLOP/s")
    print(f"{'phase':24s} {'s/step':>7s} {'GFLOP':>7s} {'at peak s':>9s} {'% of peak':>9s}  what")
    for name, key, flops, note in rows:
        took = mean.get(key, 0.0)
        print(f"{name:24s} {took:7.2f} {flops / 1e9:7.1f} {flops / peak:9.3f} {flops / peak / took:9.1%}  {note}")
    rest = mean["step"] - sum(mean.get(key, 0.0) for _, key, _, _ in rows) - mean.get("diagnostics", 0.0)
    print(f"{'diagnostics (MI)':24s} {mean.get('diagnostics', 0.0):7.2f}  (cross-scoring: benchmarks/bench_cross_scoring.py)")
    print(f"{'the rest':24s} {rest:7.2f}  (filter, advantages, batch building)")


if __name__ == "__main__":
    main()
