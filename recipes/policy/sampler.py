"""Batched sampling: the policy callable that `envs.run_episodes` drives.

Each call receives the chat histories of all running episodes, builds their generation contexts with the shared
`ChatEncoder` (earlier replies as the exact ids sampled) and samples one reply per history from the full
distribution at the given temperature (no top-k/top-p: the policy RL trains). The ids of every reply are recorded
in `generated` (reply text -> ids) so the trainer rebuilds the same sequences; with `keep_log_probs`, a text
policy's log-prob of each sampled token under the untempered logits it was drawn from is recorded in
`reply_log_probs` (context + reply ids -> one per reply token): the old log-probs PPO needs, which the trainer then
need not compute again (`recipes.policy.batch.sampled_log_probs`; the same numbers to float tolerance in float32,
`test_decode.py`).

Two things keep this fast on a CPU, where re-reading long multi-turn contexts dominates:

* **KV reuse across turns.** After a turn, each chat's key/value cache (context + reply) is kept in a
  `PrefixStore`; the next turn only runs the new tokens (the observation) through the model. Identical contexts
  (the K samples of a prompt at turn 1) are computed once. These prefills run one unpadded chat at a time.
* **A static decode cache.** The chats' caches are laid out right-aligned in one preallocated buffer and decoded
  together with an explicit additive mask; nothing is re-copied per token (Hugging Face `generate` re-copies its
  growing cache every token, about twice as slow here).
* **A lean decode step.** For a plain Qwen2 causal LM (the presets; not LoRA-adapted, not vision-language) each
  decoded token runs `LeanDecoder`: the same arithmetic as the model's forward (`test_decode.py` pins it to float
  tolerance) on weights fused once per call (q, k and v one matmul, gate and up one), writing the static cache in
  place, without the modules' Python, mask building and cache bookkeeping around every token; other models run
  their own forward.

With a vision-language policy (`encoder.vision`), `envs.run_episodes` passes each history's frames; contexts are
keyed ids (`recipes.policy.vision`), a prefill feeds the frames of the tokens it runs and the 3-D (M-RoPE) positions of
the whole context, and decoding continues from the context's last position. The policy never writes vision tokens.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from orchlib.errors import OrchError
from recipes.policy.chat import ChatEncoder
from recipes.runtime.stop import poll

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values, each (1, heads, tokens, head_dim)


def sample(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """One token per row from softmax(logits / temperature), by the exponential race (Gumbel-max): exact, and
    several times faster than `torch.multinomial` on CPU; temperature 0: the most likely token (greedy, what
    `orch eval --temperature 0` asks for). (rows, vocab) -> (rows, 1)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    race = torch.empty_like(logits, dtype=torch.float32).exponential_()
    return (logits.float() / temperature - race.log()).argmax(dim=-1, keepdim=True)


def generation_contexts(encoder: ChatEncoder, histories: Sequence[Sequence[Mapping[str, str]]],
                        generated: Mapping[str, list[int]], max_new_tokens: int, max_context_tokens: int,
                        frames: Sequence[Sequence[Any]] | None = None) -> list[list[int]]:
    """The ids each history's next reply is generated after (earlier replies as the exact ids sampled, from
    `generated`); keyed ids with the frames for a vision-language encoder. OrchError when one plus `max_new_tokens`
    exceeds `max_context_tokens`."""
    if frames is not None and encoder.vision is not None:
        contexts = [encoder.vision.encode(encoder, history, shown, generated, True).input_ids
                    for history, shown in zip(histories, frames, strict=True)]
    else:
        contexts = [encoder.encode(history, generated, add_generation_prompt=True).input_ids for history in histories]
    longest = max(len(context) for context in contexts) + max_new_tokens
    if longest > max_context_tokens:
        raise OrchError(
            f"a generation context needs {longest} tokens > trainer.max_context_tokens={max_context_tokens}; "
            "raise it or lower trainer.max_response_tokens"
        )
    return contexts


def reply_text(encoder: ChatEncoder, ids: list[int]) -> str:
    """The text of a reply's ids (its end-of-turn token, when it has one, left out): the key of `generated`."""
    body = ids[:-1] if ids and ids[-1] == encoder.end_of_turn_id else ids
    return encoder.tokenizer.decode(body, skip_special_tokens=True)


