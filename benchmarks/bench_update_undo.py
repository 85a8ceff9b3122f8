"""What keeping the update undoable costs per step (`recipes.runtime.update_undo.UpdateUndo`): the bytes copied and
the seconds to copy the policy, the value model and their AdamW states before each update (and to put them back,
which only a stop inside the update does), against the step it rides on (8 s on FrozenLake, about 40 s on Sokoban:
docs/training.md).

    python benchmarks/bench_update_undo.py [--model tiny] [--repeats 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from recipes.config.schema import compose_train_config
from recipes.policy.models import base_model_folder, load_critic, load_policy
from recipes.runtime.update_undo import UpdateUndo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = compose_train_config([f"model={args.model}", "trainer=cpu", "algorithm=ppo"])
    folder = base_model_folder(cfg.model)
    trained = []
    for model in (load_critic(folder, "float32", "cpu"), load_policy(folder, "float32", "cpu")):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for parameter in model.parameters():  # one step, so that AdamW's moments exist as they do mid-run
            parameter.grad = torch.ones_like(parameter)
        optimizer.step()
        trained.append((model, optimizer))
    size = UpdateUndo.size_bytes(trained)
    keep, back = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        undo = UpdateUndo(trained)
        keep.append(time.perf_counter() - started)
        started = time.perf_counter()
        undo.restore()
        back.append(time.perf_counter() - started)
    print(f"model {args.model}: {size / 1e6:.1f} MB kept per step (limit {UpdateUndo.LIMIT_BYTES / 1e6:.0f} MB); "
          f"keep {min(keep) * 1e3:.1f} ms (median {sorted(keep)[len(keep) // 2] * 1e3:.1f}), "
          f"restore {min(back) * 1e3:.1f} ms (median {sorted(back)[len(back) // 2] * 1e3:.1f}), "
          f"best of {args.repeats}, {args.threads} thread(s)")


if __name__ == "__main__":
    main()
