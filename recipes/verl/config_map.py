"""orch's training config -> veRL's Hydra config: the one place that says which veRL key carries which orch setting.

    overrides = verl_overrides(cfg, job)      # Hydra overrides of veRL's `ppo_trainer` config, key by key
    config = verl_config(cfg, job)            # composed (veRL's own defaults + these), plus the `orch` node

`cfg` is the run's `TrainConfig` (what it computes); `job` says where things are on this host (model and tokenizer
folders, data files, the checkpoint folder, the Ray resources). The `orch` node carries the whole `TrainConfig` to
the TaskRunner and the agent-loop workers, which read the filter, the environment and the diagnostics from it.

Semantics that differ between the two and how they are matched:
* mini-batches: orch counts trajectories (`trainer.mini_batch_size`), veRL counts prompts (its
  `ppo_mini_batch_size` is multiplied by `rollout.n`): `max(1, mini_batch_size // samples_per_prompt)`;
* micro-batches: token budgets (`use_dynamic_bsz`), `micro_batch_size x max_context_tokens` tokens per pass, so a
  batch shrunk by the filter never trips veRL's divisibility checks on micro-batch sizes;
* the context: `trainer.max_context_tokens` = veRL's prompt budget (the longest first prompt, measured) + response
  budget (every later turn, observation tokens included); `trainer.max_response_tokens` caps each reply;
* algorithms: the registered algorithm declares its veRL estimator and whether it trains a critic
  (`recipes.policy.algorithms`: `verl_estimator`, `uses_critic`): ppo and dapo (RAGEN-2's DAPO) -> GAE with a critic; grpo
  and dapo_dynamic -> veRL's grpo estimator; drgrpo -> grpo without std normalisation; one without a veRL estimator
  is refused when the config is validated; the loss aggregation, clip ranges, entropy and KL terms map one to one;
* checkpoints: `save_every=0` still saves at the end and when a stop is requested (veRL then saves at every
  `total_steps` multiple only, i.e. the last step); which checkpoint a run resumes from is orch's decision
  (`recipes.verl.backend.resume_step`), never veRL's `auto`;
* validation: `val_every` -> `test_freq` (veRL also validates on the last step), `val_size` seeds, one rollout each
  at `val_temperature`, before training when `val_every > 0` (orch's step 0);
* LoRA (`model.lora.rank` > 0): the actor's `lora_rank`, `lora_alpha`, `target_modules`, the keys RAGEN sets
  (config/base.yaml:26-29 in github:mll-lab-nu/RAGEN) and veRL's FSDP engine reads (transformer_impl.py:162,
  :339-368). veRL then makes the reference the actor with its adapter disabled (ray_trainer.py:357-360,
  :1272-1276: no reference worker) and syncs the rollout the base weights once, then the adapter alone with its
  peft config (engine_workers.py:786-806), which vLLM loads as a LoRA adapter and orch's hf replica applies through
  peft (recipes/verl/hf_rollout.py). The critic stays full-parameter: veRL 0.9.1 wraps a LoRA value model as a causal
  LM (transformer_impl.py:359-368, no `modules_to_save`), which would freeze its fresh value head; rank 0 adds no key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.config.schema import TrainConfig
from recipes.policy.algorithms import get_algorithm

REPO_ROOT = Path(__file__).resolve().parents[2]
CPU_ENV = {"VERL_PLATFORM": "cpu", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
BF16 = "{param_dtype:bf16,reduce_dtype:fp32,buffer_dtype:fp32}"
VLLM_CPU_MEMORY_SHARE = 0.1  # of RAM, for vLLM's KV cache in a CPU rehearsal (its default 0.92 fails at start)


@dataclass(frozen=True)
class VerlJob:
    """Where a veRL run's inputs and outputs are on this host, and what it may use.

    model_path, tokenizer_path: Hugging Face folders (the tokenizer in a folder of its own).
    train_file, val_file: the prompt parquet files (`recipes.verl.data`).
    checkpoint_dir: veRL's `default_local_dir`.
    prompt_length: tokens of the longest first prompt (rounded up).
    nnodes, gpus_per_node: the Ray cluster the trainer spans (logical GPUs on cpu).
    env: environment variables every Ray process gets (through `runtime_env`).
    extra_file: the prompts of DAPO's extra generation batches (dynamic sampling), if any.
    resume_step: continue from veRL's checkpoint of this step (None: start from the initial model).
    """

    model_path: str
    tokenizer_path: str
    train_file: str
    val_file: str
    checkpoint_dir: str
    prompt_length: int
    nnodes: int = 1
    gpus_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    extra_file: str | None = None
    resume_step: int | None = None


def _value(value: Any) -> str:
    from recipes.config.compose import hydra_overrides

    return hydra_overrides({"k": value}, ())[0].split("=", 1)[1]


@dataclass(frozen=True)
class _Mapping:
    """What every section of veRL's config is filled from: the run's config, the host's job, and the settings
    derived from them once."""

    cfg: TrainConfig
    job: VerlJob

    @property
    def cpu(self) -> bool:
        return self.cfg.trainer.device == "cpu"

    @property
    def uses_critic(self) -> bool:
        return get_algorithm(self.cfg.algorithm.name).uses_critic

    @property
    def prompts_per_mini_batch(self) -> int:
        return max(1, self.cfg.trainer.mini_batch_size // self.cfg.trainer.samples_per_prompt)

    @property
    def token_budget(self) -> int:
        return self.cfg.trainer.micro_batch_size * self.cfg.trainer.max_context_tokens

    @property
    def precision(self) -> str:
        return FP32 if self.cpu or self.cfg.model.dtype == "float32" else BF16

    @property
    def engine(self) -> str:
        return self.cfg.rollout_engine()


def _algorithm(m: _Mapping) -> dict[str, Any]:
    """`algorithm.*`: the advantage estimator the registered algorithm declares, its discounting."""
    algorithm = m.cfg.algorithm
    return {
        "algorithm.adv_estimator": get_algorithm(algorithm.name).verl_estimator,
        "algorithm.gamma": algorithm.gamma,
        "algorithm.lam": algorithm.lam,
        "algorithm.norm_adv_by_std_in_grpo": algorithm.norm_adv_by_std,
        "algorithm.use_kl_in_reward": False,
    }


def _data(m: _Mapping) -> dict[str, Any]:
    """`data.*` (and `reward.*`): one row per prompt (an environment seed); the agent loop builds the chat."""
    trainer, job = m.cfg.trainer, m.job
    return {
        "data.train_files": job.train_file,
        "data.val_files": job.val_file,
        "data.train_batch_size": trainer.prompts_per_step,
        "data.val_batch_size": max(1, trainer.val_size),
        "data.max_prompt_length": job.prompt_length,
        "data.max_response_length": max(1, trainer.max_context_tokens - job.prompt_length),
        "data.shuffle": False,
        "data.dataloader_num_workers": 0,
        "data.filter_overlong_prompts": False,
        "data.truncation": "error",
        "data.return_raw_chat": True,
        "reward.num_workers": 1,
    }


def _model(m: _Mapping) -> dict[str, Any]:
    """`actor_rollout_ref.model.*`: the model's and tokenizer's folders."""
    return {
        "actor_rollout_ref.model.path": m.job.model_path,
        "actor_rollout_ref.model.tokenizer_path": m.job.tokenizer_path,
        "actor_rollout_ref.model.use_remove_padding": False,
        "actor_rollout_ref.model.enable_gradient_checkpointing": not m.cpu,
    }


def _actor(m: _Mapping) -> dict[str, Any]:
    """`actor_rollout_ref.actor.*` and `.ref.*`: veRL's FSDP2 engine, the algorithm's loss."""
    trainer, algorithm, model, hosting = m.cfg.trainer, m.cfg.algorithm, m.cfg.model, m.cfg.infra.verl
    return {
        "actor_rollout_ref.actor.strategy": "fsdp2",
        "actor_rollout_ref.actor.optim.lr": model.actor_lr,
        "actor_rollout_ref.actor.optim.weight_decay": model.weight_decay,
        "actor_rollout_ref.actor.optim.clip_grad": model.grad_clip,
        "actor_rollout_ref.actor.grad_clip": model.grad_clip,
        "actor_rollout_ref.actor.ppo_mini_batch_size": m.prompts_per_mini_batch,
        "actor_rollout_ref.actor.ppo_epochs": trainer.ppo_epochs,
        "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": m.token_budget,
        "actor_rollout_ref.actor.clip_ratio": algorithm.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_low": algorithm.clip_ratio_low,
        "actor_rollout_ref.actor.clip_ratio_high": algorithm.clip_ratio_high,
        "actor_rollout_ref.actor.clip_ratio_c": algorithm.clip_ratio_c,
        "actor_rollout_ref.actor.loss_agg_mode": algorithm.loss_agg_mode,
        "actor_rollout_ref.actor.loss_scale_factor": trainer.max_response_tokens * m.cfg.task.env["max_turns"],
        "actor_rollout_ref.actor.entropy_coeff": algorithm.entropy_coeff,
        "actor_rollout_ref.actor.use_kl_loss": algorithm.use_kl,
        "actor_rollout_ref.actor.kl_loss_coef": algorithm.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": algorithm.kl_penalty,
        "actor_rollout_ref.actor.fsdp_config.param_offload": hosting.param_offload,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": hosting.param_offload,
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        # RAGEN's run scripts set it (run_main_table_diff_size.sh:245); veRL 0.9.1 honours it on the remove-padding
        # path only (recipes/verl/memory.py says what it changes)
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking": hosting.entropy_chunking,
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.actor.checkpoint.save_contents": ["model", "optimizer", "extra"],
        "actor_rollout_ref.ref.strategy": "fsdp2",
        "actor_rollout_ref.ref.fsdp_config.param_offload": hosting.param_offload,
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile": False,
    }


def _rollout(m: _Mapping) -> dict[str, Any]:
    """`actor_rollout_ref.rollout.*`: the engine, sampling, validation sampling, the agent loop."""
    trainer, hosting, job, cpu, engine = m.cfg.trainer, m.cfg.infra.verl, m.job, m.cpu, m.engine
    return {
        "actor_rollout_ref.rollout.name": engine,
        "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": trainer.samples_per_prompt,
        "actor_rollout_ref.rollout.temperature": trainer.temperature,
        "actor_rollout_ref.rollout.top_p": 1.0,
        "actor_rollout_ref.rollout.top_k": -1,
        "actor_rollout_ref.rollout.dtype": "float32" if m.precision == FP32 else "bfloat16",
        "actor_rollout_ref.rollout.tensor_model_parallel_size": 1 if engine == "hf" else hosting.tensor_parallel,
        "actor_rollout_ref.rollout.data_parallel_size": 1,
        # on cpu vLLM reserves this share of the machine's RAM (its KV cache): a small one (VLLM_CPU_MEMORY_SHARE)
        "actor_rollout_ref.rollout.gpu_memory_utilization": (VLLM_CPU_MEMORY_SHARE if cpu and engine == "vllm"
                                                              else hosting.gpu_memory_utilization),
        "actor_rollout_ref.rollout.enforce_eager": cpu,  # no CUDA graphs to capture on cpu
        # vLLM's context: the run's, not the model's max_position_embeddings (veRL's default when null), whose KV
        # cache may not fit beside the trainer (RAGEN sets it too: config/base.yaml:54)
        "actor_rollout_ref.rollout.max_model_len": trainer.max_context_tokens,
        "actor_rollout_ref.rollout.free_cache_engine": not cpu,
        "actor_rollout_ref.rollout.agent.num_workers": 1 if cpu else max(1, job.nnodes * job.gpus_per_node),
        "actor_rollout_ref.rollout.agent.default_agent_loop": "orch_env",
        "actor_rollout_ref.rollout.val_kwargs.temperature": trainer.val_temperature,
        "actor_rollout_ref.rollout.val_kwargs.n": 1,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
        "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
        "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
    }


def _trainer(m: _Mapping) -> dict[str, Any]:
    """`trainer.*`: the Ray cluster, the run's name, steps, validation, checkpoints and resume."""
    cfg, trainer, job = m.cfg, m.cfg.trainer, m.job
    return {
        "trainer.device": "cpu" if m.cpu else "cuda",
        "trainer.nnodes": job.nnodes,
        "trainer.n_gpus_per_node": job.gpus_per_node,
        "trainer.use_v1": cfg.infra.verl.trainer == "v1",
        "trainer.logger": [],
        "trainer.project_name": cfg.infra.mlflow.experiment_name,
        "trainer.experiment_name": cfg.infra.mlflow.run_name or cfg.digest(),
        "trainer.total_training_steps": trainer.total_steps,
        "trainer.total_epochs": 1,
        "trainer.val_before_train": trainer.val_every > 0 and not job.resume_step,
        "trainer.test_freq": trainer.val_every if trainer.val_every > 0 else -1,
        "trainer.save_freq": trainer.save_every or trainer.total_steps,
        "trainer.resume_mode": "resume_path" if job.resume_step else "disable",
        "trainer.resume_from_path": f"{job.checkpoint_dir}/global_step_{job.resume_step}" if job.resume_step else None,
        "trainer.default_local_dir": job.checkpoint_dir,
        "trainer.balance_batch": True,
        "trainer.critic_warmup": 0,
    }


