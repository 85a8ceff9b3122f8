"""Forward passes and the PPO-style updates of the policy (actor) and the value model (critic).

Losses come from veRL: `get_policy_loss_fn("vanilla")` (clipped surrogate with clip-higher and dual-clip),
`agg_loss` (token-mean / seq-mean-token-sum / seq-mean-token-mean / seq-mean-token-sum-norm), `kl_penalty`,
`compute_value_loss`. A mini-batch is one optimiser step; it is processed in micro-batches whose losses are
normalised by the whole mini-batch's token / sequence counts (veRL's `global_batch_info`), so the accumulated
gradient equals the gradient of the mini-batch loss. Fewer trajectories (after filtering) mean fewer mini-batches.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from recipes.policy.batch import TrainBatch, micro_batches
from recipes.policy.packing import pack, packed_forward, packs
from recipes.runtime.stop import poll


@dataclass(frozen=True)
class UpdateSettings:
    """How one update pass is batched. Sizes count trajectories."""

    mini_batch_size: int
    micro_batch_size: int
    epochs: int
    grad_clip: float
    loss_scale_factor: int  # the constant horizon of seq-mean-token-sum-norm (Dr.GRPO)


def model_mask(batch: TrainBatch) -> torch.Tensor | None:
    """The attention mask to pass to the model: None when there is no padding, which lets SDPA use its fused
    causal kernel (several times faster on CPU than the masked path; one-row micro-batches never pad)."""
    return None if bool(batch.attention_mask.all()) else batch.attention_mask


def token_log_probs(
    model: torch.nn.Module, batch: TrainBatch, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every loss token under `model` given the tokens before it, and optionally the policy's entropy
    there. The output head runs only where a loss token is predicted (most positions are prompt and observation
    tokens), which saves the vocabulary projection and softmax everywhere else.

    Returns:
        log_probs: (T, L), zero outside `batch.loss_mask`.
        entropy: (T, L) or None, zero outside `batch.loss_mask`.
    """
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    rows, cols = torch.nonzero(batch.loss_mask, as_tuple=True)  # position 0 is never in the loss
    if packs(batch, model):  # the rows end to end, unpadded: one pass (recipes.policy.packing)
        packed = pack(batch)
        predicting = packed_forward(model.base_model, packed).last_hidden_state[0, packed.index(rows, cols - 1)]
    else:
        hidden = model.base_model(input_ids=batch.input_ids, attention_mask=model_mask(batch),
                                  **batch.model_inputs(model)).last_hidden_state
        predicting = hidden[rows, cols - 1]
    logits = model.get_output_embeddings()(predicting).float()  # (N, V): predicts token (row, col)
    log_probs = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=logits.device)
    log_probs[rows, cols] = logprobs_from_logits(logits, batch.input_ids[rows, cols])
    if not with_entropy:
        return log_probs, None
    entropy = torch.zeros_like(log_probs)
    entropy[rows, cols] = entropy_from_logits(logits)
    return log_probs, entropy


