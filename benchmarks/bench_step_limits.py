"""Where a tiny-model training step goes, and how far each phase is from what this machine's core can compute
(issue 29 item 2; docs/training.md, "Step time against the compute limit").

One process, one thread (as a sweep cell runs), the warm-started tiny model on the long run's shape
(sweeps/repro_long.yaml: 8 prompts x 4 samples, PPO, MI diagnostics on all 32 trajectories). For `--steps` steps it
times every phase as the trainer does (`timing_s/*`), then counts the arithmetic of each phase on one more step's
batch (2 x parameters per token, plus causal attention; 3x for a forward and backward) and sets it against this
core's float32 matmul at the model's widths: "% of peak" is how much of the phase is arithmetic, the rest overhead
(per-token decoding, small passes, small kernels, Python). Compare two versions with their ratios, run interleaved on
the same machine (issue 59: a worktree of the old commit, `PYTHONPATH=<worktree>`, alternately with this tree).

    python benchmarks/bench_step_limits.py [--task frozenlake] [--steps 3] [--mi-samples 32] [--floor] [--bf16]

`--floor` profiles one more step (torch's profiler; the trainer marks each phase as the range `phase/<name>`) and
prints, per phase, the seconds spent inside the matmul and attention kernels themselves (aten mm/addmm/bmm and the
fused attention forward and backward): what the phase would still take if every other op and all Python were free,
so `floor / step` bounds how far the step can fall without computing less or computing it differently (issue 59
item 4). `--bf16` runs the actor's forward and backward of that batch in float32 and under bfloat16 autocast (this
CPU's AMX) and prints both times and how far the log-probs and the loss move.

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


KERNELS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def kernel_floor(run, step: int) -> tuple[dict[str, float], dict[str, float], float]:
    """Profile train step `step`: per phase (`phase/<name>` ranges), its seconds and the seconds inside `KERNELS`
    under it (the autograd engine's backward kernels run on the update's thread, inside its range); and the step's."""
    from torch.profiler import ProfilerActivity, profile

    from recipes.torch_trainer.trainer import train_step

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        train_step(run, step)
        took = time.perf_counter() - start
    events = prof.events()
    ranges = sorted(((event.time_range.start, event.time_range.end, event.thread, event.name.removeprefix("phase/"))
                     for event in events if event.name.startswith("phase/")), key=lambda r: r[1] - r[0])

    def innermost(start_us: float, end_us: float, thread: int) -> str | None:
        """The narrowest phase range holding [start, end] on `thread` (a phase inside another counts as its own)."""
        return next((name for lo, hi, on, name in ranges if on == thread and lo <= start_us and end_us <= hi), None)

    phase_s: dict[str, float] = {}
    kernel_s: dict[str, float] = {}
    for lo, hi, thread, name in ranges:  # self time: less the phases inside it
        inner = sum(end - begin for begin, end, on, _ in ranges
                    if on == thread and lo <= begin and end <= hi and (begin, end) != (lo, hi))
        phase_s[name] = phase_s.get(name, 0.0) + (hi - lo - inner) / 1e6
        kernel_s.setdefault(name, 0.0)
    for event in events:
        if event.name in KERNELS and (name := innermost(event.time_range.start, event.time_range.end,
                                                         event.thread)) is not None:
            kernel_s[name] += event.self_cpu_time_total / 1e6
    return phase_s, kernel_s, took


def bf16_update(policy, batch, micro_batch_size: int) -> None:
    """The actor's forward and backward of the batch's first micro-batch in float32 and under bfloat16 autocast:
    the fastest of 3 of each, and how far bfloat16 moves the per-token log-probs and their mean."""
    from recipes.policy.actor import token_log_probs
    from recipes.policy.batch import micro_batches

    micro = next(iter(micro_batches(batch, micro_batch_size)))
    mask = micro.loss_mask.bool()
    results = {}
    for name, enabled in (("float32", False), ("bfloat16 autocast", True)):
        def once(enabled=enabled):
            policy.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
                log_probs, entropy = token_log_probs(policy, micro, with_entropy=True)
                loss = -(log_probs[mask].mean() + 0.001 * entropy[mask].mean())
            loss.backward()
            return log_probs.detach()[mask], float(loss.detach())
        results[name] = (seconds(once), *once())
    (fp32_s, fp32_lp, fp32_loss), (bf_s, bf_lp, bf_loss) = results.values()
    policy.zero_grad(set_to_none=True)
    print(f"actor forward+backward, {len(micro)} trajectories ({int(mask.sum())} loss tokens): float32 {fp32_s:.2f} s,"
          f" bfloat16 autocast {bf_s:.2f} s ({fp32_s / bf_s:.2f}x); bfloat16 moves the log-probs by up to"
          f" {float((bf_lp - fp32_lp).abs().max()):.2e} (mean {float((bf_lp - fp32_lp).abs().mean()):.2e}), the loss"
          f" by {abs(bf_loss - fp32_loss) / abs(fp32_loss):.1e} of itself")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="frozenlake")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mi-samples", type=int, default=32,
                        help="diagnostics.num_samples (32: the long run's; sweeps/demo.yaml's is 16)")
    parser.add_argument("--floor", action="store_true", help="the kernels' seconds per phase (one profiled step)")
    parser.add_argument("--bf16", action="store_true", help="the actor's pass in float32 and under bfloat16 autocast")
    args = parser.parse_args()
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="orch-bench-limits-"))
    cfg = compose_train_config([
        "model=tiny", f"task={args.task}", "trainer=cpu", "algorithm=ppo", "filter=none", "trainer.samples_per_prompt=4",
        "trainer.threads=1", "trainer.val_every=0", "trainer.dump_every=0", "trainer.progress=false",
        "hooks=[collapse]", "diagnostics.mi_every=1", f"diagnostics.num_samples={args.mi_samples}",
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
        if took < 0.01:  # not run: a float32 policy's old log-probs are its sampler's (sampled_or_scored)
            print(f"{name:24s} {took:7.2f}  not computed: the sampler's log-probs")
            continue
        print(f"{name:24s} {took:7.2f} {flops / 1e9:7.1f} {flops / peak:9.3f} {flops / peak / took:9.1%}  {note}")
    rest = mean["step"] - sum(mean.get(key, 0.0) for _, key, _, _ in rows) - mean.get("diagnostics", 0.0)
    print(f"{'diagnostics (MI)':24s} {mean.get('diagnostics', 0.0):7.2f}  (cross-scoring: benchmarks/bench_cross_scoring.py)")
    print(f"{'the rest':24s} {rest:7.2f}  (filter, advantages, batch building)")
    if args.floor:
        phase_s, kernel_s, took = kernel_floor(run, args.steps + 2)
        print(f"\nstep {args.steps + 2}, profiled: {took:.2f} s; seconds inside the matmul and attention kernels:")
        print(f"{'phase':24s} {'s':>7s} {'kernels s':>9s} {'share':>6s}")
        for name in sorted(phase_s, key=phase_s.get, reverse=True):
            print(f"{name:24s} {phase_s[name]:7.2f} {kernel_s[name]:9.2f} {kernel_s[name] / max(phase_s[name], 1e-9):6.0%}")
        floor = sum(kernel_s.values())
        print(f"{'step':24s} {took:7.2f} {floor:9.2f} {floor / took:6.0%}  <- with all else free, the step is at least"
              f" {floor / took:.0%} of this")
    if args.bf16:
        bf16_update(policy, batch, run.settings.micro_batch_size)


if __name__ == "__main__":
    main()