def _lora(m: _Mapping) -> dict[str, Any]:
    """`actor_rollout_ref.model.lora_*` (LoRA on: `model.lora.rank` > 0; see the module docstring)."""
    lora = m.cfg.model.lora
    return {
        "actor_rollout_ref.model.lora_rank": lora.rank,
        "actor_rollout_ref.model.lora_alpha": lora.alpha,
        "actor_rollout_ref.model.target_modules": lora.target_modules,
    }


def _critic(m: _Mapping) -> dict[str, Any]:
    """`critic.*` (an algorithm with a critic): full-parameter, the actor's engine and batch sizes."""
    model, job, hosting = m.cfg.model, m.job, m.cfg.infra.verl
    return {
        "critic.model.path": job.model_path,
        "critic.model.tokenizer_path": job.tokenizer_path,
        "critic.model.use_remove_padding": False,
        "critic.model.enable_gradient_checkpointing": not m.cpu,
        "critic.strategy": "fsdp2",
        "critic.optim.lr": model.critic_lr,
        "critic.optim.weight_decay": model.weight_decay,
        "critic.optim.clip_grad": model.grad_clip,
        "critic.grad_clip": model.grad_clip,
        "critic.ppo_mini_batch_size": m.prompts_per_mini_batch,
        "critic.ppo_max_token_len_per_gpu": m.token_budget,
        "critic.cliprange_value": m.cfg.algorithm.cliprange_value,
        "critic.fsdp.param_offload": hosting.param_offload,
        "critic.fsdp.optimizer_offload": hosting.param_offload,
        "critic.fsdp.use_torch_compile": False,
    }


