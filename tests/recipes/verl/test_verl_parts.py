"""The verl backend's parts, without a training run: the plug-in and its guard on veRL's internals, the config
mapping key by key, the filter decision and metric names against the torch backend's, and the Ray cluster."""

from __future__ import annotations

import inspect
import json
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from envs.trajectory import Trajectory, Turn
from orchlib.errors import OrchError
from recipes.config.schema import compose_train_config
from tests.recipes.conftest import MICRO

# Tests of the legacy trainer's internals (OrchPPOTrainer: its `_balance_batch` step, `_update_actor`, stops,
# plants) pin it: `verl.trainer` defaults to v1 (issue #50), whose twins are in test_verl_v1_*.py.
LEGACY = ("backend=verl", "verl.trainer=legacy")


def test_the_plugin_is_a_verl_entry_point_and_registers_on_import() -> None:
    from importlib.metadata import entry_points

    assert [entry.value for entry in entry_points(group="verl.plugins") if entry.name == "orch"] == [
        "recipes.verl.plugin"]
    import verl  # noqa: F401  (loads the plug-in through the entry point)
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    assert _agent_loop_registry["orch_env"]["_target_"] == "recipes.verl.agent_loop.OrchEnvAgentLoop"
    assert _ROLLOUT_REGISTRY[("hf", "async")] == "recipes.verl.hf_rollout.HFServerAdapter"
    assert RolloutReplicaRegistry.get("hf").__name__ == "HFReplica"


def test_the_private_writes_still_fit_verl() -> None:
    """Fails loudly when veRL changes under recipes/verl/patches.py: each private target and the fit loop's order
    that the trainer relies on, as veRL 0.9.1 has them."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils import distributed, model, tracking
    from verl.workers import engine_workers
    from verl.workers.rollout import base

    from recipes.verl.patches import SUPPORTED_VERL, verl_version

    assert verl_version() == SUPPORTED_VERL
    assert isinstance(base._ROLLOUT_REGISTRY, dict)
    for module in (distributed, engine_workers):
        assert list(inspect.signature(module.initialize_global_process_group_ray).parameters) == [
            "timeout_second", "backend"]
    assert list(inspect.signature(model.load_valuehead_model).parameters) == [
        "local_path", "torch_dtype", "model_config", "trust_remote_code"]
    assert "step" in inspect.signature(tracking.Tracking.log).parameters
    from verl.workers.engine.fsdp import transformer_impl

    assert "offload_policy = CPUOffloadPolicy(pin_memory=True)" in inspect.getsource(
        transformer_impl.FSDPEngine._build_fsdp_module)  # P5: looked up in the module at call time
    assert transformer_impl.CPUOffloadPolicy._orch_unpinned  # installed when the engine module was imported
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.plugin.platform import platform_manager  # noqa: F401  (the cpu platform registers on import)
    from verl.utils.device import get_device_name

    assert transformer_impl.CPUOffloadPolicy(pin_memory=True) == CPUOffloadPolicy(
        pin_memory=get_device_name() != "cpu")
    fit = inspect.getsource(RayPPOTrainer.fit)
    assert "from verl.utils.tracking import Tracking" in fit  # imported at call time: the sink can swap it
    order = [fit.index(text) for text in ("self._start_profiling(", "is_last_step =", "self._balance_batch(batch",
                                          "_compute_old_log_prob(batch)", "self._update_critic(batch)",
                                          "self._update_actor(batch)", "self._save_checkpoint()",
                                          "logger.log(data=metrics")]
    assert order == sorted(order)
    for name in ("_balance_batch", "_update_actor", "_update_critic", "_save_checkpoint", "_load_checkpoint",
                 "_validate", "_get_dp_size", "_get_gen_batch"):
        assert callable(getattr(RayPPOTrainer, name))


def test_another_verl_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipes.verl import patches

    monkeypatch.setattr(patches, "verl_version", lambda: "0.10.0")
    with pytest.raises(OrchError, match=r"checked against veRL 0\.9\.1, but veRL 0\.10\.0 is installed"):
        patches.check_version()


def job(**extra):
    from recipes.verl.config_map import VerlJob

    return VerlJob(model_path="/m", tokenizer_path="/t", train_file="/d/train.parquet", val_file="/d/val.parquet",
                   checkpoint_dir="/c/verl", prompt_length=256, **extra)


def mapped(overrides: list[str], verl_job=None) -> dict[str, str]:
    from recipes.verl.config_map import verl_overrides

    cfg = compose_train_config(overrides)
    return dict(line.lstrip("+").split("=", 1) for line in verl_overrides(cfg, verl_job or job()))


def test_config_map_ppo_on_the_papers_setting(micro_folder) -> None:
    lines = mapped(["trainer=paper", "algorithm=ppo", "model=hf", f"model.path={micro_folder}", "task=sokoban"])
    expected = {
        "algorithm.adv_estimator": "'gae'", "algorithm.gamma": "1.0", "algorithm.lam": "1.0",
        "algorithm.use_kl_in_reward": "false",
        "data.train_batch_size": "8", "actor_rollout_ref.rollout.n": "16",
        "data.max_prompt_length": "256", "data.max_response_length": str(3600 - 256),  # RAGEN base.yaml:54
        "actor_rollout_ref.actor.optim.lr": "1e-06", "critic.optim.lr": "1e-05",
        "actor_rollout_ref.actor.clip_ratio_low": "0.2", "actor_rollout_ref.actor.clip_ratio_high": "0.28",
        "actor_rollout_ref.actor.entropy_coeff": "0.001", "actor_rollout_ref.actor.use_kl_loss": "false",
        "actor_rollout_ref.actor.loss_agg_mode": "'token-mean'",
        "actor_rollout_ref.actor.loss_scale_factor": str(400 * 5),
        "actor_rollout_ref.actor.ppo_mini_batch_size": "2",  # 32 trajectories = 2 prompts x 16 samples
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": str(1 * 3600),  # RAGEN base.yaml:12
        "critic.cliprange_value": "0.5",
        "actor_rollout_ref.rollout.name": "'vllm'", "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.rollout.val_kwargs.temperature": "0.5", "actor_rollout_ref.rollout.val_kwargs.n": "1",
        "trainer.total_training_steps": "400", "trainer.test_freq": "10", "trainer.val_before_train": "true",
        "trainer.save_freq": "10", "trainer.resume_mode": "'disable'", "trainer.device": "'cuda'",
        "trainer.default_local_dir": "'/c/verl'", "trainer.logger": "[]", "trainer.use_v1": "true",
        "data.val_batch_size": "512", "actor_rollout_ref.rollout.agent.default_agent_loop": "'orch_env'",
        "actor_rollout_ref.model.override_config.attn_implementation": "'flash_attention_2'",
    }
    assert {key: lines.get(key) for key in expected} == expected


def test_config_map_algorithms_and_cpu() -> None:
    grpo = mapped([*MICRO, "algorithm=grpo"])
    assert grpo["algorithm.adv_estimator"] == "'grpo'" and "critic.model.path" not in grpo
    assert grpo["actor_rollout_ref.actor.loss_agg_mode"] == "'seq-mean-token-mean'"
    assert (grpo["trainer.device"], grpo["actor_rollout_ref.rollout.name"]) == ("'cpu'", "'hf'")
    assert grpo["actor_rollout_ref.actor.fsdp_config.mixed_precision"].startswith("{param_dtype:fp32")
    assert grpo["actor_rollout_ref.model.override_config.attn_implementation"] == "'sdpa'"
    drgrpo = mapped([*MICRO, "algorithm=drgrpo"])
    assert (drgrpo["algorithm.norm_adv_by_std_in_grpo"], drgrpo["actor_rollout_ref.actor.loss_agg_mode"]) == (
        "false", "'seq-mean-token-sum'")  # RAGEN scripts/runs/run_main_table_diff_algo.sh:239
    dapo = mapped([*MICRO, "algorithm=dapo"])  # RAGEN's DAPO: PPO + clip-higher + no KL, :232-233
    assert dapo["algorithm.adv_estimator"] == "'gae'" and "critic.model.path" in dapo
    assert dapo["actor_rollout_ref.actor.use_kl_loss"] == "false"
    kl = mapped([*MICRO, "algorithm=grpo", "algorithm.use_kl=true", "algorithm.kl_penalty=mse"])
    assert (kl["actor_rollout_ref.actor.use_kl_loss"], kl["actor_rollout_ref.actor.kl_loss_type"]) == ("true", "'mse'")
    never_saves = mapped([*MICRO, "trainer.save_every=0", "trainer.total_steps=7"])
    assert never_saves["trainer.save_freq"] == "7"  # veRL then saves the last step only
    resumed = mapped([*MICRO], job(resume_step=3))
    assert (resumed["trainer.resume_mode"], resumed["trainer.resume_from_path"]) == (
        "'resume_path'", "'/c/verl/global_step_3'")
    assert resumed["trainer.val_before_train"] == "false"  # step 0 was logged by the first attempt


def test_verl_config_composes_and_carries_the_train_config() -> None:
    from recipes.verl.config_map import verl_config

    cfg = compose_train_config([*MICRO, "algorithm=ppo", "backend=verl"])
    config = verl_config(cfg, job())
    assert config.algorithm.adv_estimator == "gae" and config.critic.strategy == "fsdp2"
    assert config.orch.train_config.algorithm.name == "ppo" and config.orch.train_config.backend == "verl"


def test_verl_takes_the_gradient_split() -> None:
    cfg = compose_train_config([*MICRO, "backend=verl", "hooks=[collapse]", "diagnostics.grad_every=2"])
    # RAGEN's cadence, agent_trainer.py:1436-1446 at RAGEN 20daedc: steps 1, 1 + N, 1 + 2N
    assert [step for step in range(1, 8) if cfg.diagnostics.grad_due(step)] == [1, 3, 5, 7]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_the_gradient_splits_loss_parts_add_up_to_verls_ppo_loss(mode: str) -> None:
    """The actor workers' split (recipes.verl.workers.loss_terms) against veRL's own `ppo_loss` on one engine
    micro-batch (no padding, as the engine hands it over): task + regularisation is veRL's loss, and the
    regularisation is -entropy_coeff x entropy + kl_loss_coef x KL."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.config.actor import ActorConfig
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    from recipes.verl.workers import loss_terms

    torch.manual_seed(0)
    rows, prompt_len, response_len = 3, 4, 5
    prompt_mask = torch.ones(rows, prompt_len, dtype=torch.long)
    prompt_mask[0, :2] = 0
    response_mask = torch.ones(rows, response_len, dtype=torch.long)
    response_mask[1, 3:], response_mask[2, 1:] = 0, 0
    attention = torch.cat([prompt_mask, response_mask], 1)
    prompts, responses = torch.randint(1, 50, (rows, prompt_len)), torch.randint(1, 50, (rows, response_len))
    data = left_right_2_no_padding(tu.get_tensordict({
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attention, "position_ids": torch.clamp(attention.cumsum(-1) - 1, min=0),
        "response_mask": response_mask, "old_log_probs": -torch.rand(rows, response_len),
        "advantages": torch.randn(rows, response_len), "ref_log_prob": -torch.rand(rows, response_len)}))
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(response_mask.sum()), global_batch_size=rows)
    lengths = attention.sum(1).tolist()
    output = {"log_probs": torch.nested.nested_tensor([-torch.rand(n) for n in lengths], layout=torch.jagged),
              "entropy": torch.nested.nested_tensor([torch.rand(n) for n in lengths], layout=torch.jagged)}
    config = ActorConfig(strategy="fsdp2", rollout_n=1, ppo_mini_batch_size=rows, ppo_micro_batch_size_per_gpu=rows,
                         use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl", entropy_coeff=0.01,
                         loss_agg_mode=mode)
    reference, metrics = ppo_loss(config, output, data)
    terms = loss_terms(config, output, data)
    assert float(terms.pg + terms.regularisation(config)) == pytest.approx(float(reference), abs=1e-6)
    assert float(terms.pg) == pytest.approx(metrics["actor/pg_loss"].aggregate(), abs=1e-6)
    assert float(terms.regularisation(config)) == pytest.approx(
        -0.01 * metrics["actor/entropy_loss"].aggregate() + 0.1 * metrics["kl_loss"].aggregate(), abs=1e-6)


