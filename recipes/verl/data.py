"""The prompts of a veRL run as veRL's dataset files: one parquet row per prompt, an environment seed.

The `orch_env` agent loop builds each chat from its environment, so a row only names the seed (`extra_info.seed`);
its `prompt` column is a one-line placeholder veRL's `RLHFDataset` requires. The seeds are the torch backend's:
step s trains on `train_prompt_seeds(seed, s, G)` (rows in step order, the dataloader unshuffled), validation
on `validation_seeds(val_size)`, and DAPO's extra generation batches on `train_prompt_seeds(seed, s, G, extra)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipes.config.schema import TrainConfig
from recipes.runtime.seeds import train_prompt_seeds, validation_seeds

PROMPT_SAMPLE = 32  # first prompts measured for the prompt budget
PROMPT_MARGIN = 1.25


def prompt_rows(cfg: TrainConfig, seeds: list[int], split: str) -> list[dict[str, Any]]:
    """veRL dataset rows for `seeds` (see the module docstring)."""
    from recipes.verl.agent_loop import AGENT_NAME

    return [
        {
            "data_source": cfg.task.name,
            "prompt": [{"role": "user", "content": f"{cfg.task.name} seed {seed}"}],
            "agent_name": AGENT_NAME,
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {"seed": int(seed), "index": index, "split": split},
        }
        for index, seed in enumerate(seeds)
    ]


def training_seeds(cfg: TrainConfig, extra: int = 0) -> list[int]:
    """Every step's prompt seeds in step order (`extra` > 0: that extra generation batch of every step)."""
    trainer = cfg.trainer
    return [seed for step in range(1, trainer.total_steps + 1)
            for seed in train_prompt_seeds(cfg.seed, step, trainer.prompts_per_step, extra)]


def write_prompt_files(cfg: TrainConfig, folder: Path) -> dict[str, Path]:
    """`train`, `val` and (with dynamic sampling) `extra` parquet files in `folder`."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    files = {"train": folder / "train.parquet", "val": folder / "val.parquet"}
    pd.DataFrame(prompt_rows(cfg, training_seeds(cfg), "train")).to_parquet(files["train"])
    pd.DataFrame(prompt_rows(cfg, validation_seeds(max(1, cfg.trainer.val_size)), "val")).to_parquet(files["val"])
    if cfg.algorithm.dynamic_sampling and cfg.algorithm.max_extra_gen_batches:
        seeds = [seed for extra in range(1, cfg.algorithm.max_extra_gen_batches + 1)
                 for seed in training_seeds(cfg, extra)]
        files["extra"] = folder / "extra.parquet"
        pd.DataFrame(prompt_rows(cfg, seeds, "extra")).to_parquet(files["extra"])
    return files


def prompt_budget(cfg: TrainConfig, tokenizer: Any) -> int:
    """Tokens to reserve for the first prompt: the longest of the first training and validation prompts, with a
    margin, rounded up to a multiple of 64, and at most half of `trainer.max_context_tokens`."""
    longest = longest_first_prompt(cfg, chat_token_count(tokenizer))
    return min(budget_for(longest), cfg.trainer.max_context_tokens // 2)


def chat_token_count(tokenizer: Any) -> Any:
    """messages -> tokens of their chat prompt (with the generation prompt), as the model will be fed it."""
    from recipes.policy.chat import ChatEncoder

    encoder = ChatEncoder(tokenizer)
    return lambda messages: len(encoder.encode(messages, add_generation_prompt=True).input_ids)


def budget_for(longest: int) -> int:
    """The prompt budget for a longest first prompt of `longest` tokens: a margin, rounded up to 64."""
    return -(-int(longest * PROMPT_MARGIN) // 64) * 64


def longest_first_prompt(cfg: TrainConfig, count: Any) -> int:
    """The largest `count(messages)` over the first training and validation prompts (their chat messages)."""
    from envs.episode import Episode
    from envs.registry import build_config, env_class

    config = build_config(cfg.task.name, cfg.task.env)
    seeds = training_seeds(cfg)[:PROMPT_SAMPLE] + validation_seeds(PROMPT_SAMPLE)
    return max(count(Episode(env_class(cfg.task.name)(config), seed).messages) for seed in seeds)


def extra_prompt_batch(trainer: Any, step: int, extra: int) -> Any:
    """DAPO's extra generation batch `extra` of `step`, generated and joined as veRL's fit loop joins a batch."""
    import numpy as np
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_response_mask
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    if getattr(trainer, "_orch_extra_dataset", None) is None:
        trainer._orch_extra_dataset = RLHFDataset(trainer.config.orch.extra_file, trainer.tokenizer,
                                                  trainer.config.data, trainer.processor)
    prompts = trainer.config.data.train_batch_size
    first = ((step - 1) * trainer.cfg.algorithm.max_extra_gen_batches + extra - 1) * prompts
    batch = DataProto.from_single_dict(collate_fn([trainer._orch_extra_dataset[first + i] for i in range(prompts)]))
    batch.non_tensor_batch["uid"] = np.array([f"extra-{step}-{extra}-{i}" for i in range(len(batch))], dtype=object)
    batch.meta_info["temperature"] = trainer.config.actor_rollout_ref.rollout.temperature
    gen = trainer._get_gen_batch(batch)
    gen.meta_info["global_steps"] = step
    n = trainer.config.actor_rollout_ref.rollout.n
    output = trainer.async_rollout_manager.generate_sequences(gen.repeat(repeat_times=n, interleave=True))
    output.meta_info.pop("timing", None)
    batch = batch.repeat(repeat_times=n, interleave=True).union(output)
    if "response_mask" not in batch.batch:
        batch.batch["response_mask"] = compute_response_mask(batch)
    return batch