class PrefixStore:
    """Key/value caches of token sequences, found again by prefix (one entry per chat, taken when reused)."""

    def __init__(self) -> None:
        self._by_length: dict[int, dict[tuple[int, ...], LayerKV]] = {}

    def put(self, ids: Sequence[int], kv: LayerKV) -> None:
        self._by_length.setdefault(len(ids), {})[tuple(ids)] = kv

    def take(self, ids: Sequence[int]) -> tuple[int, LayerKV | None]:
        """The longest stored proper prefix of `ids` and its cache (removed from the store), or (0, None)."""
        for length in sorted(self._by_length, reverse=True):
            if length < len(ids):
                kv = self._by_length[length].pop(tuple(ids[:length]), None)
                if kv is not None:
                    return length, kv
        return 0, None


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2's RMSNorm (`Qwen2RMSNorm.forward`)."""
    as_float = hidden.to(torch.float32)
    as_float = as_float * torch.rsqrt(as_float.pow(2).mean(-1, keepdim=True) + eps)
    return weight * as_float.to(hidden.dtype)


class LeanDecoder:
    """One decode step of a plain Qwen2 causal LM over a right-aligned static cache, as the model's own forward
    computes it, on weights fused when built (build it again after the weights change). `applies(model)` says
    whether a model is one it reproduces."""

    def __init__(self, model: torch.nn.Module) -> None:
        backbone, config = model.model, model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.embed, self.rotary = backbone.embed_tokens.weight, backbone.rotary_emb
        self.norm = (backbone.norm.weight, backbone.norm.variance_epsilon)
        self.head = model.get_output_embeddings().weight
        self.layers = []
        with torch.no_grad():
            for layer in backbone.layers[: config.num_hidden_layers]:
                attention, mlp = layer.self_attn, layer.mlp
                self.layers.append((
                    layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                    torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]),
                    torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias]),
                    attention.o_proj.weight,
                    layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                    torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight,
                ))

    @staticmethod
    def applies(model: torch.nn.Module) -> bool:
        """A `Qwen2ForCausalLM` whose layers are the stock ones (plain linear layers with q/k/v biases and no o_proj
        bias, SiLU, full attention, default RoPE): not LoRA-adapted, not vision-language."""
        from transformers import Qwen2ForCausalLM

        if type(model) is not Qwen2ForCausalLM:
            return False
        config = model.config
        rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
        if (config.hidden_act != "silu" or getattr(config, "use_sliding_window", False)
                or rope.get("rope_type", rope.get("type", "default")) != "default"):
            return False
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            linears = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj,
                       mlp.up_proj, mlp.down_proj)
            if any(type(linear) is not torch.nn.Linear for linear in linears) or attention.o_proj.bias is not None:
                return False
        return type(model.get_output_embeddings()) is torch.nn.Linear and model.lm_head.bias is None

    def __call__(self, token: torch.Tensor, bias: torch.Tensor, position: torch.Tensor, cache: Any,
                 column: int) -> torch.Tensor:
        """The next-token logits (rows, vocab) after `token` (rows, 1) at `position` (rows, 1), its keys and values
        written into column `column` of `cache` (a `StaticCache` laid out by `Sampler._batch_cache`); `bias`: the
        additive mask over the cache's columns (rows, 1, 1, columns), the new column open."""
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        functional = torch.nn.functional
        rows, written = token.shape[0], column + 1
        bias = bias[..., :written]  # the columns after `column` are not written yet (masked in every row)
        hidden = functional.embedding(token, self.embed)  # (rows, 1, width)
        cos, sin = self.rotary(hidden, position)
        sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        for (in_norm, in_eps, qkv_weight, qkv_bias, o_weight, post_norm, post_eps, gate_up, down), layer in zip(
                self.layers, cache.layers, strict=True):
            query, key, value = functional.linear(_rms_norm(hidden, in_norm, in_eps), qkv_weight, qkv_bias).split(
                sizes, dim=-1)
            query = query.view(rows, 1, self.heads, self.head_dim).transpose(1, 2)
            key = key.view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
            layer.keys[:, :, column] = key[:, :, 0]
            layer.values[:, :, column] = value.view(rows, self.kv_heads, self.head_dim)
            attended = functional.scaled_dot_product_attention(  # the written columns only: it reads no more
                query, layer.keys[:, :, :written], layer.values[:, :, :written], attn_mask=bias, scale=self.scaling,
                enable_gqa=self.kv_heads != self.heads)
            hidden = hidden + functional.linear(attended.transpose(1, 2).reshape(rows, 1, -1), o_weight)
            gate, up = functional.linear(_rms_norm(hidden, post_norm, post_eps), gate_up).chunk(2, dim=-1)
            hidden = hidden + functional.linear(functional.silu(gate) * up, down)
        return functional.linear(_rms_norm(hidden, *self.norm), self.head)[:, -1]