# --- the filter decision and metric names: the same on both backends ------------------------------------------


def trajectories(returns: list[list[float]]) -> list[Trajectory]:
    """Countdown-like one-turn trajectories, one list of returns per prompt."""
    out = []
    for seed, group in enumerate(returns):
        for reward in group:
            messages = [{"role": "system", "content": "s"}, {"role": "user", "content": f"p{seed}"},
                        {"role": "assistant", "content": f"<think> t{seed} </think> <answer> {reward} </answer>"}]
            out.append(Trajectory("countdown", 100 + seed, messages,
                                  [Turn(messages[:2], messages[2]["content"], f" t{seed} ", [], reward, True)],
                                  success=reward > 0))
    return out


def verl_step(cfg, batch_trajectories, rows_multiple: int = 1, setup=None):
    """`OrchPPOTrainer._orch_step` on a DataProto of these trajectories, with no Ray (workers faked); `setup(trainer)`
    runs first."""
    from omegaconf import OmegaConf
    from verl import DataProto

    from recipes.verl.trainer import OrchPPOTrainer

    width = 6
    count = len(batch_trajectories)
    batch = DataProto.from_single_dict({
        "responses": torch.ones(count, width, dtype=torch.long),
        "response_mask": torch.ones(count, width, dtype=torch.long),
        "rm_scores": torch.zeros(count, width),
    })
    batch.non_tensor_batch.update({
        "uid": np.array([f"u{t.seed}" for t in batch_trajectories], dtype=object),
        "orch_trajectory": np.array(batch_trajectories, dtype=object),
        "orch_generated": np.array([{t.turns[0].response: [1, 2, 3]} for t in batch_trajectories], dtype=object),
        "orch_turn_ends": np.array([[width - 1] for _ in batch_trajectories], dtype=object),
        "orch_turn_rewards": np.array([[t.turns[0].reward] for t in batch_trajectories], dtype=object),
    })
    trainer = object.__new__(OrchPPOTrainer)
    trainer.cfg, trainer.hooks, trainer.validation, trainer.encoder = cfg, {}, {}, None
    trainer.empty_steps, trainer.global_steps, trainer.pending_stop, trainer.use_critic = 0, 1, None, False
    trainer.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": cfg.trainer.samples_per_prompt},
                                                             "actor": {"ppo_mini_batch_size": rows_multiple}}})
    trainer.tracker = SimpleNamespace(log_frame=lambda *args: None)
    trainer._get_dp_size, trainer.actor_rollout_wg = (lambda *args: 1), None
    trainer.orch, trainer.loader_state = {"stop_file": "/nonexistent/STOP"}, None
    if setup is not None:
        setup(trainer)
    metrics: dict = {}
    trainer._orch_step(batch, metrics)
    return batch, trainer, metrics


