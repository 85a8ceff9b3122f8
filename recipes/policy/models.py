"""Policy and value models: tiny Qwen2 presets built in code, or any local Hugging Face checkpoint.

A preset is a randomly initialised `Qwen2ForCausalLM` with a byte-level BPE tokenizer trained on the tasks'
protocol text (`recipes.policy.tokenizer`), saved as an ordinary Hugging Face folder in the cache (built once per hash of
its inputs). A preset with a `vision` section (`model=tiny_vl`) is a randomly initialised Qwen2.5-VL
(`Qwen2_5_VLForConditionalGeneration`: the same text model plus a small vision tower), its tokenizer the same one
plus the image tokens, and a PIL image processor. Everything downstream loads a folder, preset or not, text or
vision-language, the same way (`is_vision_folder` tells which).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchlib.errors import OrchError
from recipes.runtime.cache import cache_root, cached_folder

if TYPE_CHECKING:
    import torch


INIT_SEED = 0  # presets are initialised identically in every run, so a sweep shares one warm start
CORPUS_DEMOS_PER_TASK = 32
PRESET_FORMAT = 2  # bump when the way presets are built changes
VISION_PRESET_FORMAT = 1  # bump when the way vision-language presets are built changes (text presets keep theirs)


def protocol_corpus(demos_per_task: int = CORPUS_DEMOS_PER_TASK) -> list[str]:
    """Tokenizer training text: role names and every message of solver demonstrations of every task."""
    from envs import demonstrations, list_envs

    corpus = ["system", "user", "assistant"]
    for task in list_envs():
        for transcript in demonstrations(task, demos_per_task, seed=0):
            corpus.extend(message["content"] for message in transcript)
    return corpus


def text_sha(texts: list[str]) -> str:
    """SHA-256 of a list of strings (order matters)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@contextlib.contextmanager
