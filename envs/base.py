"""The environment interface every task implements, and its validated config base.

An environment is gymnasium-shaped but speaks text: `reset(seed)` returns the state as a string, `step(action)`
takes one action string. The base class owns the bookkeeping shared by all tasks: the per-episode action budget,
the truncation it causes, and refusing to step a finished episode.
"""

from __future__ import annotations

import operator
import random
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchlib.errors import OrchError

if TYPE_CHECKING:
    import numpy as np

SYSTEM_PREFIX = "You're a helpful assistant. "


class EnvConfig(BaseModel):
    """Settings shared by all tasks; each task subclasses this with its own fields and defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(5, ge=1, description="Turns (assistant replies) per episode.")
    max_actions_per_turn: int = Field(
        2, ge=1, description="Actions executed from one reply; extra ones are dropped."
    )
    max_actions: int = Field(
        10, ge=1, description="Actions per episode; the episode is truncated when spent."
    )
    format_penalty: float = Field(
        -0.1, description="Added to the turn reward for unparsable or invalid replies."
    )
    observation: str = Field(
        "text", description="How user turns show the state: text, or image (grid tasks; see Env.observe)."
    )

    # The observation modalities this task can render (grid tasks add image).
    observations: ClassVar[tuple[str, ...]] = ("text",)

    @field_validator("observation")
    @classmethod
    def _observation_available(cls, observation: str) -> str:
        if observation not in cls.observations:
            raise ValueError(f"{observation!r} is not available for this task; valid choices: "
                             f"{', '.join(cls.observations)}")
        return observation


class Env:
    """A text environment. Subclasses set `config_class`, `valid_actions`, `answer_format`, and implement
    `instruction`, `_reset`, `_step`, `render_text` and `demonstrate`.

    `valid_actions` is the closed list of action names, or None for tasks whose action is free text (an
    expression, an answer); `answer_format` describes in words what goes inside `<answer>`.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[EnvConfig]] = EnvConfig
    valid_actions: ClassVar[list[str] | None] = None
    answer_format: ClassVar[str] = ""

    def __init__(self, config: EnvConfig) -> None:
        self.config = config
        self.rng = random.Random(0)
        self.seed: int | None = None
        self.actions_taken = 0
        self.finished = True

    # --- protocol-facing attributes -----------------------------------------------------------------------
    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    @property
    def max_actions_per_turn(self) -> int:
        return self.config.max_actions_per_turn

    @property
    def actions_left(self) -> int:
        return self.config.max_actions - self.actions_taken

    @property
    def instruction(self) -> str:
        """The task description placed after `SYSTEM_PREFIX` in the system message."""
        raise NotImplementedError

    @property
    def system_prompt(self) -> str:
        return SYSTEM_PREFIX + self.instruction

    # --- gymnasium-style API --------------------------------------------------------------------------------
    def reset(self, seed: int, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the episode determined by `seed` (the same seed always gives the same episode).

        Option ``dynamics_seed`` (int) re-seeds the randomness of the dynamics (e.g. FrozenLake's slips) after the
        initial state is drawn from `seed`: trajectories of one prompt share their start state but not their luck.
        """
        if isinstance(seed, bool) or not hasattr(seed, "__index__"):
            raise OrchError(f"{self.name}: seed must be an int, got {seed!r}")
        seed = operator.index(seed)
        options = dict(options or {})
        dynamics_seed = options.pop("dynamics_seed", None)
        self.seed = seed
        self.rng = random.Random(seed)
        self.actions_taken = 0
        self.finished = False
        self._reset(self.rng, options)
        if dynamics_seed is not None:
            self.rng = random.Random(f"{seed}/{operator.index(dynamics_seed)}")
        return self.render_text(), {"seed": seed, "success": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action. Returns (observation, reward, terminated, truncated, info).

        `info["success"]` says whether the task is solved; `info["action_valid"]` is False when the env could
        not interpret the action (the protocol then charges the format penalty)."""
        if self.finished:
            raise OrchError(f"{self.name}: step() called on a finished episode; call reset() first")
        reward, terminated, info = self._step(action)
        self.actions_taken += 1
        truncated = not terminated and self.actions_left <= 0
        self.finished = terminated or truncated
        info.setdefault("action_valid", True)
        info.setdefault("success", False)
        return self.render_text(), reward, terminated, truncated, info

    # --- task hooks -------------------------------------------------------------------------------------------
    def _reset(self, rng: random.Random, options: dict[str, Any]) -> None:
        raise NotImplementedError

    def _step(self, action: str) -> tuple[float, bool, dict[str, Any]]:
        """Apply `action`; return (reward, terminated, info)."""
        raise NotImplementedError

    def render_text(self) -> str:
        """The current state as text (what the user turn shows in text mode)."""
        raise NotImplementedError

    def observe(self) -> tuple[str, np.ndarray | None]:
        """What the next user turn shows of the current state: (state text, None) with ``observation: text``;
        grid tasks with ``observation: image`` give (`IMAGE_PLACEHOLDER`, RGB image of shape (H, W, 3), uint8)."""
        return self.render_text(), None

    def demonstrate(self, rng: random.Random) -> tuple[str, list[str]]:
        """An expert's next move from the current state: (reasoning that cites this state's facts, actions)."""
        raise NotImplementedError


def reject_options(env: Env, options: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Raise OrchError if `options` has a key outside `allowed`."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        valid = ", ".join(allowed) or "(none)"
        raise OrchError(f"{env.name}: unknown reset option {unknown[0]!r}; valid choices: {valid}")