def test_dynamic_sampling_runs_the_shared_rule(monkeypatch) -> None:
    """`OrchPPOTrainer._dynamic_sampling` is `recipes.stats.dynamic_sampling.gather_groups` on DataProtos (the
    extra generation batches stubbed): the shared scenario's groups, rows and metrics
    (tests/recipes/stats/test_dynamic_sampling.py), the batches it needs generated and no more, the replicas woken
    for each and put back to sleep."""
    from verl import DataProto

    import recipes.verl.data
    import recipes.verl.trainer as legacy
    from tests.recipes.stats import test_dynamic_sampling as shared

    def proto(groups: dict[str, list[float]]) -> DataProto:
        keys, returns = shared.rows(groups)
        batch = DataProto.from_single_dict({"responses": torch.arange(len(keys)).unsqueeze(1)})
        batch.non_tensor_batch.update({
            "uid": np.array(keys, dtype=object),
            "orch_trajectory": np.array([SimpleNamespace(episode_return=r) for r in returns], dtype=object)})
        return batch

    generated, replicas = [], []

    def extra_prompt_batch(trainer, step, extra):
        assert step == 4 and replicas[-1] == "awake"
        generated.append(extra)
        return proto(shared.SCENARIO[extra])

    monkeypatch.setattr(recipes.verl.data, "extra_prompt_batch", extra_prompt_batch)
    monkeypatch.setattr(legacy, "place_turn_rewards", lambda batch: None)
    trainer = object.__new__(legacy.OrchPPOTrainer)
    trainer.global_steps, trainer.step_metrics = 4, {shared.GEN_BATCHES: 1.0}
    trainer.cfg = SimpleNamespace(trainer=SimpleNamespace(prompts_per_step=shared.PROMPTS),
                                  algorithm=SimpleNamespace(max_extra_gen_batches=shared.MAX_EXTRA))
    trainer.checkpoint_manager = SimpleNamespace(wake_up_replicas=lambda: replicas.append("awake"),
                                                 sleep_replicas=lambda: replicas.append("asleep"))
    batch = proto(shared.SCENARIO[0])
    trainer._dynamic_sampling(batch)
    assert generated == [1, 2] and replicas == ["awake", "asleep"] * 2
    assert list(dict.fromkeys(batch.non_tensor_batch["uid"])) == shared.UPDATE_GROUPS
    assert [t.episode_return for t in batch.non_tensor_batch["orch_trajectory"]] == shared.UPDATE_RETURNS
    assert len(batch.batch["responses"]) == len(shared.UPDATE_RETURNS) and trainer.step_metrics == shared.METRICS


@pytest.mark.parametrize("filter_settings", [["filter=top_p"], ["filter=top_k", "filter.value=0.5"],
                                             ["filter=trajectory", "filter.value=1"], ["filter=none"]])
def test_the_same_batch_gives_the_same_filter_decision_on_both_backends(filter_settings) -> None:
    from recipes.stats import filtering
    from recipes.stats.rollout_stats import rollout_metrics

    cfg = compose_train_config([*MICRO, *LEGACY, "trainer.samples_per_prompt=4", *filter_settings])
    batch_trajectories = trajectories([[0, 1, 0, 1], [0, 0, 0, 0], [1, 0.1, 0.1, 0], [0.1, 0.1, 0.1, 1]])
    returns = np.array([t.episode_return for t in batch_trajectories])
    keep, scale, filter_metrics = filtering.filter_step(returns, np.array([t.seed for t in batch_trajectories]),
                                                        cfg.filter, cfg.trainer.samples_per_prompt)  # torch backend
    batch, trainer, metrics = verl_step(cfg, batch_trajectories)
    kept = [t for t, k in zip(batch_trajectories, keep, strict=True) if k]
    assert list(batch.non_tensor_batch["orch_trajectory"]) == kept
    assert trainer.advantage_scale == scale
    torch_names = set(filter_metrics) | set(rollout_metrics(batch_trajectories, {}, 16))
    assert torch_names <= set(metrics)
    assert {key: metrics[key] for key in filter_metrics} == filter_metrics
    # each turn's reward sits on its reply's last token, as the torch backend puts it
    assert batch.batch["rm_scores"][:, -1].tolist() == pytest.approx([t.episode_return for t in kept])


def test_a_shrunk_batch_is_padded_to_whole_mini_batches_with_noop_rows() -> None:
    cfg = compose_train_config([*MICRO, *LEGACY, "trainer.samples_per_prompt=2", "filter=top_k",
                                "filter.value=0.25", "filter.include_zero=true"])
    batch, trainer, metrics = verl_step(cfg, trajectories([[0, 1], [0, 0.5], [1, 1], [0, 0]]), rows_multiple=2)
    assert len(batch) == 4 and metrics["rollout/update_trajectories"] == 2 and metrics["rollout/pad_trajectories"] == 2
    assert batch.batch["response_mask"][2:].sum() == 0 and batch.batch["rm_scores"][2:].abs().sum() == 0


def test_an_empty_filter_skips_the_update_and_counts_towards_the_stop() -> None:
    cfg = compose_train_config([*MICRO, *LEGACY, "trainer.samples_per_prompt=2", "filter=top_p",
                                "trainer.max_empty_steps=1"])
    batch, trainer, metrics = verl_step(cfg, trajectories([[0, 0], [1, 1]]))
    assert trainer.skip_update and metrics["rollout/empty_steps"] == 1.0
    assert trainer.pending_stop is not None and trainer.pending_stop.status == "stopped"


def test_max_empty_steps_0_never_stops() -> None:
    """RAGEN's DeepCoder runs set rollout_filter_empty_stop_steps=0: skip empty steps, never stop on them
    (ragen/trainer/agent_trainer.py:1144; docs/experiment_deepcoder.md:104)."""
    cfg = compose_train_config([*MICRO, *LEGACY, "trainer.samples_per_prompt=2", "filter=top_p",
                                "trainer.max_empty_steps=0"])
    batch, trainer, metrics = verl_step(cfg, trajectories([[0, 0], [1, 1]]))
    assert trainer.skip_update and metrics["rollout/empty_steps"] == 1.0 and trainer.pending_stop is None


class CountingHook:
    """A step hook with state (as the collapse monitor's EMA): counts the rollouts it saw; optionally requests a stop
    (creates the stop file) while it runs, as a signal arriving during the diagnostics would."""

    def __init__(self, stop_file: Path | None = None) -> None:
        self.seen, self.stop_file = 0, stop_file

    def on_rollout(self, ctx) -> dict:
        self.seen += 1
        if self.stop_file is not None:
            self.stop_file.touch()
        return {}

    def state_dict(self) -> dict:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"]


def stop_setup(stop_file: Path, saves: list, checkpointed: int | None, hook: CountingHook):
    """A trainer at step 3 whose last step's end is `step_end` (step 2, dataloader at position 2), with `hook`."""

    def setup(trainer) -> None:
        trainer.orch, trainer.hooks = {"stop_file": str(stop_file)}, {"counting": hook}
        trainer.global_steps, trainer.empty_steps, trainer.validation = 3, 1, {"val/success": 0.9}
        trainer.step_end = {"step": 2, "loader": {"position": 2}, "empty_steps": 0, "validation": {"val/success": 0.5},
                            "hooks": {"counting": {"seen": 2}}}
        trainer._checkpointed_step = lambda: checkpointed
        trainer._save_checkpoint = lambda: saves.append((int(trainer.global_steps), trainer.loader_state))

    return setup


@pytest.mark.parametrize("phase", ["rollout", "diagnostics"])
def test_a_stop_inside_a_step_drops_it_rewinds_to_the_last_step_and_checkpoints_that(phase, tmp_path) -> None:
    """Issue 26 item 2 on veRL: a stop file present after the rollout (the agent loops ended their episodes early)
    or appearing during the diagnostics ends the step before its update: `Stop("preempted")` naming the phase, the
    step count, empty steps, validation and hook states back at the previous step's end, and that step checkpointed
    with the dataloader's position of then (the resumed run draws the dropped step's prompts again)."""
    from recipes.verl.trainer import Stop

    cfg = compose_train_config([*MICRO, *LEGACY, "trainer.samples_per_prompt=2", "filter=none"])
    stop_file, saves = tmp_path / "STOP", []
    hook = CountingHook(stop_file if phase == "diagnostics" else None)
    if phase == "rollout":
        stop_file.touch()
    with pytest.raises(Stop) as stopped:
        verl_step(cfg, trajectories([[0, 1], [1, 1]]), setup=stop_setup(stop_file, saves, None, hook))
    assert (stopped.value.status, stopped.value.reason) == (
        "preempted", f"stop requested during the {phase} of step 3; checkpoint at step 2")
    assert saves == [(2, {"position": 2})] and hook.seen == 2


