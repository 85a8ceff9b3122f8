"""One rank of tests/recipes/test_verl_parts.py's FSDP2 cross-scoring test (run as a script: spawned processes
cannot import test modules under pytest's importlib mode).

usage: python fsdp_scoring_rank.py MODEL_FOLDER JOB_JSON RANK WORLD PORT OUT_JSON
JOB_JSON holds {"prompts": [...], "samples": [...]}, the prompts distinct and sorted as the driver sends them; OUT_JSON
gets this rank's L_sum block (`recipes.verl.workers.block_scores`) on the model sharded with FSDP2 over gloo.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(folder: str, job_file: str, rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from recipes.verl.workers import block_scores

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        job = json.loads(Path(job_file).read_text())
        block, _ = block_scores(model, job["prompts"], job["samples"], rank, world, 2, 0)
        Path(out).write_text(json.dumps(block.tolist()))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
