"""LoRA's parts on the verl backend, without a training run (issue 49 item 2; the end-to-end run is in
test_verl_training.py): the config mapping (RAGEN's keys, config/base.yaml:26-29), veRL's own choice of the reference
(the actor with its adapter disabled), and the hf rollout replica's weight sync as veRL sends it with LoRA: the base
weights under their LoRA-wrapped names once, then the adapter alone with its peft config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from recipes.config.schema import compose_train_config
from tests.recipes.conftest import MICRO


def mapped(overrides: list[str]) -> dict[str, str]:
    from recipes.verl.config_map import VerlJob, verl_overrides

    job = VerlJob(model_path="/m", tokenizer_path="/t", train_file="/d/train.parquet", val_file="/d/val.parquet",
                  checkpoint_dir="/c/verl", prompt_length=256)
    return dict(line.lstrip("+").split("=", 1) for line in verl_overrides(compose_train_config(overrides), job))


def test_lora_maps_to_the_actors_keys_and_veRL_takes_the_reference_from_the_actor() -> None:
    """On the legacy trainer (its task runner, main_ppo_v0, picks the workers)."""
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.trainer.ppo.ray_trainer import Role

    from recipes.verl.config_map import VerlJob, verl_config

    full = mapped([*MICRO, "algorithm=grpo"])
    assert not any("lora" in key or "target_modules" in key for key in full)  # rank 0: veRL's config as before
    lora = mapped([*MICRO, "algorithm=ppo", "model.lora.rank=8", "model.lora.alpha=16",
                   "model.lora.target_modules=[q_proj,v_proj]"])
    assert (lora["actor_rollout_ref.model.lora_rank"], lora["actor_rollout_ref.model.lora_alpha"],
            lora["actor_rollout_ref.model.target_modules"]) == ("8", "16", "['q_proj','v_proj']")
    assert not any(key.startswith("critic.") and "lora" in key for key in lora)  # the critic trains in full
    job = VerlJob(model_path="/m", tokenizer_path="/t", train_file="/d/train.parquet", val_file="/d/val.parquet",
                  checkpoint_dir="/c/verl", prompt_length=256)
    config = verl_config(compose_train_config([*MICRO, "algorithm=grpo", "algorithm.use_kl=true", "backend=verl",
                                               "verl.trainer=legacy", "model.lora.rank=4"]), job)
    assert config.actor_rollout_ref.model.lora_rank == 4 and config.actor_rollout_ref.model.target_modules == \
        "all-linear"
    runner = BaseTaskRunner()
    runner.add_actor_rollout_worker(OmegaConf.create(OmegaConf.to_container(config)))
    # veRL 0.9.1 (main_ppo_v0.py:44-52): with a LoRA rank no reference worker; the KL reference is the actor with
    # its adapter disabled (ray_trainer.py:1272-1276)
    assert Role.ActorRollout in runner.role_worker_mapping and Role.ActorRolloutRef not in runner.role_worker_mapping


def test_the_hf_rollout_server_loads_the_base_then_applies_each_adapter_as_verl_sends_them(micro_folder) -> None:
    from peft.utils.save_and_load import get_peft_model_state_dict
    from verl.utils.fsdp_utils import collect_lora_params, replace_lora_wrapper

    from recipes.policy.lora import add_adapters
    from recipes.policy.models import load_policy
    from recipes.verl.hf_rollout import HFRolloutServer

    server = HFRolloutServer(SimpleNamespace(response_length=8), {"path": str(micro_folder)})
    actor = add_adapters(load_policy(micro_folder, "float32", "cpu"),
                         SimpleNamespace(rank=4, alpha=8, target_modules="all-linear"))
    ids = torch.tensor([[5, 17, 42, 9, 3, 77]])

    def logits(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids).logits

    config = actor.peft_config["default"]
    with torch.no_grad():  # the actor "trained": its base and its adapters moved away from the server's copy
        for name, parameter in actor.named_parameters():
            parameter.add_(0.05 * torch.randn_like(parameter)) if "lora_" in name or "embed" in name else None
    # veRL's first sync (engine_workers.py:793-802; transformer_impl.py:997-1008): base weights, LoRA-wrapped names
    base = {replace_lora_wrapper(key, config): value
            for key, value in collect_lora_params(actor, layered_summon=False, base_sync_done=False).items()}
    assert any(".base_layer." in key for key in base)
    server.update_weights(base, 1, config.to_dict(), base_sync_done=False)
    with actor.disable_adapter():
        torch.testing.assert_close(logits(server.model), logits(actor))  # the base, no adapter yet
    for step in (1, 2):  # then after every update the adapter alone (base_sync_done=True), peft's names
        if step == 2:
            with torch.no_grad():
                for name, parameter in actor.named_parameters():
                    if "lora_B" in name:
                        parameter.mul_(-2.0)
        adapter = collect_lora_params(actor, layered_summon=False, base_sync_done=True)
        assert adapter.keys() == get_peft_model_state_dict(actor).keys() and all("lora_" in k for k in adapter)
        server.update_weights(adapter, step, config.to_dict(), base_sync_done=True)
        torch.testing.assert_close(logits(server.model), logits(actor), atol=1e-5, rtol=1e-5)
    assert server.get_stats()["weight_version"] == 3
    with pytest.raises(RuntimeError, match="adapter weights not loaded"):
        server.update_weights({"base_model.model.nowhere.lora_A.weight": torch.zeros(1)}, 3, config.to_dict())
    generated = server._generate_batch((0.0, 1.0, -1, 4, ()), [[5, 17, 42]])
    assert len(generated[0].token_ids) == len(generated[0].log_probs) > 0


def test_the_lora_keys_reach_the_composed_verl_config_through_hydra(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import app

    shown = CliRunner().invoke(app, ["train", *MICRO, "backend=verl", "algorithm=grpo", "model.lora.rank=4",
                                     "--print-config"])
    assert shown.exit_code == 0, shown.output
    assert "lora_rank: 4" in shown.output and "lora_alpha: 64" in shown.output


def test_preflight_counts_the_adapters_alone_as_trained_and_the_update_cheaper() -> None:
    from recipes.verl.config_map import VerlJob, verl_config
    from recipes.verl.cost import estimate_cost
    from recipes.verl.memory import BUILTIN, MemorySetup, estimate_memory, lora_parameters

    arch = BUILTIN["Qwen2.5-3B"]
    job = VerlJob(model_path="/m", tokenizer_path="/t", train_file="/d/train.parquet", val_file="/d/val.parquet",
                  checkpoint_dir="/c/verl", prompt_length=256, gpus_per_node=1)

    def setup(*lora: str, algorithm: str = "grpo") -> tuple[MemorySetup, object]:
        cfg = compose_train_config(["trainer=paper", f"algorithm={algorithm}", "backend=verl", "trainer.device=cuda",
                                    *lora], host=False)
        return MemorySetup.from_verl(verl_config(cfg, job), world=1, gpu_mem_gb=80, critic=algorithm == "ppo"), cfg

    full, full_cfg = setup()
    lora, lora_cfg = setup("model.lora.rank=8")
    some, _ = setup("model.lora.rank=8", "model.lora.target_modules=[q_proj,v_proj]")
    assert (full.lora_rank, lora.lora_rank, lora.lora_targets, some.lora_targets) == (0, 8, "all-linear",
                                                                                       ["q_proj", "v_proj"])
    # Qwen2.5-3B: 36 layers, hidden 2048, 2 KV heads of 128, intermediate 11008; rank 8 on q and v: 8 x (2048 + 2048
    # + 2048 + 256) per layer
    assert lora_parameters(arch, 8, ["q_proj", "v_proj"]) == 36 * 8 * (2048 + 2048 + 2048 + 256)
    assert lora_parameters(arch, 8) > lora_parameters(arch, 8, ["q_proj", "v_proj"]) > 0
    state = "actor state in the update (fp32 params, grads, AdamW)"
    full_gb, lora_gb = estimate_memory(arch, full).terms[state], estimate_memory(arch, lora).terms[state]
    assert lora_gb < full_gb / 3  # 4 bytes per frozen parameter against 16 per trained one
    ppo, _ = setup("model.lora.rank=8", algorithm="ppo")
    assert ppo.critic_lora_rank == 0  # orch's critic trains in full (recipes/verl/config_map.py)
    critic = "critic state between updates"
    assert estimate_memory(arch, ppo).terms[critic] == pytest.approx(
        estimate_memory(arch, setup(algorithm="ppo")[0]).terms[critic])
    assert estimate_cost(lora_cfg, 3.09e9, 4).step_s < estimate_cost(full_cfg, 3.09e9, 4).step_s
