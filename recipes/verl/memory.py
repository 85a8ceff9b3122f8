"""Per-GPU peak memory of a verl-backend cell, from the model's config.json alone (no weights, no GPU).

    arch = Architecture.from_config(json.loads(Path(folder, "config.json").read_text()))  # or BUILTIN["Qwen2.5-7B"]
    estimate = estimate_memory(arch, MemorySetup(world=4, gpu_mem_gb=80, ...))
    estimate.fits, estimate.peak_gb, estimate.max_micro_batch, estimate.lines()

The model follows veRL 0.9.1's colocated ("hybrid engine") run, the layout `recipes.verl.config_map` configures: the
actor and the critic (PPO, DAPO) are FSDP2 modules sharded over all `world` GPUs, each holding an fp32 master copy
(`model_dtype: fp32`, verl/trainer/config/_generated_ppo_trainer.yaml:37,564; bf16 compute, fp32 gradients,
verl/workers/engine/fsdp/transformer_impl.py:455-457), and one vLLM engine per `tensor_parallel` GPUs shares each GPU
with them. The reference policy is forward-only and always CPU-offloaded by veRL (transformer_impl.py:459-463): only
its gathered layers reach the GPU. Per GPU, the phases that peak:

* **rollout**: vLLM holds `gpu_memory_utilization` of the GPU (its weights, KV cache and activations: vLLM refuses to
  start with less free memory); beside it, unless `verl.param_offload`, the actor's and critic's parameters and AdamW
  moments (12 bytes per parameter, sharded; gradients are freed by `zero_grad`, verl/workers/engine/base.py:126, and
  AdamW's moments exist from the first update on). veRL builds the trainer's models before vLLM
  (verl/trainer/ppo/ray_trainer.py:902) and puts vLLM to sleep (level 2: weights and KV cache freed) after each
  rollout (ray_trainer.py:1514; vllm_async_server.py:1289-1316);
* **actor update** (the larger update): the actor's state with its fp32 gradients (16 bytes per parameter, sharded),
  the critic's resident 12 (unless offloaded: then only the module being trained is on the GPU, base.py:314-336),
  one decoder layer gathered and the next prefetched (bf16), and the activations of one micro-batch of
  `token_budget` tokens: with gradient checkpointing the checkpointed layer inputs plus one layer recomputed, and the
  logits over the vocabulary (`logit_bytes`: what veRL's own log-prob and entropy functions hold per token and
  vocabulary entry through the backward pass, measured on CPU; see below);
* **weight sync** (after the update): vLLM's bf16 weights woken (over `tensor_parallel`), the trainer state still
  resident, veRL's 2 GiB transfer buffer and one full fp32 parameter (the embedding) in flight
  (verl/workers/engine_workers.py:782-823).

**The logits** dominate a long micro-batch (151,936 vocabulary entries per token for Qwen2.5). Per token and entry,
in the update: the bf16 logits (2 bytes); veRL 0.9.1's path without `use_remove_padding` (orch's) concatenates the
unpadded rows into a copy (2, transformer_impl.py:1491-1493); the log-probs keep a bf16 log-softmax for the backward
pass (2; flash-attn's fused cross-entropy instead writes the gradient into the logits in place when no entropy is
computed: 0, torch_functional.py:73-107); the entropy, computed with gradients when `entropy_coeff` is not 0
(ray_trainer.py:1336), keeps its bf16 softmax and its backward temporaries (6 more). **Chunked entropy**
(`entropy_from_logits_with_chunking`, `verl.entropy_chunking`) only takes effect on the remove-padding path
(transformer_impl.py:1397-1404; the padded path at :1478-1482 always calls the unchunked function), and there it
*raises* the update's figure: each 2048-token chunk is upcast to fp32 and its fp32 copy and softmax are kept for the
backward pass (10 instead of 6), plus one chunk's fp32 temporaries (12 bytes per entry). What it lowers is the
forward-only passes (old and reference log-probs, no gradients): one chunk's temporaries instead of 4 bytes per
entry of the whole micro-batch. Those passes hold 4 bytes per parameter less than the update (no gradients) and at
most 8 per logit entry (measured), so the update stays the larger phase and is what is modelled. Every figure above
is measured by `tests/recipes/verl/test_verl_preflight.py::test_logit_bytes_are_what_verls_functions_hold` with
veRL's own functions (PyTorch's CPU memory profiler, bf16 logits).

Two hosting variants of older veRL (the calibration cases' runs, `recipes.verl.memory_calibration`): its legacy FSDP
worker keeps the reference policy's bf16 weights on the GPU unless the reference is offloaded (`ref_resident`), and
with LoRA (`lora_rank` > 0) there is no separate reference (the actor with its adapter disabled) and only the
adapter has gradients and AdamW moments; the frozen base stays in fp32 (veRL's actor `model_dtype`).

vLLM also needs its KV cache, after its weights, to hold one sequence of `max_model_len` tokens, or it refuses to
start. Not modelled: vLLM's CUDA-graph pool and the CUDA contexts beyond `CONTEXT_GB`, Ray's own buffers, and
memory fragmentation beyond that margin.
Every term is in `MemoryEstimate.terms`; docs/verl.md says how each was checked.
GB here are GiB (2**30 bytes), as `nvidia-smi` and PyTorch report them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

GIB = 2**30
FSDP_TRAIN_BYTES = 16  # fp32 parameter + fp32 gradient + two fp32 AdamW moments, per parameter
FSDP_RESIDENT_BYTES = 12  # between updates: fp32 parameter + two AdamW moments (gradients freed)
ROLLOUT_WEIGHT_BYTES = 2  # vLLM's bf16 weights
ACTIVATION_BYTES = 2  # bf16 activations
# Per token and vocabulary entry of one update micro-batch (module docstring; measured on CPU with veRL 0.9.1's own
# logprobs_from_logits_v2 / entropy_from_logits / entropy_from_logits_with_chunking on bf16 logits, forward and
# backward): the logits and the log-probs' saved log-softmax; the entropy's extra, unchunked or chunked; the copy the
# padded path makes.
LOGITS_AND_LOGPROB_BYTES = 4
FUSED_LOGPROB_BYTES = 2  # flash-attn's cross-entropy without entropy: the gradient is written into the logits
ENTROPY_BYTES = 6
CHUNKED_ENTROPY_BYTES = 10
CHUNK_TEMPORARY_BYTES = 12  # one chunk's fp32 copy, softmax and product
UNPAD_COPY_BYTES = 2
LOGIT_BYTES = LOGITS_AND_LOGPROB_BYTES + ENTROPY_BYTES + UNPAD_COPY_BYTES  # orch's configuration: 12
FROZEN_BYTES = 4  # a LoRA run's frozen base: fp32 (veRL's actor model_dtype), no gradients or moments
REFERENCE_BYTES = 2  # the legacy worker's resident reference policy (bf16)
SYNC_BUFFER_GB = 2.0  # veRL's bucketed weight transfer buffer (update_weights_bucket_megabytes: 2048)
CONTEXT_GB = 2.0  # CUDA contexts (trainer and vLLM), NCCL buffers, vLLM's CUDA graphs: a margin, not measured
PREFETCHED_LAYERS = 2  # FSDP2 gathers one decoder layer and prefetches the next


@dataclass(frozen=True)
class Architecture:
    """What the memory of a decoder-only transformer depends on (a Hugging Face config.json's fields)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    max_positions: int
    extra_parameters: int = 0  # a vision tower's, e.g.; trained and sharded with the rest
    model_type: str = "qwen2"  # transformers' model_type (a stand-in config.json for veRL's validation uses it)
    qkv_bias: bool = True  # Qwen2 has biases on q, k and v; Llama has none

    @classmethod
    def from_config(cls, config: dict[str, Any], name: str | None = None) -> Architecture:
        """From a config.json's content (a vision-language model's text part from `text_config` when it has one;
        its vision tower counted from `vision_config`). Raises `ValueError` naming a missing field."""
        text = config.get("text_config") or config
        if not isinstance(text, dict):
            raise ValueError("text_config is not an object")

        def need(key: str) -> int:
            value = text.get(key, config.get(key))
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config.json has no positive integer {key!r}")
            return value

        heads = need("num_attention_heads")
        vision = config.get("vision_config")
        return cls(
            name=name or str((config.get("architectures") or [config.get("model_type", "model")])[0]),
            hidden=need("hidden_size"), intermediate=need("intermediate_size"), layers=need("num_hidden_layers"),
            heads=heads, kv_heads=int(text.get("num_key_value_heads") or heads), vocab=need("vocab_size"),
            tied=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            max_positions=int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or 0),
            extra_parameters=_vision_parameters(vision) if isinstance(vision, dict) else 0,
            model_type=str(config.get("model_type") or "qwen2"),
            qkv_bias=bool(text.get("attention_bias", str(config.get("model_type") or "qwen2").startswith("qwen2"))),
        )

    def config_json(self) -> dict[str, Any]:
        """A text-model config.json with these dimensions (a stand-in where the checkpoint is not on this host; a
        vision-language model stands in as its text part)."""
        model_type = "llama" if self.model_type == "llama" else "qwen2"
        return {"architectures": ["LlamaForCausalLM" if model_type == "llama" else "Qwen2ForCausalLM"],
                "model_type": model_type, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "vocab_size": self.vocab, "tie_word_embeddings": self.tied,
                "max_position_embeddings": self.max_positions or 32768, "torch_dtype": "bfloat16",
                **({} if model_type == "qwen2" else {"attention_bias": self.qkv_bias})}

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_parameters(self) -> int:
        """One decoder layer: attention (q, k, v with biases as Qwen2 has them, o), the gated MLP, two norms."""
        kv = self.kv_heads * self.head_dim
        attention = self.hidden * (self.hidden + 2 * kv) + self.hidden * self.hidden
        if self.qkv_bias:
            attention += self.hidden + 2 * kv
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def parameters(self, value_head: bool = False) -> int:
        """All parameters; `value_head`: the critic's (veRL's token-classification model: no LM head, a scalar
        head per token instead)."""
        embeddings = self.vocab * self.hidden
        head = self.hidden if value_head else (0 if self.tied else self.vocab * self.hidden)
        return embeddings + self.layers * self.layer_parameters() + self.hidden + head + self.extra_parameters

    def kv_bytes_per_token(self) -> int:
        """vLLM's KV cache per token in bf16, all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


def _vision_parameters(vision: dict[str, Any]) -> int:
    """A ViT tower's parameters (Qwen2.5-VL: `hidden_size`, `intermediate_size`, `depth`; a gated MLP), plus its
    merger into the text model's width (`out_hidden_size`)."""
    hidden, inner, depth = (int(vision.get(key) or 0) for key in ("hidden_size", "intermediate_size", "depth"))
    out = int(vision.get("out_hidden_size") or hidden)
    merged = 4 * hidden  # 2 x 2 patches merged
    return depth * (4 * hidden * hidden + 3 * hidden * inner) + merged * merged + merged * out