class Sampler:
    """A batched chat policy over a causal LM.

    Args:
        model: causal LM (left in whatever train/eval mode it had; sampling runs under no_grad).
        encoder: the chat encoder of the model's tokenizer.
        max_new_tokens: cap on generated tokens per reply (the end-of-turn token included).
        temperature: sampling temperature (> 0).
        max_context_tokens: a context plus `max_new_tokens` longer than this raises OrchError.
        batch_size: histories generated together (bounds memory).
        keep_log_probs: record each drawn token's log-prob in `reply_log_probs` (a text policy; the trainer's
            rollout asks for it, validation and the warm start's evaluations do not).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        encoder: ChatEncoder,
        max_new_tokens: int,
        temperature: float,
        max_context_tokens: int,
        batch_size: int = 64,
        keep_log_probs: bool = False,
    ) -> None:
        self.model = model
        self.encoder = encoder
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.max_context_tokens = max_context_tokens
        self.batch_size = batch_size
        self.keep_log_probs = keep_log_probs
        self.generated: dict[str, list[int]] = {}
        self.reply_log_probs: dict[tuple[int, ...], list[float]] = {}  # context + reply -> log-probs (keep_log_probs)
        self.store = PrefixStore()

    @property
    def takes_images(self) -> bool:
        """Whether the model reads frames (`envs.run_episodes` then passes each history's frames)."""
        return self.encoder.vision is not None

    def __call__(self, histories: Sequence[Sequence[Mapping[str, str]]],
                 frames: Sequence[Sequence[Any]] | None = None) -> list[str]:
        """One reply per chat history; `frames`: per history, the frames of its image placeholders (a
        vision-language model: the contexts are keyed ids, `recipes.policy.vision`)."""
        contexts = generation_contexts(self.encoder, histories, self.generated, self.max_new_tokens,
                                       self.max_context_tokens, frames)
        replies: list[str] = []
        for start in range(0, len(contexts), self.batch_size):
            for ids in self._generate(contexts[start : start + self.batch_size]):
                text = self._reply_text(ids)
                self.generated[text] = ids
                replies.append(text)
        return replies

    def _reply_text(self, ids: list[int]) -> str:
        return reply_text(self.encoder, ids)

    @torch.no_grad()
    def _prefill(self, context: list[int]) -> tuple[LayerKV, torch.Tensor, int]:
        """Run the part of `context` not in the store through the model; its full cache, last logits and the
        position of its last token (the next tokens' positions follow it)."""
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        start, kv = self.store.take(context)
        cache = DynamicCache(ddp_cache_data=kv) if kv is not None else DynamicCache()
        inputs: dict[str, Any] = {"position_ids": torch.arange(start, len(context), device=device)[None]}
        last = len(context) - 1
        if min(context) < 0:  # keyed image tokens: the frames of the new part, M-RoPE positions of the whole context
            ids, _, grids = self.encoder.vision.resolve(context)
            _, pixels, new_grids = self.encoder.vision.resolve(context[start:])
            positions = self.encoder.vision.rope_positions(self.model, torch.tensor([ids], device=device), None, grids)
            inputs = {"position_ids": positions[:, :, start:]}
            if new_grids is not None:
                inputs.update(pixel_values=pixels.to(device), image_grid_thw=new_grids.to(device))
            context, last = ids, int(positions[:, 0, -1].max())
        output = self.model(
            input_ids=torch.tensor([context[start:]], device=device), past_key_values=cache, use_cache=True, **inputs,
        )
        return [(layer.keys, layer.values) for layer in cache.layers], output.logits[0, -1], last

    def _batch_cache(self, contexts: list[list[int]], prefilled: dict[tuple[int, ...], LayerKV], width: int) -> Any:
        """A static cache of `width + max_new_tokens` columns with every chat's cache right-aligned at `width`, and
        the additive attention mask (rows, 1, 1, columns): 0 where a column holds the row's token, -inf elsewhere."""
        from transformers import StaticCache

        rows, columns = len(contexts), width + self.max_new_tokens
        cache = StaticCache(config=self.model.config, max_batch_size=rows, max_cache_len=columns)
        template = prefilled[tuple(contexts[0])]
        for layer, (keys, values) in zip(cache.layers, template, strict=True):  # allocate the layer's buffers
            layer.lazy_initialization(keys.new_zeros((rows, keys.shape[1], 1, keys.shape[3])),
                                      values.new_zeros((rows, values.shape[1], 1, values.shape[3])))
            layer.cumulative_length.fill_(width)  # decoding writes from column `width` on
        bias = torch.full((rows, 1, 1, columns), float("-inf"), device=template[0][0].device)
        for row, context in enumerate(contexts):
            bias[row, :, :, width - len(context) : width] = 0.0
            for layer, (keys, values) in zip(cache.layers, prefilled[tuple(context)], strict=True):
                layer.keys[row, :, width - len(context) : width] = keys[0]
                layer.values[row, :, width - len(context) : width] = values[0]
        return cache, bias

    @torch.no_grad()
    def _generate(self, contexts: list[list[int]]) -> list[list[int]]:
        """Sample one reply per context. Returns the reply ids, cut after the first end-of-turn token (or at
        `max_new_tokens`); stores each chat's cache (context + reply) for its next turn."""
        device = next(self.model.parameters()).device
        prefilled, first_logits, last_position = {}, {}, {}
        for key in {tuple(context) for context in contexts}:  # identical contexts (a prompt's samples) once
            poll()  # a stop ends the rollout here or between tokens (recipes.runtime.stop)
            prefilled[key], first_logits[key], last_position[key] = self._prefill(list(key))
        width = max(len(context) for context in contexts)
        cache, bias = self._batch_cache(contexts, prefilled, width)
        logits = torch.stack([first_logits[tuple(context)] for context in contexts])
        position = torch.tensor([[last_position[tuple(context)]] for context in contexts], device=device)
        replies: list[list[int]] = [[] for _ in contexts]
        scores: list[list[float]] = [[] for _ in contexts]  # each reply token's log-prob (text policies)
        active = torch.arange(len(contexts), device=device)  # original row of each batch row
        running = torch.ones(len(contexts), dtype=torch.bool, device=device)  # rows still inside their reply
        banned = list(self.encoder.vision.vision_ids) if self.encoder.vision is not None else []
        scored = self.keep_log_probs and self.encoder.vision is None  # each token's log-prob (`reply_log_probs`)
        lean = LeanDecoder(self.model) if LeanDecoder.applies(self.model) else None
        for offset in range(self.max_new_tokens):
            poll()
            if banned:  # a vision-language policy never writes image tokens (they stand for frames)
                logits[:, banned] = float("-inf")
            token = sample(logits, self.temperature)  # (batch, 1)
            rows = active[running].tolist()
            for row, value in zip(rows, token[running, 0].tolist(), strict=True):
                replies[row].append(value)
            if scored:  # the token's log-prob under the untempered logits, as the trainer scores it
                chosen = torch.log_softmax(logits.float(), dim=-1).gather(-1, token)[:, 0]
                for row, value in zip(rows, chosen[running].tolist(), strict=True):
                    scores[row].append(value)
            running &= token[:, 0] != self.encoder.end_of_turn_id
            if not bool(running.any()) or offset == self.max_new_tokens - 1:
                break
            if int(running.sum()) <= len(active) // 2:  # drop finished rows once half are done: less to attend
                self._store_rows(cache, active, ~running, contexts, replies, width)
                keep = torch.nonzero(running).flatten()
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[keep], layer.values[keep]
                active, running, token = active[keep], running[keep], token[keep]
                bias, position = bias[keep], position[keep]
            bias[:, :, :, width + offset] = 0.0
            position = position + 1
            if lean is not None:
                logits = lean(token, bias, position, cache, width + offset)
                continue
            logits = self.model(input_ids=token, attention_mask=bias, position_ids=position, past_key_values=cache,
                                use_cache=True, cache_position=torch.tensor([width + offset], device=device)
                                ).logits[:, -1]
        self._store_rows(cache, active, torch.ones_like(running), contexts, replies, width)
        if scored:
            for context, reply, values in zip(contexts, replies, scores, strict=True):
                self.reply_log_probs[(*context, *reply)] = values
        return replies

    def _store_rows(self, cache: Any, active: torch.Tensor, which: torch.Tensor, contexts: list[list[int]],
                    replies: list[list[int]], width: int) -> None:
        """Keep the caches of batch rows `which` (their chat: context + reply) for the chat's next turn."""
        for index in torch.nonzero(which).flatten().tolist():
            row = int(active[index])
            start, end = width - len(contexts[row]), width + len(replies[row]) - 1  # the last token was never fed
            self.store.put([*contexts[row], *replies[row][:-1]], [
                (layer.keys[index : index + 1, :, start:end].clone(), layer.values[index : index + 1, :, start:end].clone())
                for layer in cache.layers
            ])



class BlindSampler:
    """CONTROL (`control.blind_from_step`): a sampler whose replies cannot depend on their input. Every reply of a
    blinded row, at every turn, is generated from one fixed chat -- the first chat history (and frames) it is asked
    about, the step's first episode's first turn -- then handed back to its own episode, so the trajectories keep
    their real, distinct prompts while what the policy wrote ignores them: a planted template collapse, which the MI
    proxies (cross-scoring each reply against every real prompt) must see and entropy need not. (Blinding each turn
    to the batch's first chat *of that turn* would not do: a reply would still carry its turn's position.)

    `blinded`: the rows (episode indices of a `run_episodes` batch, `recipes.runtime.seeds.blinded_rows`) whose
    replies come from the fixed chat; the others are generated from their own histories, in the same inner call.
    None: every row (`control.blind_strength` 1, the total plant). The driver says which rows it asks about
    (`takes_rows`); the fixed chat is the first call's first history whether or not its row is blinded."""

    takes_rows = True  # envs.run_episodes passes rows= (each history's episode index)

    def __init__(self, inner: Sampler, blinded: Collection[int] | None = None) -> None:
        self.inner = inner
        self.generated = inner.generated
        # keyed by the context sampled from, so a blinded row's reply is not found under its own (an inner sampler
        # that records none, as the tests' stand-ins: nothing found, every row scored)
        self.reply_log_probs = getattr(inner, "reply_log_probs", {})
        self.blinded = None if blinded is None else frozenset(blinded)
        self.fixed: tuple[Sequence[Mapping[str, str]], Sequence[Any] | None] | None = None

    @property
    def takes_images(self) -> bool:
        return self.inner.takes_images

    def __call__(self, histories: Sequence[Sequence[Mapping[str, str]]],
                 frames: Sequence[Sequence[Any]] | None = None, rows: Sequence[int] | None = None) -> list[str]:
        """One reply per history, as `Sampler.__call__`; `rows`: per history, its episode's row (None: the
        positions 0..len-1, a batch whose every episode is still running)."""
        if self.fixed is None:
            self.fixed = (histories[0], frames[0] if frames is not None else None)
        history, shown = self.fixed
        rows = range(len(histories)) if rows is None else rows
        blind = [self.blinded is None or row in self.blinded for row in rows]
        asked = [history if hidden else own for hidden, own in zip(blind, histories, strict=True)]
        return self.inner(asked, None if frames is None else
                          [shown if hidden else own for hidden, own in zip(blind, frames, strict=True)])
