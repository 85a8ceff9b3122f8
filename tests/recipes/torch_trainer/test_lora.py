"""LoRA on the torch backend (issue 49 item 2, `model.lora`, RAGEN config/base.yaml:19-22): a 2-step run of the micro
model with the filter, the MI diagnostics, the gradient split and the KL reference on moves the adapters' weights and
not one base weight; it exports merged (an ordinary folder whose logits are the adapted policy's) and as the adapter
alone (peft's folder, which gives the same logits on the base); bad `model.lora` keys are one-line errors; the
identity of a config without LoRA is what it was before the keys existed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

from analysis import names
from orchestrator.cli import app
from recipes.config.schema import TrainConfig, compose_train_config
from recipes.run.training import run_training
from recipes.runtime.checkpoint import latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.slow
LORA = ["model.lora.rank=4", "model.lora.alpha=8"]
# The diagnostics tests' brief warm start: the micro model then writes <think> blocks that the MI proxies score.
WARM = ["task=countdown", "model.warm_start.enabled=true", "model.warm_start.demos=8", "model.warm_start.epochs=60",
        "model.warm_start.eval_every=60", "model.warm_start.lr=1e-2", "model.warm_start.batch_size=4",
        "model.warm_start.eval_episodes=2", "model.warm_start.max_response_tokens=16"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, session_dir: Path):
    """GRPO on Countdown (the warm-started micro model) with LoRA rank 4 on every linear layer, top-k filter, MI and
    the gradient split at step 1, the KL loss on (its reference: the policy with the adapters disabled): (config,
    result, checkpoint state, the base model's folder)."""
    from tests.recipes.conftest import MICRO

    work = tmp_path_factory.mktemp("lora")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
        patch.chdir(work)
        cfg = compose_train_config([
            *MICRO, f"mlflow.tracking_uri=sqlite:///{session_dir / 'mlflow.db'}",
            f"trainer.checkpoint_dir={work / 'checkpoints'}", *WARM, *LORA, "algorithm=grpo",
            "algorithm.use_kl=true", "algorithm.kl_coef=0.1", "filter=top_k", "filter.value=0.5",
            "filter.include_zero=true", "hooks=[collapse]", "diagnostics.num_samples=4", "diagnostics.grad_every=1",
            "diagnostics.grad_buckets=2", "trainer.val_every=0", "model.actor_lr=1e-2",
            "trainer.max_response_tokens=64"])
        result = run_training(cfg)
        state = load_checkpoint(latest_checkpoint(work / "checkpoints"))
        from recipes.torch_trainer.warmstart import model_folder

        base, _ = model_folder(cfg)  # cached: the folder the run started from
    return cfg, result, state, base


def test_only_the_adapters_train_and_the_diagnostics_say_so(lora_run) -> None:
    from safetensors.torch import load_file

    cfg, result, state, folder = lora_run
    assert (result.status, result.steps_done) == ("finished", 2), result.reason
    base = load_file(str(folder / "model.safetensors"))
    trained = state["policy"]
    adapters = {key: value for key, value in trained.items() if "lora_" in key}
    assert adapters and all(".lora_A." in k or ".lora_B." in k for k in adapters)
    # every linear layer but the head carries an adapter (all-linear); its B started at zero and moved
    assert sum(".lora_B." in key for key in adapters) == 7  # q k v o gate up down of the one layer
    assert all(adapters[key].abs().max() > 0 for key in adapters if ".lora_B." in key)
    frozen = {key.replace(".base_layer", ""): value for key, value in trained.items() if "lora_" not in key}
    assert set(frozen) - {"lm_head.weight"} == set(base)  # the head is tied to the embedding
    for key, value in base.items():  # not one base weight moved
        assert torch.equal(frozen[key], value), key
    mlflow = MlflowClient(cfg.infra.mlflow.tracking_uri)
    run = mlflow.get_run(result.mlflow_run_id)
    assert run.data.tags["orch.grad_split.parameters"] == "adapter only (LoRA rank 4, all-linear)"
    assert run.data.params["model.lora.rank"] == "4"
    metrics = run.data.metrics
    assert names.MI_ZSCORE_EMA in metrics and names.RETRIEVAL_ACC in metrics
    assert metrics["grad_norm/bucket_0/task"] >= 0 and "rollout/kept_ratio" in metrics
    assert 0 < metrics["setup/trainable_parameters"] < metrics["setup/policy_parameters"] / 4
    # the KL reference is the base (adapters disabled): the policy equals it at step 1 (B = 0), not at step 2
    kl = dict(sorted((m.step, m.value) for m in mlflow.get_metric_history(result.mlflow_run_id, "actor/kl_loss")))
    assert kl[1] == pytest.approx(0.0, abs=1e-7) and kl[2] > 1e-7, kl
    # a resume rebuilds the adapters and takes the checkpoint's policy and optimiser (adapter moments only)
    from recipes.torch_trainer.state import Models

    models = Models(cfg, folder, uses_critic=False)
    models.load_state_dict(state)
    assert len(models.policy_optimizer.state_dict()["state"]) == 14  # A and B of 7 layers


def test_exports_merged_by_default_and_the_adapter_on_request(lora_run, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from recipes.trained.export import load_trained

    cfg, _, _, folder = lora_run
    checkpoint = str(Path(cfg.infra.checkpoint_dir))
    runner = CliRunner()
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    for out, extra in ((merged, []), (adapter, ["--adapter"])):
        outcome = runner.invoke(app, ["export", checkpoint, "--hf", str(out), *extra])
        assert outcome.exit_code == 0, outcome.output
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "model.safetensors").exists()
    assert "folded into these weights" in (merged / "README.md").read_text()
    assert "the adapter alone" in (adapter / "README.md").read_text()
    _, _, wrapped, _ = load_trained(latest_checkpoint(Path(checkpoint)), merge=False)
    ids = torch.tensor([[5, 17, 42, 9, 3, 77]])
    with torch.no_grad():
        expected = wrapped(input_ids=ids).logits
        with wrapped.disable_adapter():
            base_logits = wrapped(input_ids=ids).logits
        from_merged = AutoModelForCausalLM.from_pretrained(merged).eval()(input_ids=ids).logits
        on_base = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder), adapter).eval()
        from_adapter = on_base(input_ids=ids).logits
    assert not torch.allclose(expected, base_logits, atol=1e-5)  # the adapter changed the policy
    torch.testing.assert_close(from_merged, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(from_adapter, expected, atol=1e-5, rtol=1e-5)


def test_adapter_export_of_a_run_without_lora_is_refused(train_overrides, tmp_path) -> None:
    cfg = compose_train_config([*train_overrides, "filter=none", "trainer.total_steps=1", "trainer.val_every=0"])
    assert run_training(cfg).status == "finished"
    outcome = CliRunner().invoke(app, ["export", str(cfg.infra.checkpoint_dir), "--hf", str(tmp_path / "out"),
                                       "--adapter"])
    assert outcome.exit_code == 2 and "trained without LoRA" in outcome.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("override", "message"), [
    ("model.lora.rank=-1", "config key model.lora.rank: must be an integer >= 0"),
    ("model.lora.alpha=0", "config key model.lora.alpha: must be an integer >= 1"),
    ("model.lora.target_modules=[q_proj,qkv_proj]", "config key model.lora.target_modules: ['qkv_proj'] match no "
     "linear layer of the tiny preset"),
    ("model.lora.target_modules=[lm_head]", "['lm_head'] match no linear layer"),
    ("model.lora.target_modules=everything", "must be 'all-linear' or a non-empty list of module names"),
])
def test_bad_lora_keys_are_one_line_errors_with_exit_2(override, message, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    outcome = CliRunner().invoke(app, ["train", "model.lora.rank=4", override, "--print-config"])
    assert outcome.exit_code == 2, outcome.output
    assert message in outcome.output and len(outcome.output.strip().splitlines()) == 1, outcome.output


def test_target_modules_of_a_model_folder_are_checked_against_its_layers(micro_folder) -> None:
    from orchlib.errors import OrchError

    cfg = compose_train_config(["model=hf", f"model.path={micro_folder}", "model.lora.rank=2",
                                "model.lora.target_modules=[self_attn.q_proj,v_proj]"])
    assert cfg.model.lora.target_modules == ["self_attn.q_proj", "v_proj"]
    with pytest.raises(OrchError, match=r"model.lora.target_modules: \['c_attn'\] match no linear layer of "):
        compose_train_config(["model=hf", f"model.path={micro_folder}", "model.lora.rank=2",
                              "model.lora.target_modules=[c_attn]"])


def test_the_identity_of_a_config_without_lora_is_unchanged() -> None:
    cfg = compose_train_config([], host=False)
    tree = cfg.to_tree()
    assert tree["model"]["lora"] == {"rank": 0, "alpha": 64, "target_modules": "all-linear"}  # RAGEN's defaults
    del tree["model"]["lora"]  # a config written before the keys existed (an archived run's config.yaml)
    assert TrainConfig.from_tree(tree).digest() == cfg.digest()
    assert compose_train_config(["model.lora.rank=8"], host=False).digest() != cfg.digest()


def test_preset_linear_names_are_the_built_models(micro_folder) -> None:
    from recipes.policy.lora import linear_module_names, preset_linear_names
    from recipes.policy.models import load_policy

    cfg = compose_train_config([])
    micro = compose_train_config(["model.preset.hidden_size=32", "model.preset.num_hidden_layers=1",
                                  "model.preset.num_attention_heads=2", "model.preset.num_key_value_heads=1",
                                  "model.preset.intermediate_size=64"])
    assert cfg.model.lora.rank == 0
    assert preset_linear_names(micro.model.preset.model_dump()) == linear_module_names(load_policy(micro_folder,
                                                                                                    "float32", "cpu"))
