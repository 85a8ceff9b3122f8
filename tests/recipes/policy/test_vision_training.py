"""Image observations on the torch backend: the tiny Qwen2.5-VL preset (`model=tiny_vl`), its token sequences,
KV reuse and cross-scoring exactness with frames in the context, and a 2-step training run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recipes.config.schema import compose_train_config
from recipes.policy.batch import build_batch
from recipes.policy.chat import ChatEncoder
from recipes.policy.models import load_policy, load_tokenizer, preset_folder
from recipes.policy.vision import ImageTokens, is_vision_folder

# The micro vision-language model: the micro text model of conftest.MICRO plus a one-block vision tower.
MICRO_VL = [
    "model=tiny_vl",
    "trainer=test",
    "model.preset.hidden_size=32",
    "model.preset.num_hidden_layers=1",
    "model.preset.num_attention_heads=2",
    "model.preset.num_key_value_heads=1",
    "model.preset.intermediate_size=64",
    "model.preset.vision.hidden_size=32",
    "model.preset.vision.intermediate_size=64",
    "model.warm_start.enabled=false",
    "task=sokoban",
    "task.env.observation=image",
]


@pytest.fixture(scope="module")
def vl_folder(session_dir: Path) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
        return preset_folder(compose_train_config(MICRO_VL).model)


@pytest.fixture(scope="module")
def vl_encoder(vl_folder: Path) -> ChatEncoder:
    tokenizer = load_tokenizer(vl_folder)
    return ChatEncoder(tokenizer, vision=ImageTokens.from_folder(vl_folder, tokenizer))


@pytest.fixture(scope="module")
def vl_policy(vl_folder: Path) -> torch.nn.Module:
    torch.manual_seed(0)
    return load_policy(vl_folder, "float32", "cpu").eval()


@pytest.fixture(scope="module")
def demos() -> list:
    from envs import demonstration_trajectories

    return demonstration_trajectories("sokoban", 3, seed=1, env_config={"observation": "image"})


def test_the_preset_is_an_ordinary_vision_language_folder(vl_folder: Path, vl_encoder: ChatEncoder) -> None:
    assert is_vision_folder(vl_folder) and (vl_folder / "preprocessor_config.json").is_file()
    vision = vl_encoder.vision
    assert vision.markup == "<|vision_start|><|image_pad|><|vision_end|>"
    assert vl_encoder.image_markup == vision.markup
    assert ImageTokens.from_folder(vl_folder, vl_encoder.tokenizer).pad_id == vision.pad_id
    # loadable by path, as a real Qwen2.5-VL checkpoint is (`model=hf`): the host check accepts it for images
    cfg = compose_train_config(["model=hf", f"model.path={vl_folder}", "task=sokoban", "task.env.observation=image"])
    assert cfg.model.path == str(vl_folder)


def test_image_tokens_are_never_in_the_loss_mask(vl_encoder: ChatEncoder, demos: list) -> None:
    vision = vl_encoder.vision
    chats = [t.messages for t in demos]
    batch = build_batch(chats, [[0.0] * t.num_turns for t in demos], range(len(demos)), vl_encoder,
                        frames=[t.images for t in demos])
    pads = batch.input_ids == vision.pad_id
    per_frame = [int(vision.frame(frame)[2].prod()) // vision.merge**2 for t in demos for frame in t.images]
    assert int(pads.sum()) == sum(per_frame) > 0
    assert float(batch.loss_mask[pads].sum()) == 0.0
    assert float(batch.loss_mask.sum()) > 0
    # the text part is the text chat's, token for token: only the image pads are expanded
    for row, trajectory in enumerate(demos):
        text = vl_encoder.encode(trajectory.messages)
        ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        collapsed = [token for index, token in enumerate(ids)
                     if token != vision.pad_id or ids[index - 1] != vision.pad_id]
        assert collapsed == text.input_ids


def test_prefix_cross_scoring_equals_naive_with_images(vl_policy, vl_encoder: ChatEncoder, demos: list) -> None:
    from recipes.diagnostics.monitor import turn_frames
    from recipes.stats.vision_scoring import cross_score_images

    vision = vl_encoder.vision
    prompts, samples = [], []
    for trajectory in demos:
        for index, turn in enumerate(trajectory.turns[:2]):
            prompts.append(vision.encode(vl_encoder, turn.prompt_messages, turn_frames(trajectory, index),
                                         add_generation_prompt=True).input_ids)
            samples.append(vl_encoder.reply_ids(turn.reasoning)[:-1])
    assert len({tuple(prompt) for prompt in prompts}) == len(prompts)  # different frames: different columns
    pad = vl_encoder.tokenizer.pad_token_id
    naive = cross_score_images(vl_policy, vision, prompts, samples, method="naive", batch_size=4, pad_id=pad)
    prefix = cross_score_images(vl_policy, vision, prompts, samples, method="prefix", batch_size=3, pad_id=pad)
    assert np.abs(naive.L_sum - prefix.L_sum).max() <= 1e-4
    assert np.isfinite(naive.L_sum).all() and naive.L_sum.std() > 0


def test_kv_reuse_across_turns_is_exact_with_images(vl_policy, vl_encoder: ChatEncoder, demos: list) -> None:
    from recipes.policy.sampler import Sampler

    trajectory = next(t for t in demos if t.num_turns >= 2)
    vision = vl_encoder.vision
    context = vision.encode(vl_encoder, trajectory.turns[1].prompt_messages, trajectory.images[:2],
                            add_generation_prompt=True).input_ids
    first_turn = vision.encode(vl_encoder, trajectory.messages[:3], trajectory.images[:1]).input_ids
    sampler = Sampler(vl_policy, vl_encoder, 8, 1.0, 4096)
    fresh_kv, fresh_logits, fresh_last = sampler._prefill(context)
    kv, _, _ = sampler._prefill(first_turn[:-1])
    sampler.store.put(first_turn[:-1], kv)
    reused_kv, reused_logits, reused_last = sampler._prefill(context)
    assert not sampler.store._by_length[len(first_turn) - 1]  # the cache was taken
    assert reused_last == fresh_last > len(context) - 1 - 2 * 64  # M-RoPE: text after images continues past them
    assert torch.allclose(reused_logits, fresh_logits, atol=1e-4)
    # and the fresh prefill equals the model's own full forward of the whole context
    ids, pixels, grids = vision.resolve(context)
    ids_t = torch.tensor([ids])
    with torch.no_grad():
        full = vl_policy(input_ids=ids_t, pixel_values=pixels, image_grid_thw=grids,
                         position_ids=vision.rope_positions(vl_policy, ids_t, None, grids)).logits[0, -1]
    assert torch.allclose(full, fresh_logits, atol=1e-4)


@pytest.mark.parametrize("observation", ["image", "text"])
def test_two_step_training_run_with_image_observations(train_overrides: list[str], observation: str) -> None:
    """Both modality rows of Table 4 (Qwen2.5-VL reading the grid as an image or as text): PPO's actor and critic
    on the vision-language model. The text row's batches hold no image, and the packed passes
    (`recipes.policy.packing.packs`) must still leave the VL policy and its value head (no `config` of its own) on
    the padded path: the rehearsal's text row failed there once ('VisionCritic' object has no attribute 'config')."""
    from mlflow import MlflowClient

    from recipes.run.training import run_training
    from recipes.stats.rollouts import load_rollout_batch

    overrides = [*MICRO_VL, *train_overrides, "filter=none", "hooks=[collapse]", "diagnostics.mi_every=1",
                 "diagnostics.num_samples=4", f"task.env.observation={observation}"]
    result = run_training(compose_train_config(overrides))
    assert result.status == "finished" and result.steps_done == 2
    client = MlflowClient(next(o.split("=", 1)[1] for o in overrides if o.startswith("mlflow.tracking_uri=")))
    metrics = client.get_run(result.mlflow_run_id).data.metrics
    assert metrics["rollout/update_trajectories"] == 4.0 and np.isfinite(metrics["actor/pg_loss"])
    assert np.isfinite(metrics["critic/vf_loss"])
    frame = load_rollout_batch(client.download_artifacts(result.mlflow_run_id, "rollouts/step_0002.parquet",
                                                         str(Path.cwd())))
    if observation == "text":
        assert "images" not in frame.columns  # text turns: no frame references
        return
    assert all(len(images) == turns for images, turns in zip(frame["images"], frame["turns"], strict=True))
    assert all(len(digest) == 64 for images in frame["images"] for digest in images)  # references, not bytes


