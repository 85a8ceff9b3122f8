"""The TaskRunner of an orch run on veRL: veRL's own set-up (its `BaseTaskRunner` helpers, datasets, resource
pools, workers), with `OrchPPOTrainer` instead of `RayPPOTrainer` (veRL's `TaskRunner` hard-codes its class,
verl/trainer/main_ppo_v0.py) and `OrchActorRolloutRefWorker` (recipes.verl.workers) as the actor's worker. A Ray actor on the head node; `run(config)` returns how the run ended.
"""

from __future__ import annotations

import logging
from typing import Any

import ray


class TaskRunnerBody:
    """What `OrchTaskRunner` runs (a plain class, so that it can be read and tested without Ray)."""

    def run(self, config: Any) -> dict[str, Any]:
        from omegaconf import OmegaConf
        from verl.trainer.main_ppo_v0 import BaseTaskRunner
        from verl.trainer.ppo.ray_trainer import Role
        from verl.trainer.ppo.utils import (
            create_rl_dataset,
            create_rl_sampler,
            need_critic,
            need_reference_policy,
        )
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn

        from recipes.run.progress import setup_logging
        from recipes.verl.trainer import OrchPPOTrainer
        from recipes.verl.workers import OrchActorRolloutRefWorker

        setup_logging()
        logging.getLogger("orch").setLevel(logging.INFO)  # veRL set the root logger to WARNING
        OmegaConf.resolve(config)
        base = BaseTaskRunner()
        _, worker_group_cls = base.add_actor_rollout_worker(config)
        for role in (Role.ActorRollout, Role.ActorRolloutRef):  # veRL's worker + orch's gradient-split method
            if role in base.role_worker_mapping:
                base.role_worker_mapping[role] = ray.remote(OrchActorRolloutRefWorker)
        base.add_critic_worker(config)
        base.add_reward_model_resource_pool(config)
        base.add_teacher_model_resource_pool(config)
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
        model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model.tokenizer, model.processor
        train = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, is_train=True)
        val = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, is_train=False)
        trainer = OrchPPOTrainer(
            config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=base.role_worker_mapping,
            resource_pool_manager=base.init_resource_pool_mgr(config), ray_worker_group_cls=worker_group_cls,
            train_dataset=train, val_dataset=val, collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train),
            orch=OmegaConf.to_container(config.orch.run, resolve=True),
        )
        trainer.init_workers()
        return trainer.fit()


@ray.remote(num_cpus=1)
class OrchTaskRunner(TaskRunnerBody):
    """The Ray actor."""


class TaskRunnerV1Body:
    """The TaskRunner of `verl.trainer: v1`: what veRL's own `TaskRunnerV1.run` does (verl/trainer/main_ppo.py:133-163:
    TransferQueue, the trainer, veRL's `AgentLoopManagerTQ`, fit, TransferQueue closed), with `OrchV1Trainer` and
    the manager `actor_rollout_ref.rollout.agent.agent_loop_manager_class` names (`OrchAgentLoopManager`,
    recipes.verl.v1) and a summary of how the run ended."""

    def run(self, config: Any) -> dict[str, Any]:
        import transfer_queue as tq
        from omegaconf import OmegaConf
        from verl.utils.import_utils import load_class_from_fqn

        from orchlib.errors import OrchError
        from recipes.run.progress import setup_logging
        from recipes.verl.v1 import OrchV1Trainer

        setup_logging()
        logging.getLogger("orch").setLevel(logging.INFO)
        if config.trainer.v1.trainer_mode != "sync":  # async modes train on an older policy's rollouts
            raise OrchError(f"trainer.v1.trainer_mode={config.trainer.v1.trainer_mode}: orch runs veRL's V1 trainer "
                            "in its sync mode only (docs/verl.md, The V1 trainer)")
        config.transfer_queue.enable = True
        OmegaConf.resolve(config)
        tq.init(config.transfer_queue)
        try:
            trainer = OrchV1Trainer(config=config, orch=OmegaConf.to_container(config.orch.run, resolve=True))
            trainer.init()
            # veRL's manager setting, read as veRL's TaskRunnerV1 reads it (main_ppo.py:120-124): orch's manager
            manager_class = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                                "AgentLoopManager")
            manager = manager_class.create(config=config, llm_client=trainer.get_llm_client(),
                                           teacher_client=trainer.get_teacher_client(),
                                           reward_loop_worker_handles=trainer.get_reward_handles())
            return trainer.fit(manager)
        finally:
            tq.close()


@ray.remote(num_cpus=1)
class OrchTaskRunnerV1(TaskRunnerV1Body):
    """The Ray actor."""
