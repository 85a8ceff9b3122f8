"""One environment played through the chat protocol: the only place replies become env steps and rewards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envs.base import Env
from envs.protocol import parse_response, user_turn
from envs.trajectory import Message, Trajectory, Turn
from orchlib.errors import OrchError

if TYPE_CHECKING:
    import numpy as np


class Episode:
    """Holds one env, its chat so far and its turns. Call `act(reply)` until `done`.

    The episode ends when the env terminates or truncates (action budget spent) or after `max_turns` turns
    (default: the env's own `max_turns`).
    """

    def __init__(self, env: Env, seed: int, max_turns: int | None = None, dynamics_seed: int | None = None) -> None:
        self.env = env
        self.seed = seed
        self.max_turns = env.max_turns if max_turns is None else max_turns
        if self.max_turns < 1:
            raise OrchError(f"max_turns must be at least 1, got {self.max_turns}")
        _, info = env.reset(seed, None if dynamics_seed is None else {"dynamics_seed": dynamics_seed})
        self.success = bool(info["success"])
        self.turns: list[Turn] = []
        self.messages: list[Message] = [{"role": "system", "content": env.system_prompt}]
        self.image: np.ndarray | None = None  # the image of the last user turn (image observations only)
        self._show_state(None, None)
        self.done = False

    def _show_state(self, last_reward: float | None, last_failure: str | None) -> None:
        """Append the next user turn: the env's current observation (state text, or the image placeholder with
        the image kept in `self.image`)."""
        state, self.image = self.env.observe()
        content = user_turn(
            turn=len(self.turns) + 1,
            state=state,
            actions_left=self.env.actions_left,
            max_actions_per_turn=self.env.max_actions_per_turn,
            last_reward=last_reward,
            last_failure=last_failure,
        )
        self.messages.append({"role": "user", "content": content})

    def act(self, response: str) -> Turn:
        """Parse `response`, execute its actions, charge the format penalty if invalid, and append the reply
        (and, unless the episode ended, the next user message) to the chat."""
        if self.done:
            raise OrchError(f"{self.env.name}: act() called on a finished episode (seed {self.seed})")
        env = self.env
        parsed = parse_response(response, env.valid_actions, env.max_actions_per_turn)
        failure, reward, executed = parsed.failure, 0.0, []
        env_infos: list[dict[str, Any]] = []
        ended = False
        for action in parsed.actions:
            _, step_reward, terminated, truncated, info = env.step(action)
            reward += step_reward
            executed.append(action)
            env_infos.append(info)
            self.success = bool(info["success"])
            if not info["action_valid"]:
                failure = "invalid_action"
            if terminated or truncated:
                ended = True
                break
        if failure is not None:
            reward += env.config.format_penalty
        turn = Turn(
            prompt_messages=list(self.messages),
            response=response,
            reasoning=parsed.reasoning,
            actions=executed,
            reward=reward,
            format_valid=failure is None,
            info={
                "failure": failure,
                "extra_actions": parsed.extra_actions,
                "env": env_infos,
                "ended": ended,
            },
            image=self.image,
        )
        self.turns.append(turn)
        self.messages.append({"role": "assistant", "content": response})
        self.done = ended or len(self.turns) >= self.max_turns
        if not self.done:
            self._show_state(reward, failure)
        return turn

    @property
    def images(self) -> list[np.ndarray]:
        """The frames of the chat's image placeholders so far, in order (empty with text observations)."""
        shown = [turn.image for turn in self.turns if turn.image is not None]
        return shown if self.done or self.image is None else [*shown, self.image]

    def trajectory(self) -> Trajectory:
        return Trajectory(
            task=self.env.name,
            seed=self.seed,
            messages=list(self.messages),
            turns=list(self.turns),
            success=self.success,
        )
