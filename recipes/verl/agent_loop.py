"""Every orch environment as a veRL agent loop (`orch_env`): the same `envs` protocol, chat rendering and per-turn
rewards as the torch backend, with veRL's rollout servers generating.

One dataset row is one prompt: `extra_info.seed`, the environment seed (the K samples of a prompt share it; each
sample draws its own dynamics seed, as the torch backend does). The task, its settings and the per-turn token cap
come from the run's `TrainConfig`, which the backend puts in veRL's config as `orch.train_config`.

An episode is played turn by turn: the chat so far is rendered by `recipes.policy.chat.ChatEncoder` (earlier replies as
the token ids that were sampled, never re-tokenised), the server generates the reply (stopping at the template's
end-of-turn token, at most `trainer.max_response_tokens`), and `envs.Episode.act` parses it, steps the environment
and writes the next user turn. The returned sequence is the whole chat after the first prompt: reply tokens
(`response_mask` 1, with their rollout log-probs) and the template and observation tokens between turns (mask 0:
never in the loss). The reward is the episode return; each turn's reward and the position of its last reply token
travel in `extra_fields` (the trainer puts each turn's reward on that token, as the torch backend does), with the
trajectory itself (`orch_trajectory`) and the sampled ids of its replies (`orch_generated`) for the statistics,
the rollout-batch table and the MI diagnostics. An episode ends early, after its current turn, once the run's stop
file exists (the trainer then drops that step, or that validation: `OrchPPOTrainer`). Under the planted-collapse
control (`control.blind_from_step`) a row carrying `blind_seed` (and, under `control.blind_strength` < 1, named by
its `blind_rows`: `_blind_seed`) generates every reply from that seed's first-turn chat instead of its own
(`_blind_prompt`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

AGENT_NAME = "orch_env"
_CONFIGS: dict[int, Any] = {}  # id(veRL config) -> TrainConfig, per worker process


def train_config(verl_config: Any) -> Any:
    """The run's `TrainConfig`, from `verl_config.orch.train_config` (validated once per process)."""
    key = id(verl_config)
    if key not in _CONFIGS:
        from omegaconf import OmegaConf

        from recipes.config.schema import TrainConfig

        _CONFIGS[key] = TrainConfig.from_tree(OmegaConf.to_container(verl_config.orch.train_config, resolve=True))
    return _CONFIGS[key]


def blind_marks(infos: list[dict[str, Any]], samples: int, strength: float, run_seed: int,
                step: int) -> list[dict[str, Any]]:
    """CONTROL, the trainer's side (`OrchPPOTrainer._get_gen_batch`): the `extra_info` of a planted step's training
    prompts (in batch order; veRL repeats each `samples` times into trajectory rows prompt x samples + sample) marked
    for `_blind_seed`: `blind_seed` (the first prompt's seed) on every prompt with a blinded trajectory, and
    `blind_rows` (its blinded rows) where not all of its trajectories are. The rows are
    `recipes.runtime.seeds.blinded_rows`'s, the torch backend's."""
    from recipes.runtime.seeds import blinded_rows

    blinded = set(blinded_rows(len(infos) * samples, strength, run_seed, step))
    fixed = int(infos[0]["seed"])
    marked = []
    for prompt, info in enumerate(infos):
        rows = [row for row in range(prompt * samples, (prompt + 1) * samples) if row in blinded]
        if len(rows) == samples:
            info = {**info, "blind_seed": fixed}
        elif rows:  # `blind_sessions`: the same trajectories as samples of the prompt (V1 numbers them so)
            info = {**info, "blind_seed": fixed, "blind_rows": rows,
                    "blind_sessions": [row - prompt * samples for row in rows]}
        marked.append(info)
    return marked


def _blind_seed(row: dict[str, Any]) -> Any:
    """CONTROL, the agent loop's side of `blind_marks`: the seed whose first-turn chat this trajectory's replies are
    generated from, or None. veRL's repeat gives a prompt's trajectories one shared `extra_info`; its `blind_rows`
    (when set) name the blinded ones by the row veRL numbers each trajectory with: `priority`, arange over the
    repeated batch (`AgentLoopManager.generate_sequences`; tests/recipes/verl/test_verl_parts.py pins it). veRL's V1
    trainer does not repeat the batch: it runs a prompt's n samples as sessions 0..n-1 (`session_id`,
    v1/agent_loop_tq.py:122-128), which `blind_sessions` names."""
    info = row["extra_info"]
    if info.get("blind_rows") is None:
        return info.get("blind_seed")
    if "priority" in row:
        return info["blind_seed"] if int(row["priority"]) in info["blind_rows"] else None
    return info["blind_seed"] if int(row["session_id"]) in info["blind_sessions"] else None


def _blind_prompt(seed: Any, cfg: Any, env_class: Any, build_config: Any, encoder: Any,
                  vision: Any) -> tuple[list[int], list[Any] | None] | None:
    """CONTROL (`control.blind_from_step`; the trainer marks the step's blinded rows, `blind_marks`): the prompt
    every reply of this episode is generated from -- the first-turn chat of the episode at `blind_seed` (the step's
    first), with its frame -- so that what the policy writes cannot depend on this episode's input, while the
    trajectory keeps its own real messages (as `recipes.policy.sampler.BlindSampler` on the torch backend). None without."""
    if seed is None:
        return None
    from envs.episode import Episode
    from recipes.policy.vision import to_image

    fixed = Episode(env_class(cfg.task.name)(build_config(cfg.task.name, cfg.task.env)), int(seed), dynamics_seed=0)
    chat = encoder.encode(fixed.messages, {}, add_generation_prompt=True)
    if vision is None or fixed.image is None:
        return list(chat.input_ids), None
    frame = to_image(fixed.image)
    return list(vision.expand(chat, vision.feature_counts([frame])).input_ids), [frame]