def _v1(m: _Mapping) -> dict[str, Any]:
    """`trainer.v1.*`, `transfer_queue.*`: veRL's V1 sync trainer (recipes.verl.v1), orch's sampler and checkpoint
    callback."""
    return {
        "trainer.v1.trainer_mode": "sync",  # the only mode orch runs (docs/verl.md, The V1 trainer: async modes)
        "trainer.v1.sampler.custom_sampler.path": "pkg://recipes.verl.v1",
        "trainer.v1.sampler.custom_sampler.name": "OrchSampler",
        "transfer_queue.enable": True,
        # TransferQueue's storage: one Ray actor per unit (veRL's default 8); on cpu one, on 2 cores every actor
        # costs start-up seconds
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1 if m.cpu else 8,
        # orch's state beside each checkpoint, through veRL's public callback (trainer_base.py:1014,1027)
        "trainer.checkpoint_callback_class": "recipes.verl.v1.OrchCheckpointCallback",
    }


def _added(m: _Mapping) -> dict[str, Any]:
    """Keys veRL's schema has no default for (added with `+`; a None value is left out): attention, mixed precision,
    vLLM's sleep mode, the V1 agent-loop manager."""
    hosting, cpu, precision = m.cfg.infra.verl, m.cpu, m.precision
    added = {
        "actor_rollout_ref.model.override_config.attn_implementation": (
            ("sdpa" if cpu else "flash_attention_2") if hosting.attention == "auto" else hosting.attention),
        "actor_rollout_ref.actor.fsdp_config.mixed_precision": precision,
        "actor_rollout_ref.ref.fsdp_config.mixed_precision": precision,
        # vLLM's CPU platform has no sleep mode (its engine refuses to start with it); the cache is kept instead
        "actor_rollout_ref.rollout.enable_sleep_mode": False if cpu and m.engine == "vllm" else None,
    }
    if m.uses_critic:
        added["critic.model.override_config.attn_implementation"] = added[
            "actor_rollout_ref.model.override_config.attn_implementation"]
        added["critic.fsdp.mixed_precision"] = precision
    if hosting.trainer == "v1":  # the planted-collapse control's marks: veRL's public manager setting (main_ppo.py:111-130)
        added["actor_rollout_ref.rollout.agent.agent_loop_manager_class"] = "recipes.verl.v1.OrchAgentLoopManager"
    return added


