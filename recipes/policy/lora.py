"""LoRA adapters on the policy (`model.lora`, rank > 0), through peft, the way veRL's FSDP engine adds them
(verl/workers/engine/fsdp/transformer_impl.py:339-368 in veRL 0.9.1: `get_peft_model` with a causal-LM `LoraConfig` of
rank, alpha and target modules, no bias).

    wrapped = add_adapters(policy, cfg.model.lora)    # the adapters injected into `policy` in place; `wrapped` is peft's
    with wrapped.disable_adapter(): ...               # the base policy (the KL reference, as veRL's ref-in-actor)
    merged_copy(wrapped)                              # a plain model with the adapters folded into its weights

The trainers keep using the Hugging Face model itself (`wrapped.get_base_model()` is `policy`): peft replaces each
targeted `nn.Linear` by a LoRA layer that holds the frozen base layer and the trainable A, B; every other parameter is
frozen. So the optimiser, the gradient split and the update see only the adapters' parameters.

`target_modules` follows peft's rules for a list (peft/tuners/tuners_utils.py `check_target_module_exists`): a name
matches a module whose dotted name is it or ends with `.<name>`; "all-linear" is every linear layer but the output
head. `unknown_targets` names the listed ones that match no linear layer of the model, from the model's structure alone
(built on the meta device: no weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ALL_LINEAR = "all-linear"
ADAPTER_CONFIG = "adapter_config.json"  # peft's adapter folder: this file and adapter_model.safetensors


def peft_config(lora: Any) -> Any:
    """peft's `LoraConfig` for `lora` (a `recipes.config.schema.LoraSection`: rank, alpha, target_modules)."""
    from peft import LoraConfig, TaskType

    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return LoraConfig(task_type=TaskType.CAUSAL_LM, r=int(lora.rank), lora_alpha=int(lora.alpha),
                      target_modules=targets, bias="none")


def add_adapters(model: torch.nn.Module, lora: Any) -> Any:
    """Inject `lora`'s adapters into `model` in place (its other parameters frozen); returns peft's wrapper
    (`PeftModel`), whose `get_base_model()` is `model`. The adapters' B starts at zero: the wrapped model computes
    exactly what `model` did."""
    from peft import get_peft_model

    return get_peft_model(model, peft_config(lora))


def is_adapted(model: torch.nn.Module) -> bool:
    """Whether `model` carries LoRA layers (injected by `add_adapters`)."""
    from peft.tuners.lora import LoraLayer

    return any(isinstance(module, LoraLayer) for module in model.modules())


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [parameter for parameter in model.parameters() if parameter.requires_grad]


def merged_copy(wrapped: Any) -> torch.nn.Module:
    """A plain Hugging Face model (a deep copy) with the adapters of `wrapped` (a `PeftModel`) folded into its
    weights: W + (alpha / rank) B A. `wrapped` is left as it was."""
    import copy

    return copy.deepcopy(wrapped).merge_and_unload()


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The dotted names of `model`'s linear layers, the output head left out (what "all-linear" adapts)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear) and module is not head]


def unknown_targets(targets: str | list[str], names: list[str]) -> list[str]:
    """The entries of a `target_modules` list that match none of `names` (peft's rule, module docstring)."""
    if isinstance(targets, str):
        return []
    return [target for target in targets if not any(name == target or name.endswith(f".{target}") for name in names)]


def preset_linear_names(preset: dict[str, Any]) -> list[str]:
    """The linear layers of the Qwen2 a text preset builds (`recipes.policy.models.build_preset`: transformers'
    Qwen2ForCausalLM, each decoder layer's attention q, k, v, o and gated MLP gate, up, down; the head left out),
    written out so that validating a config imports no transformers (tests/recipes/torch_trainer/test_lora.py checks
    them against the built model); a vision preset's text model is the same (under `model.language_model`), and its
    vision tower adds Qwen2.5-VL's (`VISION_TOWER_LINEARS`, transformers' names on a model built on the meta device)."""
    text = "model.language_model" if preset.get("vision") else "model"  # Qwen2.5-VL nests its text model
    names = [f"{text}.layers.{layer}.{block}.{name}" for layer in range(int(preset["num_hidden_layers"]))
             for block, name in (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"),
                                 ("self_attn", "o_proj"), ("mlp", "gate_proj"), ("mlp", "up_proj"),
                                 ("mlp", "down_proj"))]
    if preset.get("vision"):
        names += [f"model.visual.{name}" for name in VISION_TOWER_LINEARS]
    return names


# Qwen2.5-VL's vision tower's linear layers (transformers' Qwen2_5_VisionTransformerPretrainedModel: each block's
# attention qkv and proj, its gated MLP, and the patch merger's two-layer MLP), block 0 as their representative.
VISION_TOWER_LINEARS = ("blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.gate_proj", "blocks.0.mlp.up_proj",
                        "blocks.0.mlp.down_proj", "merger.mlp.0", "merger.mlp.2")


def folder_linear_names(folder: Path) -> list[str]:
    """The linear layers of the model in Hugging Face folder `folder` (from its config.json, built on the meta
    device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from recipes.policy.vision import is_vision_folder

    auto = AutoModelForImageTextToText if is_vision_folder(folder) else AutoModelForCausalLM
    with torch.device("meta"):
        return linear_module_names(auto.from_config(AutoConfig.from_pretrained(folder)))


def adapter_parameters(hidden: int, intermediate: int, layers: int, kv_dim: int, rank: int,
                       targets: str | list[str] = ALL_LINEAR) -> int:
    """Parameters of rank-`rank` adapters on a Qwen2/Llama decoder's linear layers (q, k, v, o, gate, up, down, as
    `targets` selects them; "all-linear": every one): rank x (in + out) per adapted layer. 0 when rank is 0.
    For the memory and cost models (trainable parameters = the adapters only)."""
    if rank <= 0:
        return 0
    shapes = {"q_proj": (hidden, hidden), "k_proj": (hidden, kv_dim), "v_proj": (hidden, kv_dim),
              "o_proj": (hidden, hidden), "gate_proj": (hidden, intermediate), "up_proj": (hidden, intermediate),
              "down_proj": (intermediate, hidden)}
    chosen = shapes if targets == ALL_LINEAR else {  # "q_proj" and "self_attn.q_proj" both select q_proj
        name: shape for name, shape in shapes.items()
        if any(target == name or target.endswith(f".{name}") for target in targets)}
    return layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in chosen.values())


# With LoRA the update's backward pass computes the activations' gradients but no frozen weight's: about one
# forward's work instead of two (the adapters' own matmuls are rank/hidden of it), so the update costs about 2/3
# of a full-parameter one. For the cost model.
LORA_UPDATE_COMPUTE = 2 / 3


def update_compute_factor(lora: Any) -> float:
    """The update phase's compute relative to full-parameter training (`LORA_UPDATE_COMPUTE` with LoRA, else 1)."""
    return LORA_UPDATE_COMPUTE if getattr(lora, "rank", 0) > 0 else 1.0