def quiet_save() -> Iterator[None]:
    """Transformers' "Writing model shards" progress bar off while a model orch builds in seconds (a preset, a warm
    start) is saved: it is noise in `orch sweep`'s and `orch tune`'s output. Restores the setting it found."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def save_initialised(model_class: Any, config: Any, tokenizer: Any, folder: Path) -> None:
    """Initialise `model_class(config)` from `INIT_SEED` (without touching the caller's RNG), stop generation on the
    tokenizer's end of turn, and save model and tokenizer to `folder`."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(INIT_SEED)
        model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    with quiet_save():
        model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def build_preset(preset: dict[str, Any], corpus: list[str], folder: Path) -> None:
    """Train the tokenizer on `corpus`, initialise a Qwen2 causal LM of shape `preset`, save both to `folder`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from recipes.policy.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(corpus, int(preset["vocab_size"]))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=preset["hidden_size"],
        num_hidden_layers=preset["num_hidden_layers"],
        num_attention_heads=preset["num_attention_heads"],
        num_key_value_heads=preset["num_key_value_heads"],
        intermediate_size=preset["intermediate_size"],
        max_position_embeddings=preset["max_position_embeddings"],
        tie_word_embeddings=preset["tie_word_embeddings"],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    save_initialised(Qwen2ForCausalLM, config, tokenizer, folder)


def build_vision_preset(preset: dict[str, Any], corpus: list[str], folder: Path) -> None:
    """Like `build_preset`, as a Qwen2.5-VL: the text model of `preset`, a vision tower of `preset["vision"]`, the
    tokenizer plus the image tokens, and a PIL image processor (frames resized to at most `max_pixels`)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from recipes.policy.tokenizer import VISION_TOKENS, train_tokenizer

    vision = preset["vision"]
    tokenizer = train_tokenizer(corpus, int(preset["vocab_size"]), extra_special=VISION_TOKENS)
    start, image, end, video = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    half_head = preset["hidden_size"] // preset["num_attention_heads"] // 2
    temporal = half_head // 4
    sections = [temporal, (half_head - temporal) // 2, half_head - temporal - (half_head - temporal) // 2]
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": preset["hidden_size"],
            "num_hidden_layers": preset["num_hidden_layers"], "num_attention_heads": preset["num_attention_heads"],
            "num_key_value_heads": preset["num_key_value_heads"], "intermediate_size": preset["intermediate_size"],
            "max_position_embeddings": preset["max_position_embeddings"],
            "tie_word_embeddings": preset["tie_word_embeddings"],
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": sections},
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None,
        },
        vision_config={
            "depth": vision["depth"], "hidden_size": vision["hidden_size"],
            "intermediate_size": vision["intermediate_size"], "num_heads": vision["num_heads"],
            "patch_size": vision["patch_size"], "spatial_merge_size": vision["merge_size"], "temporal_patch_size": 2,
            "window_size": vision["patch_size"] * vision["merge_size"] * 4, "out_hidden_size": preset["hidden_size"],
            "fullatt_block_indexes": list(range(vision["depth"])),
        },
        image_token_id=image, video_token_id=video, vision_start_token_id=start, vision_end_token_id=end,
        tie_word_embeddings=preset["tie_word_embeddings"], eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    save_initialised(Qwen2_5_VLForConditionalGeneration, config, tokenizer, folder)
    Qwen2VLImageProcessorPil(
        min_pixels=(vision["patch_size"] * vision["merge_size"]) ** 2, max_pixels=vision["max_pixels"],
        patch_size=vision["patch_size"], merge_size=vision["merge_size"], temporal_patch_size=2,
    ).save_pretrained(folder)


def preset_folder(model_cfg: Any) -> Path:  # a recipes.config.schema.ModelConfig (not imported: config -> backends -> here)
    """The cached folder of the preset `model_cfg.preset` (built on first use)."""
    preset = model_cfg.preset.model_dump()
    corpus = protocol_corpus()
    inputs = {"preset": preset, "corpus_sha256": text_sha(corpus), "init_seed": INIT_SEED, "format": PRESET_FORMAT}
    build = build_preset
    if preset.get("vision"):
        inputs["vision_format"], build = VISION_PRESET_FORMAT, build_vision_preset
    return cached_folder(
        "presets", inputs, lambda folder: build(preset, corpus, folder), cache_root(model_cfg.cache_dir)
    )


def base_model_folder(model_cfg: Any) -> Path:  # a recipes.config.schema.ModelConfig
    """`model.path` if set (a local Hugging Face checkpoint), else the preset's cached folder."""
    if model_cfg.path is not None:
        path = Path(str(model_cfg.path)).expanduser()
        if not (path / "config.json").is_file():
            raise OrchError(f"config key model.path: {path} is not a Hugging Face checkpoint folder (no config.json)")
        return path
    return preset_folder(model_cfg)


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer, with padding on the right (training layout) and a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_policy(folder: Path, dtype: str, device: str) -> torch.nn.Module:
    """The causal LM in `folder` (a vision-language one: its image-text-to-text model) on `device`, in training
    mode."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from recipes.policy.vision import is_vision_folder

    auto = AutoModelForImageTextToText if is_vision_folder(folder) else AutoModelForCausalLM
    model = auto.from_pretrained(folder, dtype=torch_dtype(dtype))
    return model.to(device).train()


def load_critic(folder: Path, dtype: str, device: str) -> torch.nn.Module:
    """A value model: the backbone of `folder` with a fresh scalar head per token (veRL's critic layout), its head's
    dropout off as veRL sets it (verl/workers/engine/fsdp/transformer_impl.py:297, `classifier_dropout = 0.0`):
    transformers' token-classification head otherwise falls back to 0.1 for a config without the key (Qwen2's), and
    the values scored for GAE and the critic's loss would be drawn through a random mask."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging

    from recipes.policy.vision import VisionCritic, is_vision_folder

    if is_vision_folder(folder):
        backbone = load_policy(folder, dtype, device).base_model
        return VisionCritic(backbone).to(device=device, dtype=torch_dtype(dtype)).train()
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # "newly initialised weights: score" is expected
    try:
        config = AutoConfig.from_pretrained(folder, num_labels=1)
        config.classifier_dropout = 0.0
        critic = AutoModelForTokenClassification.from_pretrained(folder, config=config, dtype=torch_dtype(dtype))
    finally:
        logging.set_verbosity(verbosity)
    return critic.to(device).train()


def count_parameters_in(folder: Path) -> int:
    """Parameters of the model saved in `folder`, read from its safetensors headers (no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118  (safe_open is not a mapping)
                shape = handle.get_slice(key).get_shape()
                total += math.prod(shape)
    return total


def count_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