def test_a_stop_before_the_update_with_the_last_step_checkpointed_saves_nothing_more(tmp_path) -> None:
    from recipes.verl.trainer import OrchPPOTrainer, Stop

    stop_file, saves = tmp_path / "STOP", []
    trainer = object.__new__(OrchPPOTrainer)
    trainer.use_critic, trainer.skip_update = False, False
    stop_setup(stop_file, saves, 2, CountingHook())(trainer)
    stop_file.touch()
    with pytest.raises(Stop, match="during the log-prob and reference passes of step 3; checkpoint at step 2"):
        trainer._update_actor(None)
    assert saves == [] and trainer.global_steps == 2 and trainer.validation == {"val/success": 0.5}
    trainer.use_critic, trainer.global_steps = True, 3
    with pytest.raises(Stop, match="during the log-prob, reference and value passes of step 3"):
        trainer._update_critic(None)


def test_a_rewound_checkpoint_saves_the_dataloader_position_of_its_own_step(tmp_path, monkeypatch) -> None:
    """`_save_checkpoint` after a rewind: veRL writes the dataloader's current position (one batch past the step);
    orch replaces it with the saved one, once."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from recipes.runtime.time_limit import TimeLimit
    from recipes.verl.trainer import OrchPPOTrainer

    def verl_save(self) -> None:
        folder = tmp_path / f"global_step_{self.global_steps}"
        folder.mkdir()
        torch.save({"position": 3}, folder / "data.pt")

    monkeypatch.setattr(RayPPOTrainer, "_save_checkpoint", verl_save)
    trainer = object.__new__(OrchPPOTrainer)
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)}})
    trainer.global_steps, trainer.loader_state, trainer.empty_steps, trainer.validation = 2, {"position": 2}, 0, {}
    trainer.validation_pending = False
    trainer.tracker, trainer.hooks = SimpleNamespace(run_id="r"), {}
    trainer.time_limit = TimeLimit(None)
    trainer._save_checkpoint()
    assert torch.load(tmp_path / "global_step_2" / "data.pt") == {"position": 2} and trainer.loader_state is None


def test_naive_cross_scoring_through_the_workers_scores_each_distinct_pair_once_and_maps_rows_and_columns_back(
        ) -> None:
    """The MI diagnostics' reference scoring on veRL (`diagnostics.method=naive`): repeated prompts and samples are
    sent once, and every (sample, column) cell gets the score of its own pair (a stand-in for the actor workers
    scores a pair by its token ids)."""
    from recipes.verl.trainer import OrchPPOTrainer

    sent: list[tuple[list[int], list[int]]] = []

    def score_pairs(pairs):
        sent.extend(pairs)
        return [[0.01 * sum(prompt) + token for token in sample] for prompt, sample in pairs]

    trainer = SimpleNamespace(score_pairs=score_pairs, cfg=SimpleNamespace(diagnostics=SimpleNamespace(method="naive")),
                              _stop_inside_step=lambda phase: None)
    prompts = [[1, 2], [3], [1, 2], [4, 5, 6]]
    samples = [[7], [8, 9], [7], [10]]
    scores = OrchPPOTrainer.cross_score(trainer, prompts, samples)
    assert len(sent) == 3 * 3 and len({(tuple(p), tuple(z)) for p, z in sent}) == 9  # 3 distinct prompts x 3 samples
    expected = np.array([[sum(0.01 * sum(p) + t for t in z) for p in prompts] for z in samples])
    np.testing.assert_allclose(scores.L_sum, expected)
    np.testing.assert_allclose(scores.L, expected / np.array([[len(z)] for z in samples]))


def micro_lm() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, attn_implementation="sdpa"))


def scoring_job() -> tuple[list[list[int]], list[list[int]]]:
    """Six prompts (five distinct: one repeated, one extending another) and six samples (one repeated, one a single
    token)."""
    prompts = [[5, 6, 7, 8], [5, 6, 7, 8, 9, 10], [11, 12], [5, 6, 7, 8], [13, 14, 15], [16, 17, 18, 19, 20, 21, 22]]
    samples = [[30, 31, 32], [33], [34, 35, 36, 37, 38], [30, 31, 32], [2, 3], [1, 2, 3, 4, 5, 6, 7]]
    return prompts, samples


def test_prefix_cross_scoring_through_the_workers_equals_the_naive_scores_over_any_number_of_ranks() -> None:
    """`diagnostics.method=prefix` on veRL: the driver sends the sorted distinct prompts to every rank, each scores
    its block (`recipes.verl.workers.block_scores`, here run rank by rank in this process on a plain model) and the
    columns come back in place: equal to the reference N x M scores, whatever the rank count (3 ranks: blocks of 2, 2
    and 1 + a filler; 7: more ranks than prompts, two blocks all filler)."""
    from recipes.stats.cross_scoring import cross_score
    from recipes.verl.trainer import OrchPPOTrainer
    from recipes.verl.workers import block_scores, prompt_block

    model = micro_lm()
    prompts, samples = scoring_job()
    reference = cross_score(model, prompts, samples, method="naive")
    for world in (1, 3, 7):
        calls = []

        def orch_cross_score(sorted_prompts, distinct_samples, batch_size, pad_id, stop_file, world=world,
                             calls=calls):
            calls.append(sorted_prompts)
            return [block_scores(model, sorted_prompts, distinct_samples, rank, world, batch_size, pad_id)
                    for rank in range(world)]

        trainer = SimpleNamespace(
            actor_rollout_wg=SimpleNamespace(orch_cross_score=orch_cross_score), tokenizer=SimpleNamespace(pad_token_id=0),
            cfg=SimpleNamespace(diagnostics=SimpleNamespace(method="prefix", batch_size=2)), orch={"stop_file": None})
        scores = OrchPPOTrainer.cross_score(trainer, prompts, samples)
        assert calls == [sorted(list(p) for p in {tuple(p) for p in prompts})]  # distinct, sorted, one call
        np.testing.assert_allclose(scores.L_sum, reference.L_sum, atol=1e-4)
        np.testing.assert_allclose(scores.L, reference.L, atol=1e-4)
        blocks = [prompt_block(calls[0], rank, world) for rank in range(world)]
        assert len({len(block) for block, _ in blocks}) == 1  # every rank runs as many forwards
        assert sum(real for _, real in blocks) == 5 and all(len(p) == 1 for b, r in blocks for p in b[r:])


def test_ranks_that_stopped_their_scoring_end_the_step_as_a_stop_during_the_diagnostics(tmp_path) -> None:
    """The workers return None when the stop file appeared mid-scoring: the driver drops the step there."""
    from recipes.verl.trainer import OrchPPOTrainer, Stop

    stop_file, saves = tmp_path / "STOP", []
    trainer = object.__new__(OrchPPOTrainer)
    stop_setup(stop_file, saves, 2, CountingHook())(trainer)
    trainer.cfg = SimpleNamespace(diagnostics=SimpleNamespace(method="prefix", batch_size=2))
    trainer.tokenizer = SimpleNamespace(pad_token_id=0)

    def orch_cross_score(prompts, samples, batch_size, pad_id, stop):
        assert stop == str(stop_file)  # the workers poll the run's own stop file
        stop_file.touch()
        return [None, None]

    trainer.actor_rollout_wg = SimpleNamespace(orch_cross_score=orch_cross_score)
    with pytest.raises(Stop, match="during the diagnostics of step 3; checkpoint at step 2"):
        trainer.cross_score([[1, 2], [3]], [[4], [5, 6]])


def test_prefix_cross_scoring_runs_on_fsdp2_shards_in_lockstep_and_equals_the_naive_scores(tmp_path: Path) -> None:
    """The worker method's scoring for real on an FSDP2-sharded model over gloo ranks whose prompt blocks hold
    different prompts (the job's five distinct prompts over three ranks: blocks of 2, 2 and 1 + a filler;
    tests/recipes/verl/fsdp_scoring_rank.py is one rank): no rank waits forever on another's parameter gather, and
    the joined columns equal the unsharded naive scores; a stop seen by one rank stops all three together."""
    import subprocess
    import sys

    from recipes.stats.cross_scoring import cross_score

    model = micro_lm()
    model.save_pretrained(tmp_path / "model")
    prompts, samples = scoring_job()
    distinct = sorted(list(p) for p in {tuple(p) for p in prompts})
    (tmp_path / "job.json").write_text(json.dumps({"prompts": distinct, "samples": samples}))
    reference = cross_score(model, distinct, samples, method="naive").L_sum
    script = Path(__file__).with_name("fsdp_scoring_rank.py")
    (tmp_path / "STOP").touch()
    # three ranks (more than cores: the filler's rank must still keep step), then the same with only rank 0 seeing
    # a stop file: the ranks agree on it at the same forward (collective_stop) and all stop, none waits forever
    for world, stops in ((3, None), (3, ["STOP", "none", "none"])):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        ranks = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "model"), str(tmp_path / "job.json"),
                                   str(rank), str(world), str(port), str(tmp_path / f"{rank}.json"),
                                   *([str(tmp_path / stops[rank])] if stops else [])])
                 for rank in range(world)]
        try:
            assert [rank.wait(timeout=300) for rank in ranks] == [0] * world  # a rank left waiting: a timeout
        finally:
            for rank in ranks:
                rank.kill()
        blocks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(world)]
        if stops:
            assert blocks == [None] * world
        else:
            np.testing.assert_allclose(np.concatenate([np.array(b) for b in blocks], axis=1), reference, atol=1e-4)


# --- the Ray cluster -------------------------------------------------------------------------------------------


def test_a_two_node_ray_cluster_assembles_and_is_torn_down() -> None:
    """The multi-node path for real on one machine: a head and a second `ray start` joining it (the launcher that
    is `srun` in a SLURM allocation is empty here)."""
    import ray

    from recipes.verl.cluster import ClusterPlan, ray_cluster

    host = socket.gethostname()
    plan = ClusterPlan(nodes=(host, host), gpus_per_node=1, logical_gpus=True, join_timeout_s=120)
    with ray_cluster(plan) as address:
        assert ":" in address
        assert len([node for node in ray.nodes() if node["Alive"]]) == 2
        assert ray.cluster_resources()["GPU"] == 2
    assert not ray.is_initialized()


def test_a_node_that_never_joins_is_named(tmp_path: Path) -> None:
    from recipes.verl.cluster import ClusterPlan, ray_cluster

    plan = ClusterPlan(nodes=(socket.gethostname(), "node-that-never-joins"), gpus_per_node=1, logical_gpus=True,
                       join_timeout_s=5, launcher=("false",))
    with pytest.raises(OrchError, match="1 of 2 nodes joined within 5 s.*missing: node-that-never-joins"), \
            ray_cluster(plan):
        pass


def test_a_ray_head_that_exits_is_named_at_once_with_its_last_words(tmp_path: Path, monkeypatch) -> None:
    """A head that cannot start fails the run when it exits, not after the join timeout (here 300 s)."""
    import sys
    import time

    from recipes.verl.cluster import ClusterPlan, ray_cluster

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text("#!/bin/sh\necho 'starting' >&2\necho 'ray: the port is taken' >&2\nexit 3\n")
    (fake / "ray").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake / "python"))  # the cluster starts the `ray` beside the interpreter
    plan = ClusterPlan(nodes=(socket.gethostname(), "other"), gpus_per_node=1, logical_gpus=True,
                       join_timeout_s=300, launcher=("false",))
    started = time.monotonic()
    with pytest.raises(OrchError, match=r"the Ray head on .* exited with code 3: ray: the port is taken$"), \
            ray_cluster(plan):
        pass
    assert time.monotonic() - started < 60


FAKE_HEAD = """#!{python}
import os, pathlib, signal, sys
status = dict(line.split(":", 1) for line in pathlib.Path("/proc/self/status").read_text().splitlines())
mark = pathlib.Path(os.environ["ORCH_TEST_RAY_MARK"])
mark.with_suffix(".tmp").write_text(" ".join(str(int(status[key], 16)) for key in ("SigIgn", "SigBlk")))
mark.with_suffix(".tmp").rename(mark)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # as Ray's node does: the teardown's SIGTERM ends it
signal.pause()  # never answers on the head's port
"""


def send_when(event, number: int) -> threading.Thread:
    """A thread that sends this process `number` the moment `event()` is true (the window the test means)."""
    import os
    import time

    def watch() -> None:
        deadline = time.monotonic() + 300
        while not event() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), number)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_stop_while_the_multi_node_head_starts_is_honoured_at_once_and_the_head_ignores_it(tmp_path: Path,
                                                                                             monkeypatch) -> None:
    """Issue 60: the multi-node start set the stop signals to *ignored* in the driver itself while `ray start --head`
    started (up to HEAD_START_S, 120 s), so a SIGUSR2 or SIGTERM then was lost. Now they are ignored in the head alone
    (and not blocked: `ray start --block` tears its node down on SIGTERM, through a handler of its own) and the driver
    keeps its handlers: a SIGUSR2 sent the moment the head exists is recorded by the run's stop handler and ends the
    start at once with StopRequested (before: 120 s, then "did not start")."""
    import signal
    import sys
    import time

    from recipes.runtime.stop import StopRequest, StopRequested
    from recipes.verl.cluster import HEAD_START_S, ClusterPlan, ray_cluster

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text(FAKE_HEAD.format(python=sys.executable))
    (fake / "ray").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake / "python"))  # the cluster starts the `ray` beside the interpreter
    mark = tmp_path / "head-started"
    plan = ClusterPlan(nodes=(socket.gethostname(), "other"), gpus_per_node=1, logical_gpus=True,
                       join_timeout_s=5, launcher=("false",), env={"ORCH_TEST_RAY_MARK": str(mark)})
    with StopRequest() as stop:
        send_when(mark.exists, signal.SIGUSR2)
        started = time.monotonic()
        with pytest.raises(StopRequested, match="while the Ray head started; nothing to keep"), \
                ray_cluster(plan, stop):
            pass
        took = time.monotonic() - started
    assert stop.signal_name == "SIGUSR2"  # recorded by the run's own handler, not dropped
    assert took < HEAD_START_S / 2, took  # acted on at once, not after the head's start-up window
    ignored, blocked = map(int, mark.read_text().split())
    for number in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        assert ignored & (1 << (number - 1)), f"the head started with {number!r} not ignored"
        assert not blocked & (1 << (number - 1)), f"the head started with {number!r} blocked"


@pytest.mark.slow
def test_a_stop_while_the_nodes_join_ends_the_wait_at_once() -> None:
    """Issue 60: a stop during the join of a multi-node cell was recorded but acted on only after the join (up to
    verl.ray_join_timeout_s). A real Ray head here, a second node that never joins (the launcher fails), a SIGUSR2 the
    moment the driver is connected: the wait ends at once with StopRequested, and the cluster is torn down."""
    import signal

    import ray

    from recipes.runtime.stop import StopRequest, StopRequested
    from recipes.verl.cluster import ClusterPlan, ray_cluster

    plan = ClusterPlan(nodes=(socket.gethostname(), "node-that-never-joins"), gpus_per_node=1, logical_gpus=True,
                       join_timeout_s=600, launcher=("false",))
    with StopRequest() as stop:
        send_when(ray.is_initialized, signal.SIGUSR2)
        with pytest.raises(StopRequested, match="while the Ray nodes joined; nothing to keep"), \
                ray_cluster(plan, stop):
            pass  # without the poll: 600 s, then "1 of 2 nodes joined"
    assert stop.signal_name == "SIGUSR2" and not ray.is_initialized()


REAL_RAY_MARKED = """#!/bin/sh
# the real `ray`, after a mark that its process exists (a real head or node starts from here)
touch "$ORCH_TEST_RAY_MARK.$$"
exec {ray} "$@"
"""

DELAYED_NODE = ("import os, sys, time\n"
                "time.sleep(float(os.environ['ORCH_TEST_JOIN_DELAY_S']))\n"
                "os.execvp(sys.argv[1], sys.argv[1:])\n")


def ray_node_processes() -> dict[int, str]:
    """The Ray node processes on this machine (a node's GCS server and raylet), pid -> name."""
    import psutil

    found = {}
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        words = " ".join(process.info["cmdline"] or [])
        if process.info["name"] in ("gcs_server", "raylet") or "gcs_server" in words.split(" ", 1)[0] \
                or words.split(" ", 1)[0].endswith("/raylet"):
            found[process.info["pid"]] = process.info["name"]
    return found


def gone_within(pids: set[int], seconds: float) -> set[int]:
    """Those of `pids` still alive after `seconds`."""
    import time

    import psutil

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = {pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}
        if not alive:
            return set()
        time.sleep(0.5)
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("when", ["head", "join"])
def test_a_stop_during_a_real_multi_node_start_is_honoured_at_once_and_leaves_no_node(tmp_path: Path, monkeypatch,
                                                                                       when: str) -> None:
    """Issue 60 item 6: a second Ray node started on this machine for real stands in for a worker node (its own
    `ray start --address`, its own ports; its launcher -- `srun` in an allocation -- delays its start by 5 s, as a
    loaded worker node would, so that it is starting or joining when the stop lands). A SIGUSR2 the moment the real head's `ray start` exists (`head`), or the moment the
    driver is connected and the second node is on its way (`join`), is recorded by the run's stop handler and ends
    the start at its next poll with StopRequested; the teardown leaves no GCS server or raylet of either node."""
    import signal
    import sys
    import time

    import ray

    from recipes.runtime.stop import StopRequest, StopRequested
    from recipes.verl.cluster import ClusterPlan, ray_cluster

    real = Path(sys.executable).with_name("ray")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ray").write_text(REAL_RAY_MARKED.format(ray=real))
    (fake / "ray").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake / "python"))  # the cluster starts the `ray` beside the interpreter
    mark = tmp_path / "started"
    host = socket.gethostname()
    plan = ClusterPlan(nodes=(host, host), gpus_per_node=1, logical_gpus=True, join_timeout_s=600,
                       launcher=(real.with_name("python").as_posix(), "-c", DELAYED_NODE),
                       env={"ORCH_TEST_RAY_MARK": str(mark), "ORCH_TEST_JOIN_DELAY_S": "5"})
    before = set(ray_node_processes())
    started_nodes = lambda: len(list(tmp_path.glob("started.*")))  # noqa: E731
    event = (lambda: started_nodes() >= 1) if when == "head" else ray.is_initialized
    sent = []
    with StopRequest() as stop:
        send_when(lambda: event() and not sent.append(time.monotonic()), signal.SIGUSR2)
        where = "the Ray head started" if when == "head" else "the Ray nodes joined"
        with pytest.raises(StopRequested, match=f"while {where}; nothing to keep"), ray_cluster(plan, stop):
            pass  # without the poll: the head's start-up window (120 s) or the join timeout (600 s)
        took = time.monotonic() - sent[0]
    assert stop.signal_name == "SIGUSR2" and not ray.is_initialized()
    # from the signal to the end of the teardown: a poll (0.5 s) and the nodes' ends; a head stopped in its first
    # moments, SIGTERM still ignored, took 30 s before `_end` killed it at once (recipes/verl/cluster.py)
    assert took < 15, took
    left = gone_within(set(ray_node_processes()) - before, 30)
    assert not left, f"Ray node processes left after the teardown: {left}"
    if when == "head":
        assert started_nodes() == 1  # the second node is launched only once the head answers