def state_values(critic: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    """(T, L) value of the state before each token: V(tokens < t) at position t; position 0 is 0."""
    values = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    if packs(batch, critic):  # the rows end to end, unpadded (recipes.policy.packing); padding keeps 0
        packed = pack(batch)
        scores = packed_forward(critic, packed).logits[0, :, 0].float()
        rows, cols = torch.nonzero(batch.attention_mask[:, 1:], as_tuple=True)
        values[rows, cols + 1] = scores[packed.index(rows, cols)]
        return values
    scores = critic(input_ids=batch.input_ids, attention_mask=model_mask(batch),
                    **batch.model_inputs(critic)).logits[..., 0].float()
    values[:, 1:] = scores[:, :-1]
    return values


@torch.no_grad()
def batched_forward(fn: Any, model: torch.nn.Module, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
    """Apply `fn(model, micro_batch) -> (t, l)` over micro-batches without gradients; reassemble (T, L)."""
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    for start, micro in zip(range(0, len(batch), micro_batch_size), micro_batches(batch, micro_batch_size),
                            strict=True):
        poll()  # scoring leaves the model as it was: a stop may end it between micro-batches (recipes.runtime.stop)
        result = fn(model, micro)
        out[start : start + len(micro), : result.shape[1]] = result
    return out


def global_batch_info(mini: TrainBatch, loss_scale_factor: int) -> dict[str, Any]:
    """veRL's loss normaliser for micro-batches of one mini-batch: its token and sequence counts."""
    return {
        "dp_size": 1,
        "batch_num_tokens": mini.loss_mask.sum(),
        "global_batch_size": (mini.loss_mask.sum(dim=-1) > 0).sum(),
        "loss_scale_factor": loss_scale_factor,
    }


def _mini_batches(batch: TrainBatch, size: int) -> list[TrainBatch]:
    return [batch.select(np.arange(start, min(start + size, len(batch)))) for start in range(0, len(batch), size)]


def actor_config(algorithm_cfg: Any, settings: UpdateSettings, samples_per_prompt: int) -> Any:
    """The veRL `ActorConfig` the policy-loss functions read (clip ranges, aggregation mode)."""
    from verl.workers.config.actor import ActorConfig

    return ActorConfig(
        strategy="torch",
        rollout_n=samples_per_prompt,
        ppo_mini_batch_size=settings.mini_batch_size,
        ppo_micro_batch_size_per_gpu=settings.micro_batch_size,
        clip_ratio=algorithm_cfg.clip_ratio_low,
        clip_ratio_low=algorithm_cfg.clip_ratio_low,
        clip_ratio_high=algorithm_cfg.clip_ratio_high,
        clip_ratio_c=algorithm_cfg.clip_ratio_c,
        loss_agg_mode=algorithm_cfg.loss_agg_mode,
        loss_scale_factor=settings.loss_scale_factor,
        entropy_coeff=algorithm_cfg.entropy_coeff,
        use_kl_loss=bool(algorithm_cfg.use_kl),
        kl_loss_coef=algorithm_cfg.kl_coef,
        kl_loss_type=algorithm_cfg.kl_penalty,
        ppo_epochs=settings.epochs,
        use_torch_compile=False,
    )


@dataclass
class ActorLossTerms:
    """The parts of one micro-batch's actor loss, each its share of the mini-batch loss (scalar tensors).

    pg: the task part, veRL's clipped policy-gradient surrogate.
    entropy: the aggregated policy entropy (the loss subtracts `entropy_coeff` times it).
    kl: the aggregated KL to the reference (None without `use_kl_loss`).
    pg_metrics: veRL's clip fractions and approximate KL, as floats.
    """

    pg: torch.Tensor
    entropy: torch.Tensor
    kl: torch.Tensor | None
    pg_metrics: dict[str, float]

    def regularisation(self, config: Any) -> torch.Tensor:
        """The input-agnostic part of the loss: -entropy_coeff * entropy (+ kl_loss_coef * kl)."""
        reg = -config.entropy_coeff * self.entropy
        return reg if self.kl is None else reg + config.kl_loss_coef * self.kl


def actor_loss_terms(
    log_probs: torch.Tensor, entropy: torch.Tensor, micro: TrainBatch, config: Any, info: dict[str, Any]
) -> ActorLossTerms:
    """The task and regularisation terms of one micro-batch's actor loss.

    Args:
        log_probs, entropy: (t, l) under the current policy (with gradients).
        micro: the micro-batch (old_log_probs, advantages, loss_mask; ref_log_probs when config.use_kl_loss).
        config: veRL ActorConfig (its `global_batch_info` set to `info`).
        info: the normaliser of the batch the micro-batch belongs to (see `global_batch_info`).
    """
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

    mask, mode = micro.loss_mask, config.loss_agg_mode
    pg_loss, pg_metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=micro.old_log_probs, log_prob=log_probs, advantages=micro.advantages,
        response_mask=mask, loss_agg_mode=mode, config=config,
    )
    entropy_loss = agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=mode, **info)
    kl_loss = None
    if config.use_kl_loss:
        kl = kl_penalty(log_probs, micro.ref_log_probs, config.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kl, loss_mask=mask, loss_agg_mode=mode, **info)
    return ActorLossTerms(pg=pg_loss, entropy=entropy_loss, kl=kl_loss, pg_metrics=pg_metrics)


