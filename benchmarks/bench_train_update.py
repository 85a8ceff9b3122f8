"""Actor- and critic-update time at kept ratios 1.0, 0.5 and 0.25 of the same batch (the paper's Table 5 saving).

One batch of `prompts x samples` multi-turn transcripts (solver demonstrations: realistic lengths and turn
structure) with random advantages; the filter keeps whole groups, so a kept ratio r updates on r of the groups with
proportionally fewer mini-batches. Prints, per ratio: trajectories, loss tokens, optimiser steps, best-of-N update
CPU times (one thread by default: robust when the machine is shared) and their ratio to the full batch.

    python benchmarks/bench_train_update.py [--task sokoban] [--model tiny] [--prompts 8] [--samples 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from envs import demonstrations
from recipes.config.schema import compose_train_config
from recipes.policy.actor import (
    UpdateSettings,
    actor_config,
    batched_forward,
    token_log_probs,
    update_actor,
    update_critic,
)
from recipes.policy.batch import build_batch
from recipes.policy.chat import ChatEncoder
from recipes.policy.models import base_model_folder, load_critic, load_policy, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="sokoban")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (times are CPU seconds)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = compose_train_config([f"task={args.task}", f"model={args.model}", "trainer=cpu", "algorithm=ppo"])
    folder = base_model_folder(cfg.model)
    encoder = ChatEncoder(load_tokenizer(folder))
    policy, critic = load_policy(folder, "float32", "cpu"), load_critic(folder, "float32", "cpu")
    count = args.prompts * args.samples
    chats = demonstrations(args.task, count, seed=7)
    rewards = [[0.0] * sum(m["role"] == "assistant" for m in chat) for chat in chats]
    batch = build_batch(chats, rewards, np.repeat(np.arange(args.prompts), args.samples), encoder)
    generator = torch.Generator().manual_seed(0)
    batch.advantages = torch.randn(batch.input_ids.shape, generator=generator) * batch.loss_mask
    batch.returns = torch.randn(batch.input_ids.shape, generator=generator) * batch.loss_mask
    trainer = cfg.trainer
    batch.old_log_probs = batched_forward(lambda m, b: token_log_probs(m, b)[0], policy, batch, 1)
    batch.values = torch.zeros_like(batch.returns)
    settings = UpdateSettings(trainer.mini_batch_size, trainer.micro_batch_size, trainer.ppo_epochs,
                              cfg.model.grad_clip, trainer.max_response_tokens * cfg.task.env["max_turns"])
    print(f"task {args.task}, model {args.model}, {args.prompts} prompts x {args.samples} samples, "
          f"mini-batch {settings.mini_batch_size}, micro-batch {settings.micro_batch_size}, "
          f"threads {torch.get_num_threads()}, best of {args.repeats}")
    print(f"{'kept':>5} {'traj':>5} {'tokens':>7} {'opt steps':>9} {'actor cpu s':>11} {'x full':>7} {'critic cpu s':>12} "
          f"{'x full':>7}")
    full: dict[str, float] = {}
    for ratio in (1.0, 0.5, 0.25):
        groups = np.arange(int(round(ratio * args.prompts)))
        kept = batch.select(np.isin(batch.group_ids, groups))
        timings = {"actor": float("inf"), "critic": float("inf")}
        for _ in range(args.repeats):
            actor, value = copy.deepcopy(policy), copy.deepcopy(critic)
            actor_opt = torch.optim.AdamW(actor.parameters(), lr=cfg.model.actor_lr)
            value_opt = torch.optim.AdamW(value.parameters(), lr=cfg.model.critic_lr)
            start = time.process_time()
            metrics = update_actor(actor, actor_opt, kept, actor_config(cfg.algorithm, settings, args.samples),
                                   settings)
            timings["actor"] = min(timings["actor"], time.process_time() - start)
            start = time.process_time()
            update_critic(value, value_opt, kept, cfg.algorithm.cliprange_value, settings)
            timings["critic"] = min(timings["critic"], time.process_time() - start)
        full = full or dict(timings)
        print(f"{ratio:5.2f} {len(kept):5d} {int(kept.loss_mask.sum()):7d} {int(metrics['actor/optimizer_steps']):9d} "
              f"{timings['actor']:11.2f} {timings['actor'] / full['actor']:7.2f} {timings['critic']:12.2f} "
              f"{timings['critic'] / full['critic']:7.2f}")


if __name__ == "__main__":
    main()
