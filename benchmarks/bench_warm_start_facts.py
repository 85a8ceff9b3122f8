"""Which facts of its demonstrations does a warm-started policy read from the prompt?

Teacher-forces held-out first-turn demonstrations (drawn with another seed than the warm start's) through the task's
warm-started model (trained, or loaded from the cache, as `bench_warm_start.py` does) and prints, per fact (the
sentence's first word) and token kind (digit or not), the mean per-token loss of the reasoning under its own prompt
and under the next demonstration's prompt. A fact the model reads costs less under its own prompt (gap > 0); a gap of
0 everywhere is an input-blind policy.

    python benchmarks/bench_warm_start_facts.py --task sokoban [--folder DIR] [--episodes 48] [override ...]

`--folder`: a warm-started model folder to diagnose instead (the demonstrations come from the current code).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from envs import demonstration_trajectories
from recipes.config.schema import compose_train_config
from recipes.policy.chat import ChatEncoder
from recipes.policy.models import load_policy, load_tokenizer
from recipes.torch_trainer.warmstart import model_folder

HELDOUT_DEMO_SEED = 987654  # not the warm start's demonstration seed (0)


def reasoning_losses(model, encoder, prompt, reasoning):
    """Tokens of `reasoning` and their loss (nats) after `prompt` (system and user messages)."""
    chat = encoder.encode([*prompt, {"role": "assistant", "content": reasoning}])
    ids = torch.tensor([chat.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    losses = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").tolist()
    positions = [p for p in range(1, len(chat.input_ids) - 1) if chat.loss_mask[p]]  # the end-of-turn token left out
    return [encoder.tokenizer.decode([chat.input_ids[p]]) for p in positions], [losses[p - 1] for p in positions]


def fact_of(text_so_far: str, token: str) -> str:
    sentence = text_so_far.rsplit(". ", 1)[-1].replace("<think>", "").strip()
    head = (sentence.split(" ")[0] if sentence else token.strip())[:12]
    return f"{head}/{'digit' if token.strip().isdigit() else 'text'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="sokoban")
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = compose_train_config(["model=tiny", f"task={args.task}", *args.overrides])
    folder = args.folder or model_folder(cfg)[0]
    model = load_policy(folder, "float32", "cpu").eval()
    encoder = ChatEncoder(load_tokenizer(folder))
    demos = demonstration_trajectories(args.task, args.episodes, HELDOUT_DEMO_SEED, cfg.task.env)
    prompts = [demo.messages[:2] for demo in demos]
    reasonings = [demo.messages[2]["content"].split("</think>")[0] + "</think>" for demo in demos]

    own, other = defaultdict(list), defaultdict(list)
    for index, reasoning in enumerate(reasonings):
        tokens, own_losses = reasoning_losses(model, encoder, prompts[index], reasoning)
        _, other_losses = reasoning_losses(model, encoder, prompts[(index + 1) % len(prompts)], reasoning)
        text = ""
        for token, own_loss, other_loss in zip(tokens, own_losses, other_losses, strict=True):
            own[fact_of(text, token)].append(own_loss)
            other[fact_of(text, token)].append(other_loss)
            text += token
    print(f"{'fact/token':<20} {'tokens':>6} {'own':>6} {'other':>6} {'gap':>6}")
    for fact in sorted(own, key=lambda f: -sum(own[f])):
        mean_own, mean_other = sum(own[fact]) / len(own[fact]), sum(other[fact]) / len(other[fact])
        print(f"{fact:<20} {len(own[fact]):>6} {mean_own:>6.3f} {mean_other:>6.3f} {mean_other - mean_own:>6.3f}")
    every_own, every_other = [x for v in own.values() for x in v], [x for v in other.values() for x in v]
    print(f"{'all':<20} {len(every_own):>6} {sum(every_own) / len(every_own):>6.3f} "
          f"{sum(every_other) / len(every_other):>6.3f} {(sum(every_other) - sum(every_own)) / len(every_own):>6.3f}")


if __name__ == "__main__":
    main()