def actor_loss(
    log_probs: torch.Tensor, entropy: torch.Tensor, micro: TrainBatch, config: Any, info: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one micro-batch: pg_loss - entropy_coeff * entropy + kl_loss_coef * kl (arguments as
    in `actor_loss_terms`).

    Returns:
        the loss (its share of the mini-batch loss) and its parts as floats.
    """
    terms = actor_loss_terms(log_probs, entropy, micro, config, info)
    parts = {"actor/pg_loss": terms.pg.item(), "actor/entropy_loss": terms.entropy.item(), **terms.pg_metrics}
    if terms.kl is not None:
        parts["actor/kl_loss"] = terms.kl.item()
    return terms.pg + terms.regularisation(config), parts


def set_batch_info(config: Any, info: dict[str, Any]) -> None:
    """Point the veRL ActorConfig's loss normaliser (read by its policy-loss function) at `info`."""
    config.global_batch_info.clear()
    config.global_batch_info.update(info)


def loss_part_gradients(
    model: torch.nn.Module, batch: TrainBatch, config: Any, info: dict[str, Any], micro_batch_size: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Gradients of the task part (`ActorLossTerms.pg`) and of the regularisation part of the actor loss over the
    rows of `batch`, at the current policy before any update (the old log-probs are the current ones, detached:
    ratio 1, no clipping). Every row's loss is normalised by `info`, so the gradients of disjoint row sets sharing
    one `info` add up to the gradient of their union. Nothing is applied: parameters' `.grad` stay untouched.

    Args:
        batch: rows with advantages (and ref_log_probs when config.use_kl_loss).
        info: the normaliser, e.g. `global_batch_info` of the whole batch the rows are drawn from.

    Returns:
        (task, regularisation): one float32 tensor per trainable parameter of `model`, of the parameter's shape.
    """
    params = [param for param in model.parameters() if param.requires_grad]
    task = [torch.zeros_like(param, dtype=torch.float32) for param in params]
    regularisation = [torch.zeros_like(param, dtype=torch.float32) for param in params]
    set_batch_info(config, info)
    for micro in micro_batches(batch, micro_batch_size):
        log_probs, entropy = token_log_probs(model, micro, with_entropy=True)
        micro.old_log_probs = log_probs.detach()
        terms = actor_loss_terms(log_probs, entropy, micro, config, info)
        for total, part, retain in ((task, terms.pg, True), (regularisation, terms.regularisation(config), False)):
            grads = torch.autograd.grad(part, params, retain_graph=retain, allow_unused=True)
            for accumulated, grad in zip(total, grads, strict=True):
                if grad is not None:
                    accumulated.add_(grad)
    return task, regularisation


def gradient_norm(grads: list[torch.Tensor]) -> float:
    """L2 norm of a gradient given as one tensor per parameter."""
    return float(torch.stack([grad.pow(2).sum() for grad in grads]).sum().sqrt())


SUMMED = ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss")  # micro-batch shares of the mini-batch loss

MicroLoss = Callable[[TrainBatch, dict[str, Any]], tuple[torch.Tensor, dict[str, float]]]


def minibatch_steps(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, settings: UpdateSettings,
    prefix: str, micro_loss: MicroLoss,
) -> dict[str, float]:
    """`settings.epochs` passes over `batch`, one optimiser step per mini-batch with gradients accumulated over its
    micro-batches. `micro_loss(micro, info)` returns the micro-batch's share of the mini-batch loss and its metric
    shares (summed over the mini-batch); `info` is the mini-batch's normaliser (`global_batch_info`).

    Returns the metrics averaged over mini-batches, plus `<prefix>/grad_norm` (before clipping) and `<prefix>/lr`.
    """
    history: dict[str, list[float]] = defaultdict(list)
    for _ in range(settings.epochs):
        for mini in _mini_batches(batch, settings.mini_batch_size):
            optimizer.zero_grad(set_to_none=True)
            info = global_batch_info(mini, settings.loss_scale_factor)
            sums: dict[str, float] = defaultdict(float)
            for micro in micro_batches(mini, settings.micro_batch_size):
                poll()  # a stop inside an interruptible update (the torch trainer undoes it: UpdateUndo)
                loss, shares = micro_loss(micro, info)
                loss.backward()
                for key, value in shares.items():
                    sums[key] += value
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
            optimizer.step()
            history[f"{prefix}/grad_norm"].append(float(grad_norm))
            for key, value in sums.items():
                history[key].append(value)
    metrics = {key: float(np.mean(values)) for key, values in history.items()}
    metrics[f"{prefix}/lr"] = float(optimizer.param_groups[0]["lr"])
    return metrics


def token_share(micro: TrainBatch, info: dict[str, Any]) -> float:
    """The micro-batch's share of its mini-batch's loss tokens."""
    return float(micro.loss_mask.sum() / info["batch_num_tokens"])


def update_actor(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    config: Any,
    settings: UpdateSettings,
) -> dict[str, float]:
    """PPO epochs over `batch` (needs old_log_probs, advantages; ref_log_probs when config.use_kl_loss).

    Returns `actor/*` metrics averaged over mini-batches (`actor/entropy` is the token-mean policy entropy).
    """

    def micro_loss(micro: TrainBatch, info: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        set_batch_info(config, info)
        log_probs, entropy = token_log_probs(model, micro, with_entropy=True)
        loss, parts = actor_loss(log_probs, entropy, micro, config, info)
        parts["actor/entropy"] = float((entropy.detach() * micro.loss_mask).sum() / micro.loss_mask.sum())
        weight = token_share(micro, info)
        return loss, {key: float(value) if key in SUMMED else weight * float(value) for key, value in parts.items()}

    metrics = minibatch_steps(model, optimizer, batch, settings, "actor", micro_loss)
    metrics["actor/optimizer_steps"] = float(settings.epochs * math.ceil(len(batch) / settings.mini_batch_size))
    return metrics


def update_critic(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    cliprange_value: float,
    settings: UpdateSettings,
) -> dict[str, float]:
    """Value-model epochs over `batch` (needs values, returns) with veRL's clipped value loss (token-mean).

    Returns `critic/*` metrics averaged over mini-batches.
    """
    from verl.trainer.ppo.core_algos import compute_value_loss

    def micro_loss(micro: TrainBatch, info: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
        vpreds = state_values(critic, micro)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds=vpreds, returns=micro.returns, values=micro.values, response_mask=micro.loss_mask,
            cliprange_value=cliprange_value, loss_agg_mode="token-mean",
            dp_size=1, batch_num_tokens=info["batch_num_tokens"],
        )
        weight = token_share(micro, info)
        vpred_mean = float((vpreds.detach() * micro.loss_mask).sum() / micro.loss_mask.sum().clamp(min=1))
        return vf_loss, {"critic/vf_loss": vf_loss.item(), "critic/vf_clipfrac": weight * float(vf_clipfrac),
                         "critic/vpred_mean": weight * vpred_mean}

    return minibatch_steps(critic, optimizer, batch, settings, "critic", micro_loss)
