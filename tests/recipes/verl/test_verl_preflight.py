"""Preflight of verl cells (issue 27): the memory estimator against cited figures and against real models built at
small scale, the Hugging Face folder check, and `preflight_cell`'s checks (veRL's own validation included)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipes.config.schema import TrainConfig, compose_tree, resolve_tree
from recipes.verl.memory import (
    BUILTIN,
    CHUNK_TEMPORARY_BYTES,
    CHUNKED_ENTROPY_BYTES,
    ENTROPY_BYTES,
    FSDP_TRAIN_BYTES,
    GIB,
    LOGITS_AND_LOGPROB_BYTES,
    Architecture,
    MemorySetup,
    builtin_architecture,
    estimate_memory,
    logit_bytes,
    lora_parameters,
)
from recipes.verl.memory_calibration import CASES, table
from recipes.verl.preflight import preflight_cell

# Parameter counts the model cards print (huggingface.co/Qwen/Qwen2.5-<size>: "Number of Parameters"; Llama 3.2:
# 3.21B in meta-llama/Llama-3.2-3B's card; Qwen2.5-VL-3B: 3.75B, the safetensors total on its card).
PUBLISHED_BILLIONS = {"Qwen2.5-0.5B": 0.49, "Qwen2.5-1.5B": 1.54, "Qwen2.5-3B": 3.09, "Qwen2.5-7B": 7.61,
                      "Qwen2.5-14B": 14.7, "Llama-3.2-3B": 3.21, "Qwen2.5-VL-3B": 3.75, "Qwen2.5-Coder-7B": 7.61}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BILLIONS))
def test_builtin_architectures_have_the_published_parameter_counts(name) -> None:
    assert BUILTIN[name].parameters() / 1e9 == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.01)  # cards round


def _setup(world: int, **kw) -> MemorySetup:
    return MemorySetup(**{"world": world, "gpu_mem_gb": 80.0, "token_budget": 3600, "max_model_len": 3600,
                          "gpu_memory_utilization": 0.3, **kw})


def test_a_7b_full_parameter_run_does_not_fit_one_80gb_gpu_and_fits_four() -> None:
    """The issue's anchor: a 7B full-parameter run without offload does not fit one 80 GB GPU; it fits four (veRL's
    device tuning table lists 2 H800s as the minimum for full-parameter Qwen2-7B GRPO, docs/perf/device_tuning.rst)."""
    arch = BUILTIN["Qwen2.5-7B"]
    one, four = estimate_memory(arch, _setup(1)), estimate_memory(arch, _setup(4))
    assert not one.fits and one.update_gb > 100  # 16 bytes x 7.6B = 113 GiB of state alone
    assert four.fits and four.peak_gb < 80 and four.max_micro_batch >= 1
    assert estimate_memory(arch, _setup(1, offload=True)).rollout_gb < one.rollout_gb  # offload frees the rollout


def test_the_critic_and_a_large_micro_batch_are_what_tips_a_cell_over() -> None:
    arch = BUILTIN["Qwen2.5-3B"]
    grpo = estimate_memory(arch, _setup(2))
    ppo = estimate_memory(arch, _setup(2, critic=True))
    assert ppo.rollout_gb - grpo.rollout_gb == pytest.approx(12 * arch.parameters(value_head=True) / 2 / GIB)
    wide = estimate_memory(arch, _setup(2, critic=True, token_budget=8 * 3600))
    assert not wide.fits and "lower trainer.micro_batch_size to" in wide.problems[0]
    assert estimate_memory(arch, _setup(2, critic=True, token_budget=wide.max_micro_batch * 3600)).fits


def test_vllm_must_hold_one_sequence_after_its_weights() -> None:
    arch = BUILTIN["Qwen2.5-14B"]  # 28 GiB of bf16 weights: more than 0.3 x 80 GB on one GPU
    alone = estimate_memory(arch, _setup(8))
    assert alone.kv_tokens == 0 and any("KV cache" in line for line in alone.problems)
    assert estimate_memory(arch, _setup(8, tensor_parallel=2)).kv_tokens > 3600


def _peak_bytes(tokens: int, vocab: int, entropy: str, grad: bool = True, chunk: int = 256) -> int:
    """The peak of what veRL 0.9.1's own log-prob and entropy functions allocate on bf16 logits of `tokens` x
    `vocab` (the logits included), forward and backward, from PyTorch's CPU memory profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from verl.utils import torch_functional as F

    torch.manual_seed(0)
    source = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=grad)
    labels = torch.randint(0, vocab, (tokens,))
    with torch.set_grad_enabled(grad), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        logits = source * 1.0  # the LM head's fresh bf16 output
        loss = -F.logprobs_from_logits_v2(logits, labels).mean()
        if entropy == "full":
            loss = loss - 0.001 * F.entropy_from_logits(logits).mean()
        elif entropy == "chunked":
            loss = loss - 0.001 * F.entropy_from_logits_with_chunking(logits, chunk_size=chunk).mean()
        if grad:
            loss.backward()
    held = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        held += event.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


