"""One rank of tests/recipes/verl/test_verl_parts.py's FSDP2 cross-scoring test (run as a script: spawned processes
cannot import test modules under pytest's importlib mode).

usage: python fsdp_scoring_rank.py MODEL_FOLDER JOB_JSON RANK WORLD PORT OUT_JSON [STOP_FILE]
JOB_JSON holds {"prompts": [...], "samples": [...]}, the prompts distinct and sorted as the driver sends them; OUT_JSON
gets this rank's L_sum block (`recipes.verl.workers.block_scores`) on the model sharded with FSDP2 over gloo, or null
when the ranks stopped (STOP_FILE, this rank's view of the run's stop file, polled collectively between forwards).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(folder: str, job_file: str, rank: int, world: int, port: int, out: str, stop_file: str | None) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from recipes.verl.workers import block_scores, collective_stop

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        job = json.loads(Path(job_file).read_text())
        scored = block_scores(model, job["prompts"], job["samples"], rank, world, 2, 0, collective_stop(stop_file))
        Path(out).write_text(json.dumps(None if scored is None else scored[0].tolist()))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6],
         sys.argv[7] if len(sys.argv) > 7 else None)