# --- image observations: the agent loop's vision path (no Ray, no GPU: a scripted server) ----------------------

def vision_tokenizer():
    from recipes.policy.models import protocol_corpus
    from recipes.policy.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(protocol_corpus(4), 600)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|vision_start|>", "<|vision_end|>",
                                                                "<|image_pad|>"]})
    return tokenizer


def vision_processor(tokenizer):
    """What the agent loop reads of a Qwen2.5-VL processor: its image token, tokenizer and (real) image processor.
    (transformers builds the whole processor only with torchvision, which this CPU machine cannot load.)"""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16, patch_size=14,
                                               merge_size=2, temporal_patch_size=2)
    return SimpleNamespace(image_token="<|image_pad|>", tokenizer=tokenizer, image_processor=image_processor)


def test_image_tokens_expand_each_frame_to_its_features_outside_the_loss() -> None:
    from recipes.policy.chat import EncodedChat
    from recipes.policy.vision import ImageTokens

    tokenizer = vision_tokenizer()
    vision = ImageTokens.from_processor(vision_processor(tokenizer))
    assert vision.markup == "<|vision_start|><|image_pad|><|vision_end|>"
    pad = vision.pad_id
    chat = EncodedChat(input_ids=[1, pad, 2, 7, 8, 3, pad, 4, 9], loss_mask=[0, 0, 0, 1, 1, 0, 0, 0, 1],
                       turn_ends=[4, 8])
    out = vision.expand(chat, [3, 2])
    assert out.input_ids == [1, pad, pad, pad, 2, 7, 8, 3, pad, pad, 4, 9]
    assert out.loss_mask == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1] and out.turn_ends == [6, 11]
    frame = np.zeros((60, 60, 3), dtype=np.uint8)
    assert vision.feature_counts([frame]) == [int(vision.image_processor(images=[frame], return_tensors="pt")[
        "image_grid_thw"][0].prod()) // 4]


def vl_checkpoint(tmp_path: Path) -> list[str]:
    (tmp_path / "config.json").write_text(json.dumps({  # what the config's host checks look for
        "vision_config": {}, "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"]}))
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model.safetensors").write_text("")
    return ["model=hf", f"model.path={tmp_path}"]


