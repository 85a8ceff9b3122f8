"""Whether a folder is a Hugging Face checkpoint this project can load, from its file names and config.json alone
(no weights, no tokenizer loaded): the check `orch train`, every sweep job, preflight, export and the GPU smoke
script share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # one of them: a tokenizer transformers can load
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def missing_folder_line(folder: Path) -> str:
    """A model folder that does not exist: its absolute path (a relative one is read from the current folder) and
    where a checkpoint comes from."""
    name = folder.name or str(folder)
    repo = f"Qwen/{name}" if name.lower().startswith("qwen") else "ORG/MODEL"
    shown = f"{folder} ({folder.absolute()})" if not folder.is_absolute() else str(folder)
    return (f"{shown}: no such folder; a Hugging Face checkpoint folder is expected there: download one (e.g. `hf "
            f"download {repo} --local-dir {folder.absolute()}`), copy it from your cluster's model store, or point "
            "model.path at it (a relative path is read from the folder orch runs in)")


def hf_folder_problems(path: str | Path) -> list[str]:
    """Why the folder at `path` is not a Hugging Face checkpoint this project can load, one line each (empty: it
    is one): config.json readable with an architecture transformers knows, a tokenizer, the weights (every shard an
    index names). Reads file names and config.json only: no weights, no tokenizer loaded."""
    import json

    folder = Path(str(path)).expanduser()
    if not folder.is_dir():
        return [missing_folder_line(folder)]
    problems = []
    try:
        config = json.loads((folder / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return [f"{folder}: no config.json (not a Hugging Face checkpoint folder)"]
    except (OSError, ValueError) as err:
        return [f"{folder / 'config.json'}: unreadable ({err})"]
    problems += [f"{folder / 'config.json'}: {line}" for line in _architecture_problems(config)]
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"{folder}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                problems.append(f"{index}: unreadable ({err})")
                break
            missing = sorted(shard for shard in shards if not (folder / shard).is_file())
            if missing:
                problems.append(f"{folder}: {len(missing)} of {len(shards)} weight shards missing "
                                f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
            break
    else:
        if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
            problems.append(f"{folder}: no weights (no *.safetensors, no pytorch_model*.bin)")
    return problems


def missing_files(line: str) -> bool:
    """Whether a line of `hf_folder_problems` says files are still missing from a folder whose config.json is there
    (the tokenizer, the weights, some weight shards): what a user copies in later, not a broken folder."""
    return line.endswith(")") and any(mark in line for mark in (": no tokenizer (", ": no weights (",
                                                                   " weight shards missing ("))


def _architecture_problems(config: dict[str, Any]) -> list[str]:
    """An unknown model_type or architecture (one this transformers cannot build)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        return [f"model_type {model_type!r} is unknown to transformers {transformers.__version__}"]
    architectures = config.get("architectures") or []
    unknown = [name for name in architectures if not hasattr(transformers, str(name))]
    if not architectures:
        return ["no `architectures` entry (which model class to build)"]
    if unknown:
        return [f"architecture {unknown[0]!r} is unknown to transformers {transformers.__version__}"]
    return []
