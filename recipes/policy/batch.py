"""The training batch: T trajectories as right-padded token tensors with loss mask and turn rewards.

Shapes: T trajectories, L = the longest sequence. Per-token tensors are aligned with `input_ids`: position t holds
what concerns token t (its log-prob under the policy, the value of the state just before it, its advantage).
Position 0 is never in the loss (no token predicts it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch

from orchlib.errors import OrchError
from recipes.policy.chat import ChatEncoder
from recipes.policy.vision import BatchImages


@dataclass
class TrainBatch:
    """Token tensors of T trajectories.

    input_ids: (T, L) long, right-padded.
    attention_mask: (T, L) long, 1 on real tokens.
    loss_mask: (T, L) float, 1 on tokens the policy generated (veRL's `response_mask`).
    token_rewards: (T, L) float, each turn's reward on the last token of that turn's reply.
    group_ids: (T,) numpy, prompt id of each trajectory (its group).
    old_log_probs, ref_log_probs, values, advantages, returns: (T, L) float, filled by the trainer's phases.
    images: the rows' frames (image observations on a vision-language model), else None.
    sampled_log_probs: (T, L) float, the log-probs the sampler drew the rows' loss tokens with (`sampled_log_probs`),
        valid on the rows `sampled_rows` ((T,) numpy bool) marks; None: none known.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    token_rewards: torch.Tensor
    group_ids: np.ndarray
    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    images: BatchImages | None = None
    sampled_log_probs: torch.Tensor | None = None
    sampled_rows: np.ndarray | None = None

    def model_inputs(self, model: torch.nn.Module) -> dict[str, Any]:
        """What the model takes beside input_ids and the attention mask: the frames' pixel_values, image_grid_thw
        and M-RoPE position_ids (`recipes.policy.vision`); nothing for text."""
        if self.images is None:
            return {}
        return self.images.model_inputs(model, self.input_ids, self.attention_mask)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def episode_returns(self) -> torch.Tensor:
        """(T,) sum of turn rewards."""
        return self.token_rewards.sum(dim=-1)

    def select(self, index: Any) -> TrainBatch:
        """Rows `index` (bool mask or integer indices, numpy or torch) of every tensor."""
        rows = torch.as_tensor(np.flatnonzero(index) if np.asarray(index).dtype == bool else np.asarray(index))
        picked = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            picked[item.name] = value[rows.numpy()] if isinstance(value, np.ndarray) else value[rows]
        return replace(self, **picked)

    def trimmed(self) -> TrainBatch:
        """The same rows with trailing all-padding columns removed (cheaper forward passes)."""
        width = int(self.attention_mask.sum(dim=-1).max())
        return replace(self, **{
            item.name: getattr(self, item.name)[:, :width]
            for item in fields(self)
            if isinstance(getattr(self, item.name), torch.Tensor)
        })

    def to(self, device: torch.device | str) -> TrainBatch:
        return replace(self, **{
            item.name: getattr(self, item.name).to(device)
            for item in fields(self)
            if isinstance(getattr(self, item.name), torch.Tensor)
        })


def build_batch(
    chats: Sequence[Sequence[Mapping[str, str]]],
    turn_rewards: Sequence[Sequence[float]],
    group_ids: Sequence[Any],
    encoder: ChatEncoder,
    generated: Mapping[str, Sequence[int]] | None = None,
    frames: Sequence[Sequence[Any]] | None = None,
) -> TrainBatch:
    """Tokenise T chats (each a whole trajectory) into a `TrainBatch`.

    Args:
        chats: full chats (system, user, assistant, ...), one per trajectory.
        turn_rewards: reward of each assistant turn, one list per chat (as many as its assistant messages).
        group_ids: prompt id of each trajectory.
        encoder: the chat encoder of the policy's tokenizer.
        generated: reply text -> sampled ids (see `recipes.policy.sampler.Sampler.generated`).
        frames: per chat, the frames of its image placeholders in order (image observations; needs
            `encoder.vision`), else None.
    """
    images = None
    if frames is not None and encoder.vision is not None:
        encoded, rows = [], []
        for chat, shown in zip(chats, frames, strict=True):
            item = encoder.vision.encode(encoder, chat, shown, generated)
            item.input_ids, pixels, grids = encoder.vision.resolve(item.input_ids)
            encoded.append(item)
            rows.append((pixels, grids))
        images = BatchImages(rows, encoder.vision)
    else:
        encoded = [encoder.encode(chat, generated) for chat in chats]
    width = max(len(item.input_ids) for item in encoded)
    count = len(encoded)
    input_ids = torch.full((count, width), encoder.tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((count, width), dtype=torch.long)
    loss_mask = torch.zeros((count, width), dtype=torch.float32)
    token_rewards = torch.zeros((count, width), dtype=torch.float32)
    for row, (item, rewards) in enumerate(zip(encoded, turn_rewards, strict=True)):
        if len(item.turn_ends) != len(rewards):
            raise OrchError(f"trajectory {row}: {len(item.turn_ends)} assistant replies but {len(rewards)} turn rewards")
        length = len(item.input_ids)
        input_ids[row, :length] = torch.tensor(item.input_ids)
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = torch.tensor(item.loss_mask, dtype=torch.float32)
        for end, reward in zip(item.turn_ends, rewards, strict=True):
            token_rewards[row, end] += float(reward)
    loss_mask[:, 0] = 0.0  # nothing predicts the first token
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        token_rewards=token_rewards,
        group_ids=np.asarray(list(group_ids)),
        images=images,
    )


def micro_batches(batch: TrainBatch, size: int) -> list[TrainBatch]:
    """Consecutive slices of at most `size` rows, each trimmed of all-padding columns."""
    return [batch.select(np.arange(start, min(start + size, len(batch)))).trimmed()
            for start in range(0, len(batch), size)]


def sampled_log_probs(batch: TrainBatch, recorded: Mapping[tuple[int, ...], Sequence[float]]
                      ) -> tuple[torch.Tensor, np.ndarray]:
    """The log-probs each row's loss tokens were sampled with, from `recorded` (the sampler's `reply_log_probs`:
    context + reply ids -> one log-prob per reply token), and which rows they cover: a row is covered when every
    reply in it (each run of loss tokens) is recorded under exactly the tokens before it, so a reply sampled from
    another context (a blinded row, `BlindSampler`) or never sampled (a demonstration) leaves its row uncovered.

    Returns: (T, L) float, zero outside covered rows' loss tokens; (T,) bool, the covered rows.
    """
    values = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
    covered = np.zeros(len(batch), dtype=bool)
    padded = torch.nn.functional.pad((batch.loss_mask > 0).int().cpu(), (1, 1))  # a zero column either side
    edges = padded[:, 1:] - padded[:, :-1]  # +1 where a run of loss tokens starts, -1 one past where it ends
    for row in range(len(batch)):
        ids = batch.input_ids[row].tolist()
        runs = list(zip((edges[row] == 1).nonzero().flatten().tolist(), (edges[row] == -1).nonzero().flatten().tolist(),
                        strict=True))
        found = [recorded.get(tuple(ids[:end])) for _, end in runs]
        if not runs or any(log_probs is None or len(log_probs) != end - start
                           for log_probs, (start, end) in zip(found, runs, strict=True)):
            continue
        for log_probs, (start, end) in zip(found, runs, strict=True):
            values[row, start:end] = torch.tensor(log_probs, dtype=torch.float32)
        covered[row] = True
    return values.to(batch.input_ids.device), covered