def test_mi_diagnostics_score_image_prompts(vl_policy, vl_encoder: ChatEncoder, demos: list) -> None:
    """The collapse hook's sample sets and scorer with frames: first-turn prompts showing different frames are
    different columns, and the MI proxies are computed from the image prompts."""
    from recipes.diagnostics.collapse_hook import turn_encoder
    from recipes.diagnostics.monitor import CollapseMonitor, DiagnosticsConfig, first_turn_set, scorer

    config = DiagnosticsConfig(num_samples=3, batch_size=4)
    encoder = turn_encoder(vl_encoder, {})
    sample_set = first_turn_set(demos, encoder, 3, np.random.default_rng(0))
    assert len(sample_set.prompts) == 3 and all(min(prompt) < 0 for prompt in sample_set.prompts)
    score = scorer(vl_policy, config, vl_encoder.tokenizer.pad_token_id, vl_encoder.vision)
    metrics = CollapseMonitor(config, seed=0).compute(1, score, encoder, demos, None)
    assert metrics["collapse/first_turn/num_samples"] == 3
    assert all(np.isfinite(value) for value in metrics.values())


def test_warm_start_learns_from_image_demonstrations(vl_folder: Path, session_dir: Path, monkeypatch) -> None:
    from recipes.torch_trainer.warmstart import warm_start_folder

    monkeypatch.setenv("ORCH_CACHE_DIR", str(session_dir / "cache"))
    cfg = compose_train_config([*MICRO_VL, "model.warm_start.demos=4", "model.warm_start.epochs=2",
                                "model.warm_start.eval_episodes=2", "model.warm_start.max_response_tokens=8",
                                "model.warm_start.batch_size=2"])
    folder, report = warm_start_folder(cfg.model, vl_folder, "sokoban", dict(cfg.task.env), "cpu")
    assert is_vision_folder(folder) and ImageTokens.from_folder(folder, load_tokenizer(folder)) is not None
    losses = [entry["loss"] for entry in report["history"]]
    assert len(losses) == 2 and losses[1] < losses[0]  # it learns from the image demonstrations


def test_the_warm_starts_retrieval_check_scores_image_prompts(vl_folder: Path, vl_encoder: ChatEncoder) -> None:
    """The warm start's held-out retrieval check cross-scores first turns whose prompts show frames (keyed ids)
    through the image scorer: demonstrations' first turns of 3 image episodes give finite figures, chance 1/3."""
    from envs import demonstration_trajectories
    from recipes.policy.models import load_policy
    from recipes.policy.sampler import Sampler
    from recipes.torch_trainer.warmstart import first_turn_retrieval

    cfg = compose_train_config(MICRO_VL)
    trajectories = demonstration_trajectories("sokoban", 3, seed=0, env_config=dict(cfg.task.env))
    assert all(trajectory.images for trajectory in trajectories)
    sampler = Sampler(load_policy(vl_folder, "float32", "cpu"), vl_encoder, 8, 1.0, 1 << 20)
    figures = first_turn_retrieval(sampler, trajectories)
    assert figures["retrieval_chance"] == pytest.approx(1 / 3)
    assert 0.0 <= figures["first_turn_retrieval"] <= 1.0
