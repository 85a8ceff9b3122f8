"""Shared fixtures of the trainer tests: a micro model preset, a session cache and a session MLflow store, and a
step hook that records which trajectories reached the update."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.diagnostics import hooks, registry

# The smallest Qwen2 that exercises every code path (and the test trainer profile: 2 prompts x 2 samples, 2 steps).
MICRO = [
    "trainer=test",
    "model.preset.hidden_size=32",
    "model.preset.num_hidden_layers=1",
    "model.preset.num_attention_heads=2",
    "model.preset.num_key_value_heads=1",
    "model.preset.intermediate_size=64",
    "model.warm_start.enabled=false",
]


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer")


@pytest.fixture()
def train_overrides(session_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Overrides for a fast CPU run: micro model, session cache and MLflow store, per-test checkpoints."""
    monkeypatch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
    monkeypatch.chdir(tmp_path)
    return [
        *MICRO,
        f"mlflow.tracking_uri=sqlite:///{session_dir / 'mlflow.db'}",
        f"trainer.checkpoint_dir={tmp_path / 'checkpoints'}",
    ]


@pytest.fixture(scope="session")
def micro_folder(session_dir: Path) -> Path:
    """The micro preset (random Qwen2 + code-built tokenizer) as a Hugging Face folder in the session cache."""
    from recipes.config.schema import compose_train_config
    from recipes.policy.models import preset_folder

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
        return preset_folder(compose_train_config(MICRO).model)


@pytest.fixture(scope="session")
def encoder(micro_folder: Path):
    from recipes.policy.chat import ChatEncoder
    from recipes.policy.models import load_tokenizer

    return ChatEncoder(load_tokenizer(micro_folder))


class Recorder(hooks.StepHook):
    """Records, per step, every trajectory's (group, return) and those of the trajectories that reached the update."""

    seen: list[dict] = []

    def on_batch(self, ctx: hooks.StepContext) -> dict[str, float]:
        Recorder.seen.append({
            "all": [(g, t.episode_return) for g, t in zip(ctx.group_ids, ctx.trajectories, strict=True)],
            "update": list(zip(ctx.batch.group_ids, ctx.batch.episode_returns.tolist(), strict=True)),
        })
        return {}


@pytest.fixture()
def recorder(monkeypatch: pytest.MonkeyPatch) -> type[Recorder]:
    """The `Recorder` registered as step hook `recorder` (enable it with `hooks=[recorder]`), emptied."""
    monkeypatch.setattr(registry.HOOKS, "entries", {**registry.HOOKS.entries, "recorder": Recorder})
    Recorder.seen = []
    return Recorder
