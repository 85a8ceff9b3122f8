"""Per-turn and per-episode records produced by the protocol, ready for tokenisation and the rollout table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass
class Turn:
    """One assistant turn. `prompt_messages` is the chat up to (not including) this turn's reply; `reward`
    is the sum of the env rewards of the executed actions plus the format penalty if the turn was invalid.
    `image` is the state image its user turn showed as `IMAGE_PLACEHOLDER`: (H, W, 3) uint8 RGB with
    `observation: image`, else None."""

    prompt_messages: list[Message]
    response: str
    reasoning: str
    actions: list[str]
    reward: float
    format_valid: bool
    info: dict[str, Any] = field(default_factory=dict)
    image: np.ndarray | None = None


@dataclass
class Trajectory:
    """One episode. `messages` is the full chat (system, then alternating user/assistant, ending with the last
    assistant reply)."""

    task: str
    seed: int
    messages: list[Message]
    turns: list[Turn]
    success: bool

    @property
    def episode_return(self) -> float:
        return sum(turn.reward for turn in self.turns)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def images(self) -> list[np.ndarray]:
        """The state images of the user turns, in the order of their `IMAGE_PLACEHOLDER` markers in `messages`
        (empty with text observations)."""
        return [turn.image for turn in self.turns if turn.image is not None]

    def to_record(self) -> dict[str, Any]:
        """One row of the rollout-batch table. Trajectories of the same prompt share `prompt_id` (= the seed);
        `response_length` is in characters, summed over turns."""
        responses = [turn.response for turn in self.turns]
        first_user = next(message["content"] for message in self.messages if message["role"] == "user")
        return {
            "task": self.task,
            "prompt_id": self.seed,
            "seed": self.seed,
            "reward": self.episode_return,
            "success": self.success,
            "turns": self.num_turns,
            "format_valid": all(turn.format_valid for turn in self.turns),
            "response_length": sum(len(response) for response in responses),
            "prompt": first_user,
            "response": "\n".join(responses),
            "turn_log": [
                {"observation": turn.prompt_messages[-1]["content"] if turn.prompt_messages else "",
                 "response": turn.response, "actions": list(turn.actions), "reward": float(turn.reward),
                 "format_valid": bool(turn.format_valid)}
                for turn in self.turns
            ],
        }