@register(AGENT_NAME)
class OrchEnvAgentLoop(AgentLoopBase):
    """One orch environment episode per call (see the module docstring)."""

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        from envs.episode import Episode
        from envs.registry import build_config, env_class
        from recipes.policy.chat import ChatEncoder
        from recipes.policy.vision import ImageTokens, to_image

        cfg = train_config(self.config)
        seed = int(row["extra_info"]["seed"])
        env = env_class(cfg.task.name)(build_config(cfg.task.name, cfg.task.env))
        vision = ImageTokens.from_processor(self.processor) if env.config.observation == "image" else None
        episode = Episode(env, seed, dynamics_seed=random.getrandbits(31))  # own slips per sample, as the torch backend
        encoder = ChatEncoder(self.tokenizer, image_markup=vision.markup if vision else None)
        frames: list[Any] = []  # the state images shown so far, in chat order (image observations)
        counts: list[int] = []  # visual features of each

        def show_frame() -> None:
            if vision is not None and episode.image is not None:
                frames.append(to_image(episode.image))
                counts.extend(vision.feature_counts(frames[-1:]))

        def encode(messages: list[dict], generated: dict[str, list[int]], prompt: bool) -> Any:
            chat = encoder.encode(messages, generated, add_generation_prompt=prompt)
            return vision.expand(chat, counts) if vision is not None else chat

        show_frame()
        blind = _blind_prompt(_blind_seed(row), cfg, env_class, build_config, encoder, vision)
        budget = int(self.rollout_config.response_length)
        generated: dict[str, list[int]] = {}
        logprobs: list[list[float]] = []
        request_id = uuid4().hex
        prompt_ids = encode(episode.messages, generated, True).input_ids
        context = list(prompt_ids)
        extra: dict[str, Any] = {}
        from omegaconf import OmegaConf

        stop = OmegaConf.select(self.config, "orch.run.stop_file")
        stop_file = Path(stop) if stop else None
        while not episode.done:
            room = budget - (len(context) - len(prompt_ids))
            if room <= 0:  # the trajectory is cut: its remaining turns get no loss (as the torch backend)
                break
            if logprobs and stop_file is not None and stop_file.exists():
                break  # a stop was requested: the trainer drops this step or validation (OrchPPOTrainer)
            asked, shown = (context, list(frames) or None) if blind is None else blind  # CONTROL: one fixed chat
            out = await self.server_manager.generate(
                request_id=request_id if blind is None else uuid4().hex, prompt_ids=asked,
                sampling_params={**sampling_params, "max_tokens": min(cfg.trainer.max_response_tokens, room),
                                 "stop_token_ids": [encoder.end_of_turn_id]},
                image_data=shown,
            )
            extra.update({key: value for key, value in out.extra_fields.items() if key.endswith("global_steps")})
            ids = list(out.token_ids)
            text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] == encoder.end_of_turn_id else ids)
            generated[text] = ids
            logprobs.append(list(out.log_probs) if out.log_probs is not None else [0.0] * len(ids))
            episode.act(text)
            if not episode.done:
                show_frame()
            context = encode(episode.messages, generated, not episode.done).input_ids
        trajectory = episode.trajectory()
        del frames[len(trajectory.turns):], counts[len(trajectory.turns):]  # a cut episode's next frame: never seen
        chat = encode(trajectory.messages, generated, False)
        return self._output(trajectory, chat, logprobs, prompt_ids, budget, generated, extra, frames)

    def _output(self, trajectory: Any, chat: Any, logprobs: list[list[float]], prompt_ids: list[int], budget: int,
                generated: dict[str, list[int]], extra: dict[str, Any], frames: list[Any]) -> AgentLoopOutput:
        """The chat after the prompt as one response: reply tokens in the loss (with their rollout log-probs),
        template, observation and image tokens not; each turn's reward and the index of its last reply token; the
        state images (image observations) as veRL's multi-modal data."""
        if chat.input_ids[: len(prompt_ids)] != prompt_ids:
            raise RuntimeError("the chat template rendered the first prompt differently in the full chat")
        start = len(prompt_ids)
        response, mask = chat.input_ids[start:][:budget], chat.loss_mask[start:][:budget]
        flat = iter([value for turn in logprobs for value in turn])
        rollout_logprobs = [next(flat, 0.0) if in_loss else 0.0 for in_loss in mask]
        turn_ends = [end - start for end in chat.turn_ends if end - start < len(response)]
        rewards = [turn.reward for turn in trajectory.turns][: len(turn_ends)]
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response,
            response_mask=mask,
            response_logprobs=rollout_logprobs,
            reward_score=float(sum(rewards)),
            num_turns=2 * trajectory.num_turns + 1,
            metrics={},
            multi_modal_data={"images": frames} if frames else None,
            extra_fields={
                **extra,
                "orch_turn_ends": turn_ends,
                "orch_turn_rewards": rewards,
                "orch_trajectory": trajectory,
                "orch_generated": generated,
                "reward_extra_info": {"success": float(trajectory.success)},
            },
        )
