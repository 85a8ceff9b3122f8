"""An HF `model.generate()` rollout for veRL 0.9.1's server-based rollout path (CPU, tiny models).

veRL 0.9.1 generates only through "server replicas" (vLLM/SGLang/TRT-LLM style):
  AgentLoopWorker --LLMServerClient.generate()--> load balancer --> server actor `.generate.remote(...)`
and pushes new weights after each update via `ActorRolloutRefWorker.update_weights` -> the in-worker *adapter*
(`BaseRollout.update_weights(weights_generator)`).

Three pieces, mirroring vLLM's (vllm_async_server.py: vLLMReplica / vLLMHttpServer, vllm_rollout.py: ServerAdapter):
* `HFRolloutServer` - Ray actor holding a CPU copy of the policy; `generate()` requests that arrive together are
  micro-batched into one left-padded `model.generate()` call; returns `TokenOutput(token_ids, log_probs)`.
* `HFReplica`       - `RolloutReplica` subclass registered as "hf"; `launch_servers()` starts one named server actor.
* `HFServerAdapter` - `BaseRollout` subclass living in the FSDP worker; collects the full tensors the engine yields
  and sends them to its replica's server (rank 0 of each replica only; all ranks drain the generator because the
  FSDP2 all-gather inside it is collective). With LoRA it forwards veRL's `peft_config` and `base_sync_done`: the
  server loads the base weights once and applies each synced adapter through peft.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Generator
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

logger = logging.getLogger(__name__)

SERVER_NAME = "orch_hf_rollout_server_{rank}"
BATCH_WINDOW_S = float(os.environ.get("ORCH_HF_BATCH_WINDOW_S", "0.02"))
MAX_BATCH = int(os.environ.get("ORCH_HF_MAX_BATCH", "64"))


class HFRolloutServer:
    """Token-in/token-out generation server (the interface LLMServerClient and RolloutReplica call)."""

    def __init__(self, config, model_config, replica_rank: int = 0):
        from omegaconf import OmegaConf
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        cfg = OmegaConf.to_container(model_config, resolve=True) if not isinstance(model_config, dict) else model_config
        path = os.path.expanduser(cfg["path"])
        tok_path = os.path.expanduser(cfg.get("tokenizer_path") or path)
        self.tokenizer = AutoTokenizer.from_pretrained(tok_path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        eos: list[Any] = []
        for value in (self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id):
            eos += value if isinstance(value, list) else [value]
        self.eos_ids = sorted({i for i in eos if i is not None})
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.response_length = int(config.response_length)
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.weight_version = 0
        self.peft = None  # peft's wrapper once a LoRA adapter arrived (`_load_adapter`)
        self.awake = True
        self._pending: list[tuple[list[int], dict, asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None
        self.stats = {"requests": 0, "batches": 0, "gen_s": 0.0}

    # ---------------- generation ----------------
    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data=None,
        video_data=None,
        **kwargs,
    ) -> TokenOutput:
        if image_data or video_data:
            raise ValueError("the hf rollout replica generates text only; image observations on the verl backend "
                             "need vLLM rollouts on GPU (verl.rollout=vllm)")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((list(prompt_ids), dict(sampling_params or {}), fut))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        await asyncio.sleep(BATCH_WINDOW_S)  # let concurrent requests of one agent-loop batch arrive
        while self._pending:
            reqs, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            groups: dict[tuple, list] = {}
            for req in reqs:
                groups.setdefault(self._sampling_key(req[1], len(req[0])), []).append(req)
            for key, group in groups.items():
                try:
                    outs = await asyncio.to_thread(self._generate_batch, key, [r[0] for r in group])
                    for (_, _, fut), out in zip(group, outs, strict=True):
                        if not fut.done():
                            fut.set_result(out)
                except Exception as e:  # surface the error to every waiting request
                    logger.exception("HF generate failed")
                    for _, _, fut in group:
                        if not fut.done():
                            fut.set_exception(e)

    def _sampling_key(self, sp: dict, prompt_len: int) -> tuple:
        temperature = float(sp.get("temperature", 1.0) or 0.0)
        top_p = float(sp.get("top_p", 1.0))
        top_k = int(sp.get("top_k", -1) or -1)
        max_tokens = sp.get("max_tokens", sp.get("max_new_tokens")) or self.response_length
        stops = tuple(sorted(set(sp.get("stop_token_ids") or ())))
        return (temperature, top_p, top_k, int(max_tokens), stops)

    @torch.no_grad()
    def _generate_batch(self, key: tuple, prompts: list[list[int]]) -> list[TokenOutput]:
        temperature, top_p, top_k, max_tokens, stops = key
        eos_ids = sorted(set(self.eos_ids) | set(stops))
        t0 = time.perf_counter()
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for i, p in enumerate(prompts):  # left padding
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        do_sample = temperature > 0
        gen_kwargs = dict(
            max_new_tokens=max_tokens,
            do_sample=do_sample,
            eos_token_id=eos_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
            top_k=top_k if (do_sample and top_k > 0) else 0,  # 0 disables transformers' default top_k=50
            top_p=top_p if do_sample else 1.0,
        )
        if do_sample:
            gen_kwargs["temperature"] = temperature
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, **gen_kwargs)
        new_tokens = out.sequences[:, width:]
        # log-probs of the sampled tokens under the temperature-scaled model distribution (what the actor recomputes)
        logits = torch.stack(out.logits, dim=1).float()  # (B, T, V) raw logits
        if do_sample:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        results = []
        eos = set(eos_ids)
        for i in range(len(prompts)):
            ids = new_tokens[i].tolist()
            n = len(ids)
            for j, t in enumerate(ids):
                if t in eos:
                    n = j + 1  # keep the EOS token in the response
                    break
            stop = "completed" if n < len(ids) or (n and ids[n - 1] in eos) else "length"
            results.append(
                TokenOutput(
                    token_ids=ids[:n],
                    log_probs=logp[i, :n].tolist(),
                    stop_reason=stop,
                    num_preempted=0,
                    extra_fields={"global_steps": self.global_steps, "weight_version": self.weight_version},
                )
            )
        self.stats["requests"] += len(prompts)
        self.stats["batches"] += 1
        self.stats["gen_s"] += time.perf_counter() - t0
        return results

    # ---------------- weights ----------------
    def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None,
                       peft_config: dict | None = None, base_sync_done: bool = True) -> dict:
        """Load what veRL's weight sync sends (verl/workers/engine_workers.py:786-806): the whole model, or with
        LoRA (`peft_config` set) the base weights once (`base_sync_done` false, LoRA-wrapped names:
        `...q_proj.base_layer.weight`) and then, after every update, the adapter alone (peft's state-dict names),
        which is applied through peft's layers injected into the model (`_load_adapter`)."""
        if peft_config is not None and base_sync_done:
            return self._load_adapter(state, peft_config, global_steps)
        own = self.model.state_dict()
        named = {key if key in own else key.replace(".base_layer.", "."): value for key, value in state.items()}
        loaded = {k: v.to(own[k].dtype) for k, v in named.items() if k in own}
        missing, unexpected = self.model.load_state_dict(loaded, strict=False)
        missing = [m for m in missing if "lora_" not in m]  # an injected adapter keeps its own weights
        if self.model.config.tie_word_embeddings:
            self.model.tie_weights()
            missing = [m for m in missing if m != "lm_head.weight"]
        if missing:
            raise RuntimeError(f"HF rollout server: weights missing after sync: {missing[:5]}")
        self.global_steps = global_steps
        self.weight_version += 1
        return {"loaded": len(loaded), "ignored": sorted(set(named) - set(own))[:5], "version": self.weight_version}

    def _load_adapter(self, state: dict[str, torch.Tensor], peft_config: dict, global_steps: int | None) -> dict:
        """The LoRA adapter veRL sends after an update (peft's `get_peft_model_state_dict` names, its `LoraConfig`
        as a dict): injected into the model on the first one (B = 0 until loaded), its weights loaded every time.
        Generation then runs the base layers plus the adapters, as vLLM's LoRA path does."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

        if self.peft is None:
            fields = {key: value for key, value in peft_config.items()
                      if key in LoraConfig.__dataclass_fields__ and LoraConfig.__dataclass_fields__[key].init}
            self.peft = get_peft_model(self.model, LoraConfig(**fields))  # injected in place: self.model generates
            self.model.eval()
        own = self.model.state_dict()
        dtype = next(iter(own.values())).dtype
        result = set_peft_model_state_dict(self.peft, {k: v.to(dtype) for k, v in state.items()})
        unexpected = [key for key in result.unexpected_keys if "lora_" in key]
        if unexpected or not state:
            raise RuntimeError(f"HF rollout server: adapter weights not loaded: {unexpected[:5] or 'none sent'}")
        self.global_steps = global_steps
        self.weight_version += 1
        return {"loaded": len(state), "adapter": True, "version": self.weight_version}

    def get_stats(self) -> dict:
        return dict(self.stats, weight_version=self.weight_version, global_steps=self.global_steps)

    # ---------------- lifecycle methods RolloutReplica / CheckpointEngineManager call ----------------
    async def wake_up(self):
        self.awake = True

    async def sleep(self):
        self.awake = False  # weights stay in memory: nothing to free on CPU

    async def wait_for_requests_to_drain(self):
        while self._pending:
            await asyncio.sleep(0.01)

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class HFReplica(RolloutReplica):
    """Rollout replica "hf": one HFRolloutServer actor per replica (no GPU, one logical CPU)."""

    async def launch_servers(self):
        name = SERVER_NAME.format(rank=self.replica_rank)
        server_cls = ray.remote(HFRolloutServer)
        with contextlib.suppress(ValueError):  # a fresh trainer in the same Ray session may find the old one
            ray.kill(ray.get_actor(name))
        server = server_cls.options(name=name, num_cpus=1, max_concurrency=self.max_concurrency).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf-replica-{self.replica_rank}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """In-worker side of the "hf" rollout: receives weights from the FSDP engine and forwards them to the server."""

    def __init__(self, config, model_config, device_mesh, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        world *= self.config.pipeline_model_parallel_size
        self.replica_rank = rank // world
        self.is_leader = rank % world == 0
        self._server = None

    def _get_server(self):
        if self._server is None:
            self._server = ray.get_actor(SERVER_NAME.format(rank=self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], wire_format: str = "named_tensors", **kwargs
    ):
        assert wire_format == "named_tensors", f"HF rollout supports named_tensors only, got {wire_format}"
        state = {}
        for name, tensor in weights:  # every rank drains: the FSDP2 full_tensor() gather is collective
            if self.is_leader:
                state[name] = tensor.detach().to("cpu", copy=True)
        if self.is_leader:  # with LoRA, veRL passes the adapter's peft config and whether the base was synced
            await self._get_server().update_weights.remote(state, kwargs.get("global_steps"),
                                                           kwargs.get("peft_config"), kwargs.get("base_sync_done", True))