def verl_overrides(cfg: TrainConfig, job: VerlJob) -> list[str]:
    """Hydra overrides of veRL's `ppo_trainer` config for `cfg` on `job` (see the module docstring), section by
    section of veRL's config."""
    m = _Mapping(cfg, job)
    overrides = {**_algorithm(m), **_data(m), **_model(m), **_actor(m), **_rollout(m), **_trainer(m)}
    if cfg.model.lora.enabled:
        overrides.update(_lora(m))
    if m.uses_critic:
        overrides.update(_critic(m))
    if cfg.infra.verl.trainer == "v1":
        overrides.update(_v1(m))
    lines = [f"{key}={_value(value)}" for key, value in overrides.items()]
    for key, value in _added(m).items():
        if value is not None:
            lines.append(f"+{key}={value if key.endswith('mixed_precision') else _value(value)}")
    return lines


def verl_config(cfg: TrainConfig, job: VerlJob) -> Any:
    """veRL's `ppo_trainer` config composed with `verl_overrides`, with the run's `TrainConfig` as `orch.train_config`
    (an OmegaConf DictConfig, as veRL's own entry point builds it)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="verl.trainer.config", version_base=None):
            config = compose(config_name="ppo_trainer", overrides=verl_overrides(cfg, job))
    finally:
        GlobalHydra.instance().clear()
    with open_dict(config):
        config.orch = OmegaConf.create({"train_config": cfg.to_tree(), "extra_file": job.extra_file})
    return config


def worker_env(cfg: TrainConfig) -> dict[str, str]:
    """Environment variables every Ray process of the run needs: the CPU platform and one thread per worker on
    cpu; `PYTHONPATH` so that orch (and its `verl.plugins` entry point) imports where this process imports it."""
    env = dict(CPU_ENV) if cfg.trainer.device == "cpu" else {}
    if cfg.infra.verl.trainer == "v1":
        env["TRANSFER_QUEUE_ENABLE"] = "1"  # as veRL's own V1 entry point sets it (main_ppo.py:66-69)
    inherited = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), inherited] if inherited else [str(REPO_ROOT)])
    return env