# The paper's architectures, from their Hugging Face config.json files (so that a laptop without the checkpoints
# gets an estimate; a folder's own config.json wins). Qwen2.5: huggingface.co/Qwen/Qwen2.5-<size>/config.json;
# Llama-3.2-3B-Instruct: huggingface.co/meta-llama/Llama-3.2-3B-Instruct; Qwen2.5-VL-3B-Instruct: its text part
# is Qwen2.5-3B's, its vision tower 32 blocks of 1280 (huggingface.co/Qwen/Qwen2.5-VL-3B-Instruct/config.json).
BUILTIN: dict[str, Architecture] = {
    arch.name: arch for arch in (
        Architecture("Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 151936, True, 32768),
        Architecture("Qwen2.5-1.5B", 1536, 8960, 28, 12, 2, 151936, True, 131072),
        Architecture("Qwen2.5-3B", 2048, 11008, 36, 16, 2, 151936, True, 32768),
        Architecture("Qwen2.5-7B", 3584, 18944, 28, 28, 4, 152064, False, 131072),
        Architecture("Qwen2.5-14B", 5120, 13824, 48, 40, 8, 152064, False, 131072),
        # DeepCoder's model (RAGEN docs/experiment_deepcoder.md:88): Qwen2.5-7B's dimensions, a 32k context
        # (huggingface.co/Qwen/Qwen2.5-Coder-7B/config.json)
        Architecture("Qwen2.5-Coder-7B", 3584, 18944, 28, 28, 4, 152064, False, 32768),
        Architecture("Llama-3.2-3B", 3072, 8192, 28, 24, 8, 128256, True, 131072, model_type="llama",
                     qkv_bias=False),
        Architecture("Qwen2.5-VL-3B", 2048, 11008, 36, 16, 2, 151936, True, 128000,
                     _vision_parameters({"hidden_size": 1280, "intermediate_size": 3420, "depth": 32,
                                         "out_hidden_size": 2048})),
    )
}


def builtin_architecture(path: str) -> Architecture | None:
    """The built-in architecture a model path names (its last folder, e.g. `models/Qwen2.5-7B-Instruct` ->
    Qwen2.5-7B; `-Instruct` shares the base's architecture), or None."""
    leaf = path.rstrip("/").rsplit("/", 1)[-1].lower().removesuffix("-instruct")
    for name, arch in BUILTIN.items():
        if leaf == name.lower():
            return arch
    return None


@dataclass(frozen=True)
class MemorySetup:
    """What a cell's veRL config decides about memory (read from it by `recipes.verl.preflight`)."""

    world: int  # GPUs the FSDP modules are sharded over (nodes x GPUs per node)
    gpu_mem_gb: float  # each GPU's memory
    token_budget: int  # tokens per micro-batch of the update (veRL's ppo_max_token_len_per_gpu)
    max_model_len: int  # prompt + response tokens of one sequence (vLLM's max_model_len)
    critic: bool = False
    offload: bool = False  # verl.param_offload: parameters and optimizer state in CPU memory between phases
    gradient_checkpointing: bool = True
    gpu_memory_utilization: float = 0.6
    tensor_parallel: int = 1
    free_cache_engine: bool = True
    remove_padding: bool = False  # veRL's use_remove_padding (orch: false)
    entropy_in_loss: bool = True  # entropy_coeff != 0 (or calculate_entropy): the entropy is computed with gradients
    entropy_chunking: bool = False  # entropy_from_logits_with_chunking (effective only with remove_padding)
    entropy_chunk_tokens: int = 2048  # entropy_from_logits_chunk_size
    fused_cross_entropy: bool = False  # flash-attn's cross-entropy computes the log-probs (flash-attn installed)
    ref_resident: bool = False  # legacy veRL worker: the reference's bf16 weights stay on the GPU (no ref offload)
    lora_rank: int = 0  # LoRA adapters on every linear layer of the decoder ("all-linear"), 0: full-parameter
    lora_targets: Any = "all-linear"  # or the adapted layers' names (model.lora.target_modules)
    critic_lora_rank: int = 0  # the critic's adapters (orch never sets them: recipes.verl.config_map)

    @classmethod
    def from_verl(cls, config: Any, world: int, gpu_mem_gb: float, critic: bool) -> MemorySetup:
        """What a composed veRL `ppo_trainer` config (recipes.verl.config_map) says about memory on `world` GPUs of
        `gpu_mem_gb`; `critic`: the algorithm trains a critic."""
        actor, rollout, model = (config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout,
                                 config.actor_rollout_ref.model)
        attention = str((model.get("override_config") or {}).get("attn_implementation", ""))
        return cls(
            world=world, gpu_mem_gb=gpu_mem_gb, token_budget=int(actor.ppo_max_token_len_per_gpu),
            max_model_len=int(config.data.max_prompt_length) + int(config.data.max_response_length),
            critic=critic, offload=bool(actor.fsdp_config.param_offload),
            gradient_checkpointing=bool(model.enable_gradient_checkpointing),
            gpu_memory_utilization=float(rollout.gpu_memory_utilization),
            tensor_parallel=int(rollout.tensor_model_parallel_size), free_cache_engine=bool(rollout.free_cache_engine),
            remove_padding=bool(model.use_remove_padding),
            entropy_in_loss=bool(actor.get("calculate_entropy", False)) or float(actor.entropy_coeff) != 0.0,
            entropy_chunking=bool(actor.get("entropy_from_logits_with_chunking", False)),
            entropy_chunk_tokens=int(actor.get("entropy_from_logits_chunk_size", 2048) or 2048),
            fused_cross_entropy=attention == "flash_attention_2",
            lora_rank=int(model.get("lora_rank", 0) or 0), lora_targets=model.get("target_modules", "all-linear"),
            critic_lora_rank=int(config.critic.model.get("lora_rank", 0) or 0) if critic else 0)


def logit_bytes(setup: MemorySetup) -> tuple[int, int]:
    """(bytes per token and vocabulary entry of one update micro-batch, tokens of the one chunk whose fp32
    temporaries (CHUNK_TEMPORARY_BYTES per entry) are live at a time, 0 unchunked) for `setup`'s veRL path (module
    docstring)."""
    per = LOGITS_AND_LOGPROB_BYTES
    if setup.fused_cross_entropy and not setup.entropy_in_loss:
        per = FUSED_LOGPROB_BYTES
    chunk = 0
    if setup.entropy_in_loss:
        if setup.entropy_chunking and setup.remove_padding:
            per += CHUNKED_ENTROPY_BYTES
            chunk = setup.entropy_chunk_tokens
        else:
            per += ENTROPY_BYTES
    if not setup.remove_padding:
        per += UNPAD_COPY_BYTES
    return per, chunk


def lora_parameters(arch: Architecture, rank: int, targets: Any = "all-linear") -> int:
    """Parameters of rank-`rank` LoRA adapters on the decoder's linear layers `targets` selects (q, k, v, o, gate, up,
    down; peft's "all-linear" leaves the LM head out): r x (in + out) each (`recipes.policy.lora.adapter_parameters`)."""
    from recipes.policy.lora import adapter_parameters

    targets = targets if isinstance(targets, str) else list(targets)
    return adapter_parameters(arch.hidden, arch.intermediate, arch.layers, arch.kv_heads * arch.head_dim, rank, targets)


@dataclass
class MemoryEstimate:
    """Per-GPU peaks (GiB) of the two phases, every term, the verdict and the largest micro-batch that fits."""

    rollout_gb: float
    update_gb: float
    gpu_mem_gb: float
    kv_tokens: int  # tokens vLLM's KV cache holds after its weights (at least one max_model_len sequence needed)
    max_micro_batch: int  # sequences of max_model_len per update micro-batch that fit (0: not even one)
    terms: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def peak_gb(self) -> float:
        return max(self.rollout_gb, self.update_gb)

    @property
    def fits(self) -> bool:
        return not self.problems


def _activation_bytes(arch: Architecture, tokens: int, checkpointing: bool, setup: MemorySetup | None = None) -> float:
    """Activations kept for the backward pass of one micro-batch of `tokens` tokens (bf16), and its logits
    (`logit_bytes`; `setup` None: orch's configuration)."""
    kv = arch.kv_heads * arch.head_dim
    # one layer's saved tensors per token: norm outputs, q, k, v, attention output, residuals, gate, up, act, down in
    per_layer = ACTIVATION_BYTES * (6 * arch.hidden + 2 * kv + 4 * arch.intermediate) + 8 * arch.hidden
    if checkpointing:
        layers = tokens * (ACTIVATION_BYTES * arch.hidden * arch.layers + per_layer)
    else:
        layers = tokens * per_layer * arch.layers
    per, chunk = logit_bytes(setup) if setup is not None else (LOGIT_BYTES, 0)
    return layers + tokens * arch.vocab * per + min(tokens, chunk) * arch.vocab * CHUNK_TEMPORARY_BYTES


def estimate_memory(arch: Architecture, setup: MemorySetup) -> MemoryEstimate:
    """The per-GPU peaks of `setup` for `arch` (see the module docstring), the verdict and the largest micro-batch
    (in sequences of `max_model_len` tokens) whose update fits."""
    policy, critic = arch.parameters(), arch.parameters(value_head=True)
    world, tp, mem = max(1, setup.world), max(1, setup.tensor_parallel), setup.gpu_mem_gb
    vllm = setup.gpu_memory_utilization * mem
    adapter = lora_parameters(arch, setup.lora_rank, setup.lora_targets)
    critic_adapter = lora_parameters(arch, setup.critic_lora_rank, setup.lora_targets)

    def state(parameters: int, trained: int, adapter: int = adapter) -> float:  # GiB per GPU: fp32 params, grads
        frozen = (parameters - adapter) * FROZEN_BYTES if adapter else 0  # and AdamW of what trains
        return ((adapter or parameters) * trained + frozen) / world / GIB

    reference = REFERENCE_BYTES * policy / world / GIB if setup.ref_resident and not adapter else 0.0
    terms = {
        "actor state in the update (fp32 params, grads, AdamW)": state(policy, FSDP_TRAIN_BYTES),
        "actor state between updates": 0.0 if setup.offload else state(policy, FSDP_RESIDENT_BYTES),
        "critic state between updates": (0.0 if setup.offload or not setup.critic
                                         else state(critic, FSDP_RESIDENT_BYTES, critic_adapter)),
        "reference policy (legacy worker, bf16)": reference,
        "vLLM (gpu_memory_utilization)": vllm,
        "vLLM weights (bf16, over tensor_parallel)": ROLLOUT_WEIGHT_BYTES * policy / tp / GIB,
        "gathered layers (bf16)": PREFETCHED_LAYERS * arch.layer_parameters() * ACTIVATION_BYTES / GIB,
        "activations + logits of a micro-batch": _activation_bytes(arch, setup.token_budget,
                                                                   setup.gradient_checkpointing, setup) / GIB,
        "weight sync buffer + one fp32 tensor": SYNC_BUFFER_GB + 4 * arch.vocab * arch.hidden / GIB,
        "CUDA contexts, NCCL, CUDA graphs (margin)": CONTEXT_GB,
    }
    resident = terms["actor state between updates"] + terms["critic state between updates"] + reference
    rollout = resident + vllm + CONTEXT_GB
    asleep = 0.0 if setup.free_cache_engine else vllm
    fixed = (terms["actor state in the update (fp32 params, grads, AdamW)"] + terms["critic state between updates"]
             + reference + asleep + terms["gathered layers (bf16)"] + CONTEXT_GB)
    update = fixed + terms["activations + logits of a micro-batch"]
    sync = (resident + terms["vLLM weights (bf16, over tensor_parallel)"]
            + terms["weight sync buffer + one fp32 tensor"] + CONTEXT_GB)
    weights = ROLLOUT_WEIGHT_BYTES * policy / tp
    kv_tokens = int(max(0.0, vllm * GIB - weights) // (arch.kv_bytes_per_token() / tp))
    per_sequence = _activation_bytes(arch, setup.max_model_len, setup.gradient_checkpointing, setup) / GIB
    max_micro = max(0, math.floor((mem - fixed) / per_sequence)) if per_sequence > 0 else 0
    estimate = MemoryEstimate(rollout_gb=rollout, update_gb=max(update, sync), gpu_mem_gb=mem,
                              kv_tokens=kv_tokens, max_micro_batch=max_micro, terms=terms)
    if rollout > mem:
        estimate.problems.append(
            f"rollout needs ~{rollout:.0f} GB per GPU of {mem:g}: vLLM's gpu_memory_utilization "
            f"{setup.gpu_memory_utilization:g} ({vllm:.0f} GB) beside the trainer state left on the GPU "
            f"({resident:.0f} GB); lower verl.gpu_memory_utilization, set verl.param_offload=true, or give the cell "
            "more GPUs")
    if update > mem:
        estimate.problems.append(
            f"the actor update needs ~{update:.0f} GB per GPU of {mem:g} (state {fixed - CONTEXT_GB:.0f} GB, a "
            f"micro-batch of {setup.token_budget} tokens "
            f"{terms['activations + logits of a micro-batch']:.0f} GB); "
            + (f"lower trainer.micro_batch_size to {max_micro}" if max_micro >= 1 else
               "give the cell more GPUs" + ("" if setup.offload else " or set verl.param_offload=true")))
    if sync > mem:
        estimate.problems.append(f"the weight sync needs ~{sync:.0f} GB per GPU of {mem:g}; raise "
                                 "verl.tensor_parallel or set verl.param_offload=true")
    if kv_tokens < setup.max_model_len:
        estimate.problems.append(
            f"vLLM's KV cache holds ~{kv_tokens} tokens after its {weights / GIB:.0f} GB of weights, less than one "
            f"sequence of {setup.max_model_len} (max_model_len): vLLM would not start; raise "
            "verl.gpu_memory_utilization or verl.tensor_parallel")
    return estimate
