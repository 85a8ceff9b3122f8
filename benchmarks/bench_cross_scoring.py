"""Cross-scoring cost: naive N x M full forwards vs prefix key/value reuse, at several prompt:reasoning ratios.

Prints, per ratio: CPU time of each method (one thread by default), tokens each fed through the model, the achieved speed-up, the ideal
speed-up (tokens saved: naive tokens / prefix tokens) and their ratio (efficiency), and the max |L| difference.

    python benchmarks/bench_cross_scoring.py [--columns 8] [--samples 64] [--reasoning 24] [--ratios 1,4,16]

With `--trajectory`: instead, the MI trajectory set's shape at the paper's 64 samples -- 8 prompts x 8
trajectories of 1-5 turns (a 150-token system prompt, a 100-token observation per turn, replies of 20-110 tokens),
64 uniform (trajectory, turn) draws as columns and their replies as samples -- scored by `prefix` (CPU seconds).
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from recipes.stats.cross_scoring import cross_score


def build_model(hidden: int, layers: int, vocab: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 32),
        num_key_value_heads=max(1, hidden // 64), intermediate_size=4 * hidden, max_position_embeddings=8192,
    )
    return Qwen2ForCausalLM(config).float().eval()


def timed(fn, repeats: int):
    """Best-of-`repeats` CPU seconds of this process (robust when other work shares the machine; with one thread
    it is the wall time on a core of its own) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        best = min(best, time.process_time() - start)
    return best, result


def trajectory_set(rng: np.random.Generator, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """64 columns and samples drawn like `recipes.diagnostics.monitor.trajectory_set` from synthetic multi-turn episodes."""
    def tokens(count: int) -> list[int]:
        return rng.integers(3, vocab, size=count).tolist()

    system, episodes = tokens(150), []
    for _ in range(8):
        first = system + tokens(100)
        for _ in range(8):
            turns, context = [], list(first)
            for _ in range(int(rng.integers(1, 6))):
                reply = tokens(int(rng.integers(20, 110)))
                turns.append((list(context), reply))
                context += reply + tokens(110)
            episodes.append(turns)
    draws = [turns[rng.integers(len(turns))] for turns in (episodes[rng.integers(64)] for _ in range(64))]
    return [prompt for prompt, _ in draws], [reply for _, reply in draws]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--columns", type=int, default=8, help="N prompt columns")
    parser.add_argument("--samples", type=int, default=64, help="M reasoning samples")
    parser.add_argument("--reasoning", type=int, default=24, help="reasoning tokens per sample")
    parser.add_argument("--ratios", default="1,4,16", help="prompt:reasoning length ratios")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (times are CPU seconds)")
    parser.add_argument("--trajectory", action="store_true", help="the trajectory set's shape instead (see above)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = build_model(args.hidden, args.layers, args.vocab)
    if args.trajectory:
        prompts, samples = trajectory_set(np.random.default_rng(0), args.vocab)
        seconds, scores = timed(functools.partial(cross_score, model, prompts, samples, batch_size=args.batch_size),
                                args.repeats)
        print(f"trajectory set: {len({tuple(p) for p in prompts})} distinct of 64 columns, mean prompt "
              f"{np.mean([len(p) for p in prompts]):.0f} tokens, mean reasoning {np.mean([len(z) for z in samples]):.0f}"
              f" tokens; prefix: {seconds:.1f} CPU s, {scores.tokens_processed} tokens")
        return
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"model: Qwen2 {params:.2f}M params ({args.layers} layers, hidden {args.hidden}), threads "
          f"{torch.get_num_threads()}; N={args.columns} columns, M={args.samples} samples, "
          f"{args.reasoning} reasoning tokens, batch {args.batch_size}")
    header = f"{'P:Z':>6} {'naive cpu s':>11} {'prefix cpu s':>12} {'naive tok':>10} {'prefix tok':>10} {'speed-up':>9} {'ideal':>7} {'effic.':>7} {'max|dL|':>9}"
    print(header)
    rng = np.random.default_rng(0)
    for ratio in (int(r) for r in args.ratios.split(",")):
        prompt_len = ratio * args.reasoning
        prompts = [rng.integers(1, args.vocab, size=prompt_len).tolist() for _ in range(args.columns)]
        samples = [rng.integers(1, args.vocab, size=args.reasoning).tolist() for _ in range(args.samples)]
        score = functools.partial(cross_score, model, prompts, samples, batch_size=args.batch_size)
        t_naive, naive = timed(functools.partial(score, method="naive"), args.repeats)
        t_prefix, prefix = timed(functools.partial(score, method="prefix"), args.repeats)
        ideal = naive.tokens_processed / prefix.tokens_processed
        speedup = t_naive / t_prefix
        print(f"{ratio:>4}:1 {t_naive:11.2f} {t_prefix:12.2f} {naive.tokens_processed:10d} {prefix.tokens_processed:10d} "
              f"{speedup:8.1f}x {ideal:6.1f}x {speedup / ideal:6.0%} {np.abs(naive.L - prefix.L).max():9.1e}")


if __name__ == "__main__":
    main()