def test_logit_bytes_are_what_verls_functions_hold() -> None:
    """The logits term's per-entry figures (recipes/verl/memory.py) measured with veRL's own functions: the
    log-probs alone, with the unchunked entropy, with the chunked entropy (its fp32 chunks kept for the backward
    pass: more than unchunked), and the forward-only passes (where chunking is what helps)."""
    vocab, small, large = 4096, 512, 2048

    def per_entry(entropy: str, grad: bool = True) -> float:  # the slope over tokens: what scales with them
        return (_peak_bytes(large, vocab, entropy, grad) - _peak_bytes(small, vocab, entropy, grad)) / (
            (large - small) * vocab)

    assert per_entry("none") == pytest.approx(LOGITS_AND_LOGPROB_BYTES, abs=0.1)
    assert per_entry("full") == pytest.approx(LOGITS_AND_LOGPROB_BYTES + ENTROPY_BYTES, abs=0.1)
    chunked = _peak_bytes(large, vocab, "chunked") / (large * vocab)
    bound = LOGITS_AND_LOGPROB_BYTES + CHUNKED_ENTROPY_BYTES + CHUNK_TEMPORARY_BYTES * 256 / large
    assert LOGITS_AND_LOGPROB_BYTES + ENTROPY_BYTES < chunked <= bound + 0.1
    assert per_entry("full", grad=False) == pytest.approx(6, abs=0.1)  # forward-only, unchunked
    assert per_entry("chunked", grad=False) == pytest.approx(2, abs=0.1)  # forward-only, chunked: the logits alone


def test_chunked_entropy_counts_only_on_the_remove_padding_path() -> None:
    arch = BUILTIN["Qwen2.5-3B"]
    padded = _setup(2, entropy_chunking=True)
    packed = _setup(2, entropy_chunking=True, remove_padding=True)
    assert logit_bytes(padded) == logit_bytes(_setup(2)) == (12, 0)  # veRL 0.9.1 ignores it there (orch's path)
    assert logit_bytes(packed) == (14, 2048)
    assert logit_bytes(_setup(2, entropy_in_loss=False, fused_cross_entropy=True, remove_padding=True)) == (2, 0)
    assert estimate_memory(arch, packed).update_gb > estimate_memory(arch, _setup(2, remove_padding=True)).update_gb


def test_lora_counts_the_adapter_and_the_frozen_base() -> None:
    """Rank-8 all-linear adapters on Qwen2.5-3B: ~15M parameters (r x (in + out) per linear layer); the state of a
    LoRA run is the adapter's 16 bytes and the base's 4, far below full-parameter training."""
    arch = BUILTIN["Qwen2.5-3B"]
    assert lora_parameters(arch, 0) == 0
    assert lora_parameters(arch, 8) / 1e6 == pytest.approx(14.97, rel=0.01)
    full, lora = estimate_memory(arch, _setup(1)), estimate_memory(arch, _setup(1, lora_rank=8))
    assert lora.terms["actor state in the update (fp32 params, grads, AdamW)"] < 0.3 * full.terms[
        "actor state in the update (fp32 params, grads, AdamW)"]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_calibration_case_is_called_right(case) -> None:
    """recipes/verl/memory_calibration.py: public configurations that ran, or do not fit, on a stated GPU."""
    estimate = case.estimate()
    assert estimate.fits == case.fits, (case.source, estimate.problems)


def test_the_calibration_table_prints_every_case(capsys) -> None:
    lines = table()
    print("\n".join(lines))
    assert len(lines) == len(CASES) and all("[right]" in line for line in lines)


