"""A trained policy out of orch as a Hugging Face folder (`orch export SOURCE --hf DIR`).

    folder = resolve_checkpoint("0123abcd...", tracking_uri)   # a run id, a checkpoint dir or one step's folder
    export_hf(folder, Path("out/"))

SOURCE is an MLflow run id (its `orch.checkpoint_dir` tag, newest checkpoint), a torch-backend checkpoint folder
(`trainer.checkpoint_dir`, newest through `latest`) or one checkpoint (`step_000010/`). The policy is rebuilt from the
run's own config (the folder it started from: the preset or `model.path`, warm-started as the run was), loaded with the
checkpoint's weights and saved with `save_pretrained` (safetensors), its tokenizer and chat template, its generation
config, a vision-language model's image processor, and a model card (README.md) with the run's config, data and last
metrics. Everything is written to a scratch folder beside DIR and renamed into place at the end; DIR must not exist or
be empty. A veRL checkpoint (`<checkpoint_dir>/verl/global_step_N/actor`, the newest through veRL's
`latest_checkpointed_iteration.txt`) is merged by veRL's own model merger (`python -m verl.model_merger merge
--backend fsdp`), which writes the weights, config and tokenizer; orch adds the model card.

A LoRA run's policy (`model.lora.rank` > 0) is exported merged by default: the adapters folded into the weights
(W + alpha/rank B A, peft's `merge_and_unload`), an ordinary folder. `adapter=True` (`orch export --adapter`) writes
the adapter alone instead, as peft saves it (adapter_config.json naming the base folder, adapter_model.safetensors),
with the tokenizer and the card; load it with `PeftModel.from_pretrained(base, folder)` or vLLM's LoRA support.
veRL's merger writes a LoRA checkpoint's *base* weights and its adapter beside them (`lora_adapter/`,
verl/model_merger/base_model_merger.py:311-405); orch folds that adapter in (merged) or keeps it alone (adapter).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from orchlib.errors import OrchError

RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def resolve_checkpoint(source: str, tracking_uri: str | None = None) -> Path:
    """The checkpoint that `source` names: a torch-backend one (`step_N/` holding `state.pt`) or a veRL actor folder
    (`global_step_N/actor`). Raises `OrchError` (one line)."""
    from recipes.runtime.checkpoint import STATE_FILE, latest_checkpoint

    path = Path(source).expanduser()
    if not path.exists() and RUN_ID.match(source):
        path = _run_checkpoint_dir(source, tracking_uri)
    if not path.exists():
        raise OrchError(f"{source}: no such checkpoint folder or MLflow run")
    if (path / STATE_FILE).is_file():
        return path
    verl = _verl_actor(path)
    if verl is not None:
        return verl
    newest = latest_checkpoint(path) if path.is_dir() else None
    if newest is None:
        raise OrchError(f"{source}: no complete checkpoint in it (no {STATE_FILE}, no `latest`)")
    return newest


def _verl_actor(path: Path) -> Path | None:
    """The veRL actor checkpoint `path` names (a run's checkpoint dir, its `verl/` folder, a `global_step_N` folder or
    its `actor/`), or None when `path` is no veRL checkpoint."""
    from recipes.runtime.checkpoint import VERL_ITERATION_FILE

    if path.name == "actor" and path.parent.name.startswith("global_step_"):
        return path
    if path.name.startswith("global_step_") and (path / "actor").is_dir():
        return path / "actor"
    folder = path / "verl" if (path / "verl").is_dir() else path
    latest = folder / VERL_ITERATION_FILE
    if latest.is_file():
        step = latest.read_text().strip()
        if not step.isdigit() or not (folder / f"global_step_{step}" / "actor").is_dir():
            raise OrchError(f"{latest}: names step {step!r}, whose actor checkpoint is missing")
        return folder / f"global_step_{step}" / "actor"
    return None


def _run_checkpoint_dir(run_id: str, tracking_uri: str | None) -> Path:
    from recipes.run.tracking import check_tracking_uri, default_tracking_uri, mlflow_client

    uri = default_tracking_uri(tracking_uri)
    check_tracking_uri(uri, "--tracking-uri")
    try:
        run = mlflow_client(uri).get_run(run_id)
    except Exception:  # MLflow raises its own error for an unknown id
        raise OrchError(f"{run_id}: no such run in {uri}") from None
    folder = run.data.tags.get("orch.checkpoint_dir")
    if not folder:
        raise OrchError(f"{run_id}: the run names no checkpoint folder (tag orch.checkpoint_dir)")
    return Path(folder)


def run_metrics(source: str, tracking_uri: str | None) -> dict[str, float] | None:
    """The last logged value of every metric of run `source` (None when `source` is not a run id)."""
    if Path(source).expanduser().exists() or not RUN_ID.match(source):
        return None
    from recipes.run.tracking import default_tracking_uri, mlflow_client

    return dict(mlflow_client(default_tracking_uri(tracking_uri)).get_run(source).data.metrics)


def check_target(out: Path) -> None:
    """DIR may be written: it does not exist or is an empty folder, and its parent can be written."""
    from recipes.run.tracking import check_writable_folder

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OrchError(f"--hf {out}: exists and is not an empty folder")
    check_writable_folder(out.parent, "--hf")


def export_hf(checkpoint: Path, out: Path, metrics: dict[str, float] | None = None, adapter: bool = False) -> Path:
    """Write the policy of `checkpoint` to `out` as a Hugging Face folder, or with `adapter` a LoRA run's adapter
    alone (see the module docstring)."""

    from recipes.policy.models import load_tokenizer
    from recipes.policy.vision import is_vision_folder

    check_target(out)
    if checkpoint.name == "actor":
        return _export_verl(checkpoint, out, metrics or {}, adapter)
    cfg, base, policy, state = load_trained(checkpoint, merge=not adapter)
    if adapter and not cfg.model.lora.enabled:
        raise _no_adapter(checkpoint)
    scratch = out.parent / f".{out.name}.export-tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        if adapter:
            policy.peft_config["default"].base_model_name_or_path = str(base)
        policy.eval().save_pretrained(scratch, safe_serialization=True)
        load_tokenizer(base).save_pretrained(scratch)
        if is_vision_folder(base):
            from transformers import AutoProcessor

            AutoProcessor.from_pretrained(base).save_pretrained(scratch)
        (scratch / "README.md").write_text(model_card(cfg, checkpoint, state, metrics or {}, base if adapter else None))
        if out.exists():
            out.rmdir()  # empty (checked above)
        scratch.rename(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def load_trained(checkpoint: Path, merge: bool = True) -> tuple[Any, Path, Any, dict[str, Any]]:
    """(the run's `TrainConfig`, the folder it started from, its policy with the checkpoint's weights, the
    checkpoint's state) of a torch-backend checkpoint. A LoRA run's policy comes with its adapters folded in (a plain
    model), or with `merge` false as peft's wrapper (`PeftModel`). OrchError when it is not one or its weights do not
    fit."""
    import yaml

    from recipes.config.schema import TrainConfig
    from recipes.policy.lora import add_adapters
    from recipes.policy.models import load_policy
    from recipes.runtime.checkpoint import load_checkpoint
    from recipes.torch_trainer.warmstart import model_folder

    state = load_checkpoint(checkpoint)
    if "policy" not in state or "config" not in state:
        raise OrchError(f"{checkpoint}: not a torch-backend checkpoint (no policy or config in it)")
    cfg = TrainConfig.from_tree(yaml.safe_load(state["config"]))
    base, _ = model_folder(cfg)  # the folder the run started from (cached; rebuilt the same way if it is gone)
    policy = load_policy(base, "float32", "cpu")
    wrapped = add_adapters(policy, cfg.model.lora) if cfg.model.lora.enabled else None
    try:
        policy.load_state_dict(state["policy"])
    except RuntimeError as err:
        raise OrchError(f"{checkpoint}: its weights do not fit the run's model ({str(err).splitlines()[0]})") from None
    if wrapped is not None:
        policy = wrapped.merge_and_unload() if merge else wrapped
    return cfg, base, policy, state


def verl_merge(actor: Path, target: Path) -> Path:
    """veRL's model merger on the actor checkpoint `actor` into `target`, as veRL writes it (a LoRA checkpoint: the
    base weights, and the adapter in `target/lora_adapter`). OrchError (one line) when it fails."""
    import subprocess
    import sys

    merged = subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir",
                             str(actor), "--target_dir", str(target)], capture_output=True, text=True)
    if merged.returncode != 0:
        last = (merged.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise OrchError(f"{actor}: veRL's model merger failed: {last}")
    return target


def _export_verl(actor: Path, out: Path, metrics: dict[str, float], adapter: bool = False) -> Path:
    """veRL's model merger on a veRL actor checkpoint, into a scratch folder renamed to `out`, plus a model card; a
    LoRA checkpoint's adapter folded in, or with `adapter` kept alone (the module docstring)."""
    scratch = out.parent / f".{out.name}.export-tmp"
    raw = out.parent / f".{out.name}.export-raw"
    for folder in (scratch, raw):
        shutil.rmtree(folder, ignore_errors=True)
    try:
        verl_merge(actor, raw)
        lora = raw / VERL_ADAPTER_DIR
        if adapter and not lora.is_dir():
            raise _no_adapter(actor)
        how = "merged by veRL's model merger (`python -m verl.model_merger merge --backend fsdp`)"
        if adapter:
            shutil.copytree(lora, scratch)
            _copy_tokenizer(raw, scratch)
            how += "; its LoRA adapter alone (base weights not included)"
            load = ("Load it on the run's base model: `PeftModel.from_pretrained(AutoModelForCausalLM."
                    "from_pretrained(base), folder)` (the base: the model folder the run started from).")
        elif lora.is_dir():
            _fold_adapter(raw, lora, scratch)
            how += ", its LoRA adapter folded into the weights"
            load = "Load it with `AutoModelForCausalLM.from_pretrained(folder)` (or vLLM)."
        else:
            raw.rename(scratch)
            load = "Load it with `AutoModelForCausalLM.from_pretrained(folder)` (or vLLM)."
        lines = ["# Policy trained by orch (veRL backend)", "", f"- checkpoint: {actor}, {how}", "", load, ""]
        if metrics:
            lines += ["## Last logged metrics", "", *[f"- {k}: {v:.4g}" for k, v in sorted(metrics.items())], ""]
        (scratch / "README.md").write_text("\n".join(lines))
        if out.exists():
            out.rmdir()
        scratch.rename(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(raw, ignore_errors=True)
    return out


def _no_adapter(checkpoint: Path) -> OrchError:
    return OrchError(f"--adapter: {checkpoint} was trained without LoRA (model.lora.rank 0), it has no adapter; "
                     "drop --adapter to export the whole model")


VERL_ADAPTER_DIR = "lora_adapter"  # where veRL's model merger puts a LoRA checkpoint's adapter (base_model_merger.py:395)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "added_tokens.json")


def _copy_tokenizer(source: Path, target: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def _fold_adapter(base: Path, lora: Path, target: Path) -> None:
    """The model in `base` with the peft adapter in `lora` folded into its weights, saved to `target` (a new folder:
    `base`'s files may be memory-mapped while it loads) with `base`'s tokenizer and generation config."""
    from peft import PeftModel

    from recipes.policy.models import load_policy

    model = PeftModel.from_pretrained(load_policy(base, "float32", "cpu"), lora).merge_and_unload()
    model.save_pretrained(target, safe_serialization=True)
    _copy_tokenizer(base, target)


def model_card(cfg: Any, checkpoint: Path, state: dict[str, Any], metrics: dict[str, float],
               adapter_base: Path | None = None) -> str:
    """README.md of an exported folder: what was trained, on what, how, and how it scored (`adapter_base`: the
    folder is a LoRA adapter alone, of that base model)."""
    from envs.registry import env_class

    source = env_class(cfg.task.name).data
    data = ("built-in/generated data: " + source.builtin if source is not None and source.uses_builtin(cfg.task.env)
            else f"task.env.{source.key} = {cfg.task.env.get(source.key)}" if source is not None and source.key
            else "the environment's own generator")
    lines = [
        f"# {cfg.model.name} trained by orch on {cfg.task.name}",
        "",
        f"- algorithm: {cfg.algorithm.name}, filter: {cfg.filter.name}, backend: {cfg.backend}",
        f"- checkpoint: {checkpoint} (MLflow run {state.get('mlflow_run_id', 'unknown')})",
        f"- data: {data}",
        f"- started from: {cfg.model.path or 'the built-in ' + cfg.model.name + ' preset'}"
        + (" with orch's warm start" if cfg.model.warm_start.enabled else ""),
        "",
        "Load it with `AutoModelForCausalLM.from_pretrained(folder)` (or vLLM); the chat template is the tokenizer's.",
        "",
    ]
    lora = cfg.model.lora
    if lora.enabled:
        lines[-2] = (f"LoRA: rank {lora.rank}, alpha {lora.alpha}, target modules {lora.target_modules}; "
                     + (f"this folder is the adapter alone, of the base model {adapter_base}: load it with "
                        "`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder)`."
                        if adapter_base is not None else "the adapter is folded into these weights. " + lines[-2]))
    if metrics:
        lines += ["## Last logged metrics", "", *[f"- {key}: {value:.4g}" for key, value in sorted(metrics.items())],
                  ""]
    import yaml

    lines += ["## The run's config", "", "```yaml", yaml.safe_dump(cfg.to_tree(), sort_keys=False).rstrip(), "```",
              ""]
    return "\n".join(lines)
