"""Environment throughput per task: resets/s, env steps/s, and protocol turns/s through the batch driver.

    python benchmarks/bench_envs.py [--steps 20000] [--resets 500] [--batch 128] [--executions 100]

Steps use random valid actions (grid tasks), a fixed answer (Countdown, MetaMathQA; SearchQA: a BM25 search)
or, on WebShop, a search from a few queries then random clicks among the page's clickables (so most steps
render a results or item page; a purchase ends the episode); a finished episode is reset, and reset time is
excluded from steps/s. DeepCoder steps run code in the sandbox, so it gets its own line instead:
sandboxed executions per second (one submission = one bubblewrap process running all six tests of a shipped
problem; each answer differs, so the result cache never answers) and the shipped references' success rate.
Driver turns/s covers parsing, stepping and chat bookkeeping for a batch
of `--batch` episodes with a random-move policy (policy time included, model time obviously not).
"""

from __future__ import annotations

import argparse
import platform
import random
import time

from envs import list_envs, make_env, run_episodes
from envs.protocol import format_response

TEXT_ANSWERS = {"countdown": "1 + 2", "metamathqa": "42", "searchqa": "search[city river]"}
WEBSHOP_QUERIES = ("running shoes black", "organic green tea", "waterproof bluetooth speaker", "queen bed sheets")
CLICKABLES = "Clickables: "


def _action(env, rng: random.Random, state: str | None = None) -> str:
    """A random action for `env` in `state` (the text the agent sees; default: the env's current page)."""
    if env.valid_actions:
        return rng.choice(env.valid_actions)
    if env.name != "webshop":
        return TEXT_ANSWERS[env.name]
    state = env.render_text() if state is None else state
    listed = [line for line in state.splitlines() if line.startswith(CLICKABLES)]
    if not listed:
        return f"search[{rng.choice(WEBSHOP_QUERIES)}]"
    return f"click[{rng.choice(listed[-1].removeprefix(CLICKABLES).split(', '))}]"


def bench_resets(task: str, n: int) -> float:
    env = make_env(task)
    start = time.perf_counter()
    for seed in range(n):
        env.reset(seed)
    return n / (time.perf_counter() - start)


def bench_steps(task: str, n: int) -> float:
    env, rng = make_env(task), random.Random(0)
    env.reset(0)
    seed, stepping = 0, 0.0
    for _ in range(n):
        action = _action(env, rng)
        start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        stepping += time.perf_counter() - start
        if terminated or truncated:
            seed += 1
            env.reset(seed)
    return n / stepping


def bench_driver(task: str, batch: int) -> tuple[float, float]:
    """(turns per second, episodes per second) of `run_episodes` over one batch."""
    probe, rng = make_env(task), random.Random(0)

    def policy(histories):
        return [format_response("bench", [_action(probe, rng, h[-1]["content"])]) for h in histories]

    start = time.perf_counter()
    trajectories = run_episodes(task, {}, list(range(batch)), policy)
    elapsed = time.perf_counter() - start
    return sum(t.num_turns for t in trajectories) / elapsed, batch / elapsed


def bench_deepcoder(n: int) -> tuple[float, float]:
    """(sandboxed executions per second, success rate) of the shipped references, each made unique by a comment
    so that neither the known-reference shortcut nor the result cache skips the sandbox."""
    env = make_env("deepcoder")
    env.reset(0)
    env.step("print(0)")  # opens (probes) the sandbox outside the timing
    solved, elapsed = 0, 0.0
    for seed in range(n):
        env.reset(seed)
        answer = f"{env.problem.solution}# bench {seed}\n"
        start = time.perf_counter()
        solved += env.step(answer)[4]["success"]
        elapsed += time.perf_counter() - start
    return n / elapsed, solved / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--resets", type=int, default=500)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--executions", type=int, default=100, help="DeepCoder submissions to run")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, single process")
    print(f"{'task':<12} {'resets/s':>10} {'steps/s':>10} {'turns/s':>10} {'episodes/s':>11}")
    for task in list_envs():
        if task == "deepcoder":
            continue
        resets = bench_resets(task, args.resets)
        steps = bench_steps(task, args.steps)
        turns, episodes = bench_driver(task, args.batch)
        print(f"{task:<12} {resets:>10,.0f} {steps:>10,.0f} {turns:>10,.0f} {episodes:>11,.0f}")
    if "deepcoder" in list_envs():
        rate, success = bench_deepcoder(args.executions)
        print(f"deepcoder: {rate:,.1f} sandboxed executions/s (6 tests each), references' success {success:.0%}")


if __name__ == "__main__":
    main()