def test_leave_one_out_counts_a_case_only_the_others_margin_would_get_wrong(monkeypatch) -> None:
    """The fit verdict's held-out record (issue 56): a case is right out of sample only when every margin the other
    cases allow still calls it right. On the set as shipped the tightest run (14B on 4 H800, 2.24 GiB of headroom)
    is wrong at the margin the 3B LoRA run (2.31 GiB) allows: 8 of 9, while in sample all 9 are right."""
    from recipes.verl import memory_calibration as mc

    assert mc.leave_one_out() == (8, 9)
    low, high = mc.margin_range()
    assert low < 0 < 2.0 < high < 4.3  # every case right for any margin in this range, the model's 2 GiB inside
    tight = [case for case in CASES if case.name.startswith(("veRL MIN: Qwen2.5-Coder-14B", "RAGEN Sokoban GRPO, "
                                                             "Qwen2.5-3B"))]
    monkeypatch.setattr(mc, "CASES", tuple(tight))
    assert mc.leave_one_out() == (1, 2)  # the 14B run fails held out; the LoRA run, with more headroom, does not
    assert "inferred" in mc.fit_record() and "leave-one-out" in mc.fit_record()


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_parameter_count_and_training_state_equal_a_real_model_built_small(model_type) -> None:
    """Each term checked by building it for real at small scale on CPU: the parameter count of a scaled-down
    Qwen2 / Llama (and its critic) equals transformers' model, and one AdamW step over fp32 parameters holds
    FSDP_TRAIN_BYTES per parameter (parameter, gradient, two moments)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    arch = Architecture("small", hidden=64, intermediate=176, layers=3, heads=4, kv_heads=2, vocab=512, tied=False,
                        max_positions=256, model_type=model_type, qkv_bias=model_type == "qwen2")
    config = AutoConfig.for_model(**{k: v for k, v in arch.config_json().items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == arch.parameters()
    config.num_labels = 1
    critic = AutoModelForTokenClassification.from_config(config)
    assert sum(p.numel() for p in critic.parameters()) == arch.parameters(value_head=True) + 1  # + the head's bias
    optimizer = torch.optim.AdamW(model.parameters())
    model(input_ids=torch.arange(16).unsqueeze(0), labels=torch.arange(16).unsqueeze(0)).loss.backward()
    optimizer.step()
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    held += sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    held += sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
                if torch.is_tensor(t) and t.dim() > 0)
    assert held == FSDP_TRAIN_BYTES * arch.parameters()


def test_architecture_from_a_config_json_and_by_name() -> None:
    arch = Architecture.from_config({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                                     "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                                     "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
                                     "max_position_embeddings": 32768})
    assert arch.parameters() == BUILTIN["Qwen2.5-0.5B"].parameters()
    with pytest.raises(ValueError, match="no positive integer 'num_attention_heads'"):
        Architecture.from_config({"model_type": "qwen2"})
    assert builtin_architecture("models/Qwen2.5-7B-Instruct/") is BUILTIN["Qwen2.5-7B"]
    assert builtin_architecture("models/Qwen2.5-Coder-7B") is BUILTIN["Qwen2.5-Coder-7B"]  # DeepCoder (filters)
    assert builtin_architecture("models/Mistral-7B") is None


# --- the Hugging Face folder check ---------------------------------------------------------------------------------

def _folder(root: Path, arch: Architecture, **files: str) -> Path:
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(arch.config_json()))
    for name, text in {"tokenizer.json": "{}", "model.safetensors": "", **files}.items():
        if text is not None:
            (folder / name).write_text(text)
    return folder


def test_hf_folder_problems_name_what_is_missing(tmp_path) -> None:
    from recipes.runtime.hf_folder import hf_folder_problems

    arch = BUILTIN["Qwen2.5-0.5B"]
    assert hf_folder_problems(tmp_path / "nope")[0].startswith(f"{tmp_path / 'nope'}: no such folder; a Hugging Face "
                                                               "checkpoint folder is expected there")
    folder = _folder(tmp_path, arch)
    assert hf_folder_problems(folder) == []
    (folder / "tokenizer.json").unlink()
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (folder / "model-00001-of-00002.safetensors").write_text("")
    (folder / "config.json").write_text(json.dumps({**arch.config_json(), "architectures": ["NoSuchForCausalLM"]}))
    problems = hf_folder_problems(folder)
    assert len(problems) == 3
    assert "architecture 'NoSuchForCausalLM' is unknown to transformers" in problems[0]
    assert "no tokenizer" in problems[1]
    assert "1 of 2 weight shards missing (model-00002-of-00002.safetensors)" in problems[2]
    from recipes.runtime.hf_folder import missing_files

    assert [missing_files(line) for line in problems] == [False, True, True]  # preflight's needs: files to copy in


# --- preflight_cell --------------------------------------------------------------------------------------------------

def _cell(*overrides: str) -> TrainConfig:
    """A paper-profile verl cell, planned as on a laptop (the model folder need not exist here)."""
    tree, _ = compose_tree(["backend=verl", "trainer=paper", "model=hf", "model.path=models/Qwen2.5-7B",
                            "algorithm=grpo", "task=sokoban", *overrides])
    return TrainConfig.from_tree(resolve_tree(tree))


def test_a_good_cell_passes_every_check_and_needs_only_its_missing_folder() -> None:
    report = preflight_cell(_cell("trainer.micro_batch_size=1"), nodes=1, gpus_per_node=4, gpu_mem_gb=80)
    assert report.problems == []  # the folder only the user can supply is a need, not a problem
    (need,) = report.needs  # printed absolute too, with where a checkpoint comes from
    assert need.startswith(f"model.path: models/Qwen2.5-7B ({Path('models/Qwen2.5-7B').absolute()}): no such folder")
    assert f"hf download Qwen/Qwen2.5-7B --local-dir {Path('models/Qwen2.5-7B').absolute()}" in need
    assert report.architecture_source == "built-in table" and report.prompt_source == "characters"
    assert report.memory is not None and report.memory.fits and report.prompt_tokens > 0


def test_every_start_up_problem_is_named_not_only_the_first() -> None:
    cfg = _cell("verl.tensor_parallel=3", "trainer.max_context_tokens=1000", "trainer.prompts_per_step=3",
                "trainer.samples_per_prompt=1", "filter=none", "algorithm=ppo")
    problems = preflight_cell(cfg, nodes=1, gpus_per_node=4, gpu_mem_gb=80).problems
    text = "\n".join(problems)
    assert "verl.tensor_parallel=3 does not divide the cell's 4 GPUs per node" in text
    assert "does not divide the model's 28 attention heads" in text
    assert "trainer.max_context_tokens=1000 (vLLM's max_model_len) is below the prompt" in text
    assert "3 trajectories do not split evenly over the cell's 4 GPUs" in text
    assert len(problems) == 4, problems  # the missing folder is a need (CellPreflight.needs)


def test_a_setting_verl_rejects_is_reported_with_verls_reason() -> None:
    """veRL's own `validate_config` runs on the cell's config (here a loss aggregation veRL does not know, which
    orch's own config would refuse: set behind its back to reach veRL's check)."""
    cfg = _cell()
    cfg = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"loss_agg_mode": "token-bogus"})})
    problems = preflight_cell(cfg, nodes=1, gpus_per_node=4, gpu_mem_gb=80).problems
    assert any(line.startswith("veRL's validate_config: ") and "token-bogus" in line for line in problems), problems


def test_a_real_folder_is_read_for_its_architecture_and_a_missing_data_file_is_named(tmp_path) -> None:
    from recipes.policy.models import preset_folder

    arch = Architecture("scaled", hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=600,
                        tied=True, max_positions=2048)
    folder = _folder(tmp_path, arch)
    tokenizer = preset_folder(_cell().model.model_copy(update={"path": None}))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer / name).is_file():
            (folder / name).write_text((tokenizer / name).read_text())
    cfg = _cell(f"model.path={folder}", "task=metamathqa", f"task.env.data_path={tmp_path / 'missing.json'}")
    report = preflight_cell(cfg, nodes=1, gpus_per_node=1, gpu_mem_gb=24)
    assert report.architecture_source == "config.json" and report.prompt_source == "tokenizer", report.problems
    assert any(line.startswith("task.env.data_path: ") and "does not exist" in line for line in report.needs)
    assert any("exceeds the model's max_position_embeddings 2048" in line for line in report.problems)
    assert not any(line.startswith("veRL's validate_config") for line in report.problems), report.problems
    assert math.isfinite(report.memory.peak_gb)


PAPER_SWEEPS = ("table4", "table5", "table6", "table7", "topp", "entropy", "kl", "slip", "gradient", "length",
                "filters")


def test_the_paper_sweeps_run_the_cost_anchors_class_on_its_gpus() -> None:
    """recipes/verl/cost.py's anchor (Qwen2.5-3B, RAGEN-2 Table 5) assumes 4 H100s: every paper sweep's Qwen2.5-3B
    cells ask for the same 4 (one GPU count per class across the sweep files)."""
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep
    from recipes.verl.cost import ANCHOR_GPUS

    sweeps = Path(__file__).resolve().parents[3] / "sweeps"
    counts = {}
    for name in PAPER_SWEEPS:
        for cell in build_plan(load_sweep(sweeps / f"{name}.yaml")).cells:
            if str(cell.settings.get("model.path", "")).rstrip("/").endswith("Qwen2.5-3B"):
                counts.setdefault(cell.resources.nodes * cell.resources.gpus_per_node, set()).add(name)
    assert set(counts) == {ANCHOR_GPUS}, counts