def test_the_agent_loop_shows_every_frame_as_image_tokens_never_in_the_loss(tmp_path: Path) -> None:
    """Sokoban with image observations through `orch_env`: every generation call gets the frames shown so far and a
    prompt with one run of image pad tokens per frame (as many as the vision tower's features); the episode's output
    carries the frames as veRL's multi-modal data, its image tokens out of the loss and its replies in it."""
    import asyncio

    from verl.workers.rollout.replica import TokenOutput

    from recipes.policy.vision import ImageTokens
    from recipes.verl.agent_loop import OrchEnvAgentLoop
    from recipes.verl.config_map import verl_config

    cfg = compose_train_config([*MICRO, *vl_checkpoint(tmp_path), "backend=verl", "task=sokoban",
                                "trainer.device=cuda", "task.env.observation=image"])
    tokenizer = vision_tokenizer()
    processor = vision_processor(tokenizer)
    vision = ImageTokens.from_processor(processor)
    reply = tokenizer("<think>push</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
    calls = []

    class Server:
        async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
            calls.append((list(prompt_ids), list(image_data or [])))
            return TokenOutput(token_ids=[*reply, tokenizer.convert_tokens_to_ids("<|im_end|>")],
                               log_probs=[-0.5] * (len(reply) + 1))

    loop = OrchEnvAgentLoop.__new__(OrchEnvAgentLoop)  # veRL's constructor needs a running worker; set its fields
    loop.config = verl_config(cfg, job())
    loop.rollout_config = loop.config.actor_rollout_ref.rollout
    loop.server_manager, loop.tokenizer, loop.processor = Server(), tokenizer, processor
    out = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"seed": 3}))
    trajectory = out.extra_fields["orch_trajectory"]
    assert len(calls) == trajectory.num_turns >= 2
    for turn, (prompt, images) in enumerate(calls, start=1):
        assert len(images) == turn  # every frame so far, in chat order
        assert prompt.count(vision.pad_id) == sum(vision.feature_counts(images))
    frames = out.multi_modal_data["images"]
    assert len(frames) == len(trajectory.images) == len(trajectory.turns)  # one per user turn: none after the end
    sequence = out.prompt_ids + out.response_ids
    mask = [0] * len(out.prompt_ids) + out.response_mask
    assert sequence.count(vision.pad_id) == sum(vision.feature_counts(frames))
    assert all(m == 0 for token, m in zip(sequence, mask, strict=True) if token == vision.pad_id)
    assert sum(out.response_mask) == len(calls) * (len(reply) + 1)  # the replies, end-of-turn included
    assert np.array_equal(np.asarray(frames[0]), trajectory.images[0])


