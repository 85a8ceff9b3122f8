"""orch's actor worker on veRL: veRL's `ActorRolloutRefWorker` (verl/workers/engine_workers.py) plus two worker
methods for the `collapse` diagnostics: `orch_cross_score`, the MI proxies' cross-scoring with prefix reuse, and
`orch_gradient_norms`, the gradient split (`diagnostics.grad_every`).

**Cross-scoring** (`orch_cross_score`): veRL's `compute_log_prob` scores whole sequences, so scoring N prompt
columns x M samples through it feeds every prompt M times. The worker method instead runs
`recipes.stats.cross_scoring.cross_score` with `method="prefix"` (each prompt encoded once, the samples on its key/value
cache) on the actor's own FSDP module, in the engine's eval mode (parameters loaded if offloaded). Every rank gets
the whole job (`Dispatch.ONE_TO_ALL`) and scores its own contiguous block of the (sorted, distinct) prompts,
`prompt_block`; the driver joins the blocks' columns in rank order. FSDP gathers each layer's parameters with a
collective call at every forward, so every rank must run the same number of forwards: the blocks are padded to one
length with one-token filler prompts, and each prompt costs the same forwards on every rank (one for the prompt,
then one per batch of the same samples). A stop (the run's stop file) ends the scoring between forwards, on every
rank at the same forward: the ranks agree on it with one all-reduce per batch (`collective_stop`), since a rank
that stopped alone would leave the others waiting in their next gather.

The split needs gradients that are never applied, computed where the actor's parameters live (its FSDP workers,
possibly on several GPUs and nodes): no public worker call does that (`update_actor` always steps the optimizer), so
the method runs the actor engine's own `forward_backward_batch` twice over the rows it is given, once with the task
part of the actor loss and once with its regularisation part (`recipes.policy.actor.ActorLossTerms`, the same definitions as
the torch backend), takes the L2 norm of the resulting gradient each time, and zeroes the gradients again. The
optimizer, its state and the learning-rate schedule are untouched; the next `update_actor` starts from zeroed
gradients as always.

Every row's loss is normalised by the whole batch the rows are drawn from (`orch_batch_num_tokens`,
`orch_global_batch_size`), as on the torch backend, so that the gradients of disjoint row sets add up to the
gradient of the batch.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.utils.tensordict_utils import maybe_fix_3d_position_ids
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import no_padding_2_padding

from recipes.policy.actor import ActorLossTerms, actor_loss_terms
from recipes.run.tracking import peak_memory_gb
from recipes.runtime.stop import StopRequested, interruptible
from recipes.stats.cross_scoring import cross_score

PARTS = ("task", "reg")


def loss_terms(config: Any, model_output: dict[str, Any], data: TensorDict) -> ActorLossTerms:
    """The task and regularisation terms of veRL's `ppo_loss` (verl/workers/utils/losses.py) on one micro-batch of
    the engine, built by `recipes.policy.actor.actor_loss_terms` (vanilla policy loss, as orch's algorithms configure it).
    `task + regularisation` is `ppo_loss`'s loss.

    Args:
        config: the actor's veRL `ActorConfig`.
        model_output: the engine's forward output, `log_probs` and `entropy` (nested, no padding).
        data: the micro-batch (nested): response_mask, old_log_probs, advantages (and ref_log_prob with KL loss),
            with the normaliser as non-tensor data: dp_size, batch_num_tokens, global_batch_size.
    """
    log_probs = no_padding_2_padding(model_output["log_probs"], data)
    entropy = no_padding_2_padding(model_output["entropy"], data)
    info = {"dp_size": data["dp_size"], "batch_num_tokens": data["batch_num_tokens"],
            "global_batch_size": data["global_batch_size"], "loss_scale_factor": config.loss_scale_factor}
    config.global_batch_info.update(info)
    fields = ["response_mask", "old_log_probs", "advantages"] + (["ref_log_prob"] if config.use_kl_loss else [])
    padded = data.select(*fields).to_padded_tensor()
    micro = SimpleNamespace(loss_mask=padded["response_mask"].to(bool), old_log_probs=padded["old_log_probs"],
                            advantages=padded["advantages"], ref_log_probs=padded.get("ref_log_prob"))
    return actor_loss_terms(log_probs, entropy, micro, config, info)


def part_loss(part: str, config: Any, model_output: dict[str, Any], data: TensorDict,
              dp_group: Any = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """A loss function for the engine (veRL's loss-function signature): one part of the actor loss, every row
    normalised by the whole batch (`orch_batch_num_tokens`, `orch_global_batch_size` of the data)."""
    tu.assign_non_tensor(data, batch_num_tokens=data["orch_batch_num_tokens"],
                         global_batch_size=data["orch_global_batch_size"])
    terms = loss_terms(config, model_output, data)
    return (terms.pg if part == "task" else terms.regularisation(config)), {}


def gradient_norm(parameters: Any) -> float:
    """L2 norm of the parameters' gradients, whole (sharded FSDP2 gradients are DTensors: gathered by their norm)."""
    from torch.distributed.tensor import DTensor

    grads = [param.grad for param in parameters if param.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def gradient_norms(worker: Any, config: Any, data: TensorDict) -> dict[str, float]:
    """Per part of the actor loss (`PARTS`), the norm of its gradient over `data`'s rows, on one actor rank
    (`worker`: veRL's `TrainingWorker` of the actor). Gradients are zeroed before and after; nothing is applied."""
    engine = worker.engine
    maybe_fix_3d_position_ids(data)
    defaults = {"use_remove_padding": worker.model_config.get("use_remove_padding", False),
                "use_dynamic_bsz": worker.engine_config.use_dynamic_bsz,
                "max_token_len_per_gpu": worker.engine_config.max_token_len_per_gpu,
                "micro_batch_size_per_gpu": worker.engine_config.micro_batch_size_per_gpu,
                "use_fused_kernels": worker.engine_config.use_fused_kernels,
                "calculate_entropy": True}
    tu.assign_non_tensor(data, **{key: value for key, value in defaults.items() if key not in data.keys()})  # noqa: SIM118  (TensorDict keys, non-tensor data included)
    norms = {}
    with engine.train_mode():
        for part in PARTS:
            engine.optimizer_zero_grad()
            engine.forward_backward_batch(data, loss_function=partial(part_loss, part, config), forward_only=False)
            norms[part] = gradient_norm(engine.module.parameters())
        engine.optimizer_zero_grad()
    return norms


def prompt_block(prompts: list[list[int]], rank: int, world: int) -> tuple[list[list[int]], int]:
    """Rank `rank`'s contiguous block of `prompts` (distinct) out of `world` equal blocks, and how many of them are
    real: the block is padded to the common length ceil(len / world) with distinct one-token prompts that are not
    among `prompts`, so that every rank runs as many forwards (see the module docstring)."""
    size = -(-len(prompts) // world)
    block = [list(prompt) for prompt in prompts[rank * size:(rank + 1) * size]]
    taken = {tuple(prompt) for prompt in prompts}
    fillers = ([token] for token in range(len(taken) + size + 1) if (token,) not in taken)
    return block + [next(fillers) for _ in range(size - len(block))], len(block)


def collective_stop(stop_file: str | None, device: str = "cpu") -> Any:
    """A `should_stop` for `recipes.runtime.stop.interruptible` that every rank of the default process group answers alike:
    true once any rank sees `stop_file` (one all-reduce of a flag; every rank must call it at the same point)."""
    import torch.distributed as dist

    def should_stop() -> bool:
        seen = torch.tensor([1.0 if stop_file and Path(stop_file).exists() else 0.0], device=device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        return bool(seen.item())

    return should_stop


def block_scores(module: Any, prompts: list[list[int]], samples: list[list[int]], rank: int, world: int,
                 batch_size: int, pad_id: int, should_stop: Any = None) -> tuple[np.ndarray, int] | None:
    """L_sum (M, this rank's real prompts) of every sample under this rank's block of prompts (`prompt_block`),
    prefix reuse on `module`, and the tokens fed (fillers included); None when `should_stop` (polled between
    forwards, `recipes.runtime.stop`) turned true."""
    block, real = prompt_block(prompts, rank, world)
    try:
        with interruptible(should_stop):
            scores = cross_score(module, block, samples, method="prefix", batch_size=batch_size, pad_id=pad_id,
                                 inference_mode=False)  # FSDP2's hooks refuse inference tensors
    except StopRequested:
        return None
    return scores.L_sum[:, :real], scores.tokens_processed


class OrchActorRolloutRefWorker(ActorRolloutRefWorker):
    """veRL's actor/rollout/reference worker with orch's diagnostics methods (see the module docstring)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def orch_cross_score(self, prompts: list[list[int]], samples: list[list[int]], batch_size: int,
                         pad_id: int, stop_file: str | None = None) -> tuple[np.ndarray, int] | None:
        """This rank's columns of the cross-scoring: (L_sum of its real prompts, tokens fed), or None when the run's
        `stop_file` appeared (every rank then returns None); `prompts` distinct and sorted (neighbours share
        prefixes), every rank given all of them."""
        import torch.distributed as dist
        from verl.utils.device import get_device_name

        engine = self.actor.engine
        device = "cpu" if dist.get_backend() == "gloo" else get_device_name()
        with engine.eval_mode():
            return block_scores(engine.module, prompts, samples, dist.get_rank(), dist.get_world_size(), batch_size,
                                pad_id, collective_stop(stop_file, device))

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def orch_gradient_norms(self, data: TensorDict) -> TensorDict | None:
        """{"task": norm, "reg": norm} of the actor loss's parts over `data` (split over the actor's ranks)."""
        norms = gradient_norms(self.actor, self.loss_fn.keywords["config"], data)
        if not self.actor.engine.is_mp_src_rank_with_outputs():
            return None
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": norms})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def orch_peak_memory_gb(self) -> float:
        """This worker's peak memory so far, GB (`recipes.run.tracking.peak_memory_gb`: the GPU's peak torch allocation,
        on cpu the process's peak resident set)."""
        return peak_memory_gb("cuda" if torch.cuda.is_available() else "cpu")