def test_image_observations_on_verl_are_refused_where_they_cannot_run(tmp_path: Path) -> None:
    image = [*MICRO, *vl_checkpoint(tmp_path), "backend=verl", "task=sokoban", "task.env.observation=image"]
    with pytest.raises(OrchError, match="config key task.env.observation: image observations on the verl backend "
                                        "need vLLM rollouts"):
        compose_train_config(image)
    with pytest.raises(OrchError, match="config key task.env.observation: image observations on the verl backend"):
        compose_train_config([*image, "trainer.device=cuda", "verl.rollout=hf"])
    with pytest.raises(OrchError, match="config key hooks: the MI diagnostics cross-score text prompts"):
        compose_train_config([*image, "trainer.device=cuda", "hooks=[collapse]"])
    cfg = compose_train_config([*image, "trainer.device=cuda", "hooks=[collapse]", "diagnostics.mi_every=0",
                                "diagnostics.grad_every=5"])
    assert cfg.rollout_engine() == "vllm"


def test_a_blinded_episode_asks_every_turn_from_the_fixed_chat_and_keeps_its_own(tmp_path: Path) -> None:
    """Issue 29 item 1 on veRL (`control.blind_from_step`): a row carrying `blind_seed` (the trainer marks the step's
    training rows with the seed of its first episode) generates every turn's reply from that episode's first-turn
    chat and frame -- exactly the prompt an unblinded episode at that seed is first asked -- while its own trajectory
    keeps its real, different messages and plays on (as the torch backend's BlindSampler)."""
    import asyncio

    from verl.workers.rollout.replica import TokenOutput

    from recipes.verl.agent_loop import OrchEnvAgentLoop
    from recipes.verl.config_map import verl_config

    cfg = compose_train_config([*MICRO, *vl_checkpoint(tmp_path), "backend=verl", "task=sokoban",
                                "trainer.device=cuda", "task.env.observation=image"])
    tokenizer = vision_tokenizer()
    reply = tokenizer("<think>push</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
    calls = []

    class Server:
        async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
            calls.append((list(prompt_ids), [np.asarray(image) for image in image_data or []]))
            return TokenOutput(token_ids=[*reply, tokenizer.convert_tokens_to_ids("<|im_end|>")],
                               log_probs=[-0.5] * (len(reply) + 1))

    loop = OrchEnvAgentLoop.__new__(OrchEnvAgentLoop)
    loop.config = verl_config(cfg, job())
    loop.rollout_config = loop.config.actor_rollout_ref.rollout
    loop.server_manager, loop.tokenizer, loop.processor = Server(), tokenizer, vision_processor(tokenizer)
    fixed = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"seed": 7}))
    first_prompt, first_images = calls[0]
    calls.clear()
    out = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"seed": 3, "blind_seed": 7}))
    trajectory = out.extra_fields["orch_trajectory"]
    assert len(calls) == trajectory.num_turns >= 2
    for prompt, images in calls:
        assert prompt == first_prompt and len(images) == 1 and np.array_equal(images[0], first_images[0])
    own = trajectory.images[0]  # this episode's real first board (the turn's text is the same on every board)
    assert not np.array_equal(own, fixed.extra_fields["orch_trajectory"].images[0])
    assert np.array_equal(np.asarray(out.multi_modal_data["images"][0]), own)  # what is trained on is its own


def test_the_trainer_blinds_a_steps_training_rows_to_its_first_episode_from_the_planted_step() -> None:
    """`control.blind_from_step=3` on veRL: from step 3 on, inside a step, every training row of the generation batch
    carries the seed of the step's first episode (`blind_seed`, read by the agent loop); earlier steps, validation
    rows and veRL's validation before training are not blinded."""
    from verl import DataProto

    from recipes.verl.trainer import OrchPPOTrainer

    trainer = object.__new__(OrchPPOTrainer)
    trainer.cfg = compose_train_config([*MICRO, *LEGACY, "control.blind_from_step=3"])

    def blinded(step: int, in_step: bool, split: str) -> list:
        infos = np.array([{"seed": seed, "split": split} for seed in (11, 12, 13)], dtype=object)
        batch = DataProto.from_single_dict({"input_ids": torch.zeros(3, 2, dtype=torch.long), "extra_info": infos})
        trainer.global_steps, trainer._in_step = step, in_step
        return [info.get("blind_seed") for info in trainer._get_gen_batch(batch).non_tensor_batch["extra_info"]]

    assert blinded(3, True, "train") == blinded(7, True, "train") == [11, 11, 11]
    assert blinded(2, True, "train") == blinded(3, False, "train") == blinded(3, True, "val") == [None] * 3


@pytest.mark.parametrize("strength", [0.0, 0.25, 0.5, 1.0])
def test_a_graded_plant_on_verl_blinds_exactly_the_rows_the_shared_rule_picks(strength: float) -> None:
    """`control.blind_strength` on veRL (#46 item 1): `_get_gen_batch` marks prompts, veRL then repeats each n times
    (a prompt's rows share its `extra_info`), and the agent loop (`_blind_seed`, by the row number veRL gives each
    trajectory) blinds exactly the trajectory rows `recipes.runtime.seeds.blinded_rows` picks -- the torch backend's
    rows -- with the step's first seed; at strength 1 the marks are the total plant's as before (`blind_seed` only)."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from recipes.runtime.seeds import blinded_rows
    from recipes.verl.agent_loop import _blind_seed
    from recipes.verl.trainer import OrchPPOTrainer

    # what the rows rest on, as veRL 0.9.1 has it: the prompt batch is repeated interleaved after `_get_gen_batch`,
    # the manager numbers the repeated rows 0.. (`priority`) before splitting them, and a worker passes every
    # non-tensor column to the agent loop
    fit = inspect.getsource(RayPPOTrainer.fit)
    assert fit.index("self._get_gen_batch(batch)") < fit.index("gen_batch.repeat(repeat_times=rollout_n, interleave=True)")
    assert 'prompts.non_tensor_batch["priority"] = np.arange(len(prompts)' in inspect.getsource(
        AgentLoopManager.generate_sequences)
    assert "kwargs = {k: v[i] for k, v in batch.non_tensor_batch.items()" in inspect.getsource(
        AgentLoopWorker.generate_sequences)

    prompts, samples, step = 4, 4, 11
    trainer = object.__new__(OrchPPOTrainer)
    trainer.cfg = compose_train_config([*MICRO, *LEGACY, "seed=2", "control.blind_from_step=3",
                                        f"control.blind_strength={strength}", f"trainer.samples_per_prompt={samples}",
                                        f"trainer.prompts_per_step={prompts}"])
    trainer.global_steps, trainer._in_step = step, True
    infos = np.array([{"seed": seed, "split": "train"} for seed in range(21, 21 + prompts)], dtype=object)
    batch = DataProto.from_single_dict({"input_ids": torch.zeros(prompts, 2, dtype=torch.long), "extra_info": infos})
    gen = trainer._get_gen_batch(batch).repeat(repeat_times=samples, interleave=True)  # as veRL's fit does
    rows = [{**{key: column[row] for key, column in gen.non_tensor_batch.items()}, "priority": row}
            for row in range(len(gen))]
    chosen = blinded_rows(prompts * samples, strength, 2, step)
    assert len(chosen) == round(strength * prompts * samples)
    assert [_blind_seed(row) for row in rows] == [21 if row in chosen else None for row in range(prompts * samples)]
    if strength == 1.0:
        assert all(set(row["extra_info"]) == {"seed", "split", "blind_seed"} for row in rows)


@pytest.mark.parametrize("split", ["train", "val", "unstopped"])
def test_an_episode_ends_after_its_turn_once_the_stop_file_exists(split: str, tmp_path: Path) -> None:
    """Issue 26 item 2 on veRL: the stop file appearing during a turn's generation ends a training or validation
    episode after that turn (the trainer then drops the step or the validation), so a rollout or a validation of long
    multi-turn episodes stops within one turn; unstopped, the same episode plays on."""
    import asyncio

    from omegaconf import OmegaConf
    from verl.workers.rollout.replica import TokenOutput

    from recipes.verl.agent_loop import OrchEnvAgentLoop
    from recipes.verl.config_map import verl_config

    cfg = compose_train_config([*MICRO, *vl_checkpoint(tmp_path), "backend=verl", "task=sokoban",
                                "trainer.device=cuda", "task.env.observation=image"])
    tokenizer = vision_tokenizer()
    reply = tokenizer("<think>push</think><answer>Up</answer>", add_special_tokens=False)["input_ids"]
    stop_file, calls = tmp_path / "STOP", []

    class Server:
        async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, **kwargs):
            calls.append(1)
            if split != "unstopped":
                stop_file.touch()  # the signal arrives while the first turn is generated
            return TokenOutput(token_ids=[*reply, tokenizer.convert_tokens_to_ids("<|im_end|>")],
                               log_probs=[-0.5] * (len(reply) + 1))

    loop = OrchEnvAgentLoop.__new__(OrchEnvAgentLoop)
    loop.config = verl_config(cfg, job())
    OmegaConf.update(loop.config, "orch.run", {"stop_file": str(stop_file)}, force_add=True)
    loop.rollout_config = loop.config.actor_rollout_ref.rollout
    loop.server_manager, loop.tokenizer, loop.processor = Server(), tokenizer, vision_processor(tokenizer)
    played = "train" if split == "unstopped" else split
    out = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"seed": 3, "split": played}))
    trajectory = out.extra_fields["orch_trajectory"]
    if split == "unstopped":
        assert len(calls) == trajectory.num_turns >= 2
    else:
        assert len(calls) == trajectory.num_turns == 1


def test_a_stop_during_validation_drops_it_and_inside_a_step_lets_the_step_end(tmp_path: Path) -> None:
    """Issue 26 item 2 on veRL: a validation whose episodes a stop cut short is not kept. Inside a step (after its
    update) it returns no metrics and marks itself pending, so the step ends, `_stop_profiling` checkpoints it and
    the resume runs the validation first (the end-to-end figure: `benchmarks/bench_stop.py --backend verl`); veRL's
    validation before training ends the run at once, naming the checkpoint it resumes from."""
    from recipes.verl.trainer import OrchPPOTrainer, Stop

    trainer = object.__new__(OrchPPOTrainer)
    trainer.validation, trainer.global_steps, trainer.validation_pending = {"val/success": 0.5}, 4, False
    trainer._in_step = True
    assert trainer._validation_stopped() == {} and trainer.validation == {"val/success": 0.5}
    assert trainer.validation_pending
    trainer._in_step = False
    with pytest.raises(Stop, match="during the validation before training; checkpoint at step 4") as stopped:
        trainer._validation_stopped()
    assert stopped.value.status == "preempted"
    trainer.global_steps = 0
    with pytest.raises(Stop, match="before training; no step done, nothing to checkpoint"):
        trainer._validation_stopped()


def test_the_time_limit_stops_the_verl_trainer_before_a_step_that_would_overrun_it(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """Issue 45 item 2 (a stop the veRL backend ignored): `trainer.time_limit` is read at every step's end as on the
    torch backend, counted from the driver's start (`spent_s`): while the next step and a checkpoint fit, the run
    goes on; once they would not, the step is checkpointed and the run ends `preempted` naming the limit."""
    import time
    import types

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from recipes.runtime.time_limit import TimeLimit
    from recipes.verl.trainer import OrchPPOTrainer

    monkeypatch.setattr(RayPPOTrainer, "_stop_profiling", lambda self, do_profile, run_command=False: None)
    trainer = object.__new__(OrchPPOTrainer)
    saves: list[int] = []
    trainer.orch, trainer.pending_stop, trainer.validation_pending = {"stop_file": str(tmp_path / "STOP")}, None, False
    trainer._checkpointed_step, trainer._save_checkpoint = lambda: None, lambda: saves.append(trainer.global_steps)
    trainer.resume_point = lambda: {}
    trainer.tracker = types.SimpleNamespace(store_down=False)  # the tracking store writable (2620596 reads it here)
    trainer.time_limit = TimeLimit(60.0, spent_s=30.0)  # the driver used 30 s of the 60 s budget
    trainer.global_steps, trainer._step_started = 1, time.perf_counter() - 10  # a 10 s step: 10 x 1.5 + 5 fits
    trainer._stop_profiling(False)
    assert trainer.pending_stop is None and saves == []
    trainer.global_steps, trainer._step_started = 2, time.perf_counter() - 20  # a 20 s step: no longer fits
    trainer._stop_profiling(False)
    assert trainer.pending_stop.status == "preempted" and saves == [2]
    assert trainer.pending_stop.reason.startswith("time limit: ") and "trainer.time_limit=60" in str(
        trainer.pending_stop.reason) and trainer.pending_stop.reason.endswith("checkpoint at step 2")
    assert TimeLimit(None, spent_s=30.0).would_overrun() is None  # no limit: never


def test_ray_init_keeps_the_jobs_stop_handler_and_a_sigterm_during_it_becomes_a_stop(monkeypatch) -> None:
    """Issue 45 item 2: `ray.init` installs its own SIGTERM handler (`sys.exit(15)`) and leaves it: a preemption
    during or after Ray's start ended the job with exit 15, no checkpoint and no line (a multi-node cell kept Ray's
    handler for the whole run). The job's handler comes back after the start; a SIGTERM caught by Ray's meanwhile
    is handed to the job's handler and ends the start with `StopRequested`."""
    import os
    import signal
    import sys
    import time

    import ray

    from recipes.runtime.stop import StopRequested
    from recipes.verl.cluster import _init_keeping_handlers

    def rays_init(signalled: bool):
        def init(**_options) -> None:
            signal.signal(signal.SIGTERM, lambda number, _frame: sys.exit(number))  # as ray/_private/worker.py
            if signalled:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs at the next bytecode
        return init

    received: list[int] = []

    def job(number, _frame) -> None:
        received.append(number)

    before = signal.signal(signal.SIGTERM, job)
    try:
        monkeypatch.setattr(ray, "init", rays_init(False))
        _init_keeping_handlers(address="local")
        assert signal.getsignal(signal.SIGTERM) is job  # Ray's handler is not left in place
        monkeypatch.setattr(ray, "init", rays_init(True))
        with pytest.raises(StopRequested, match="while Ray started"):
            _init_keeping_handlers(address="local")
        assert received == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is job
    finally:
        signal.signal(signal.SIGTERM, before)
