"""Preflight of one verl-backend cell, on any host, before anything is submitted (`orch sweep FILE --preflight`).

    report = preflight_cell(cfg, nodes=1, gpus_per_node=4, gpu_mem_gb=80)
    report.problems       # every problem found, one line each (never only the first)
    report.needs          # what only the user can supply (below), apart from the problems
    report.memory         # recipes.verl.memory.MemoryEstimate, or None without an architecture

What runs, in order, each step collecting its problems instead of stopping at the first:

1. the model folder (`model.path`): a loadable Hugging Face checkpoint (`recipes.policy.models.hf_folder_problems`), and
   the data file the task reads (`task.env.<data key>`);
2. the prompt budget as the job measures it (`recipes.verl.data`): with the folder's tokenizer when there is one,
   else from the prompts' characters (`CHARS_PER_TOKEN`, a documented fallback);
3. veRL's full config for the cell, built by `recipes.verl.config_map` exactly as the job builds it (only the file
   names are placeholders), and veRL's own `validate_config` on it;
4. what veRL finds only when its workers or vLLM start, after the queue wait: tensor parallelism vs the GPUs and
   the attention heads, max model length vs prompt + every turn's reply and the model's positions, the micro-batch
   token budget vs one sequence, the batch vs the workers it is split over (samples per prompt vs the groups the
   algorithm and filter need is checked when the config is validated, on both backends);
5. memory (`recipes.verl.memory`), from the folder's config.json, else `model_config`, else the built-in table.

What only the user can supply -- a model folder or data file that is not on this host, an architecture preflight
does not know -- is listed apart (`needs`), not among the problems: a preflight report on a laptop is complete
without the checkpoints; a submission (`orch sweep`, orchestrator.preflight.fit_gate) stops on it.

A sweep checks dozens of configs that differ in a few keys, so what they share is computed once per
`PreflightCache` (one per plan, `orchestrator.preflight.preflight_plan`): veRL's `ppo_trainer` config is composed
by Hydra once, and each cell's overrides (`recipes.verl.config_map.verl_overrides`, parsed once per distinct line by
Hydra's own parser) are applied to an unpickled copy of it by Hydra's own `_apply_overrides_to_config` -- what
`compose` does after the defaults list, so the config is the one the job composes (a test compares them), less the `orch` node
(the TrainConfig, which no check reads); a cell whose overrides differ only in veRL's experiment name (the cell's
digest: filters, the MI settings) shares its class-mate's config and veRL's verdict on it; the built-in preset's
tokenizer folder and the stand-in config.json folders are made once. `fit_only` skips veRL's `validate_config` (and
so the import of veRL and torch): the memory and start-up checks alone (`orch paper --check`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.config.schema import TrainConfig
from recipes.verl.memory import (
    Architecture,
    MemoryEstimate,
    MemorySetup,
    builtin_architecture,
    estimate_memory,
)

# Without a tokenizer, a prompt's tokens are estimated from its characters. Qwen2.5's and Llama 3's BPE average about
# 3.5-4 characters per token on the tasks' English text and grids; 3 over-counts on purpose (a budget too large only
# costs context; one too small stops the job), plus the chat template's tokens per message.
CHARS_PER_TOKEN = 3.0
TEMPLATE_TOKENS_PER_MESSAGE = 8
_LONGEST: dict[tuple[Any, ...], int] = {}  # longest first prompt per (task, env, seed, tokenizer): cells share them


@dataclass
class CellPreflight:
    """What preflight found for one cell."""

    model: str  # the model path, or the built-in preset's name
    problems: list[str] = field(default_factory=list)
    memory: MemoryEstimate | None = None
    architecture: Architecture | None = None
    architecture_source: str = ""  # "config.json" | "--model-config" | "built-in table" | ""
    prompt_tokens: int = 0  # the prompt budget (the longest first prompt with its margin)
    prompt_source: str = ""  # "tokenizer" | "characters"
    world: int = 1
    needs: list[str] = field(default_factory=list)  # what only the user can supply (module docstring)
    fit: list[str] = field(default_factory=list)  # the problems of the start-up and memory checks (in `problems` too)


# veRL's run name: the cell's digest (or run name), read by no check; configs that differ only in it share one
_RUN_NAME = "trainer.experiment_name="


class PreflightCache:
    """What the cells of a plan share (module docstring): use one per plan, `with PreflightCache() as cache:`, and
    pass it to every `preflight_cell`. `fit_only`: skip veRL's `validate_config`."""

    def __init__(self, fit_only: bool = False) -> None:
        self.fit_only = fit_only
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._base: Any = None  # veRL's ppo_trainer composed without overrides, pickled (False: composing failed)
        self._group_exists: Any = None
        self._parsed: dict[str, Any] = {}
        self._configs: dict[tuple[str, ...], tuple[Any, list[str]]] = {}
        self._presets: dict[str, Path] = {}
        self._standins: dict[str, str] = {}
        self.composed = 0  # configs composed (the rest were shared)
        self.validated = 0  # veRL validations run

    def __enter__(self) -> PreflightCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the stand-in folders."""
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
        self._standins.clear()
        self._configs.clear()

    def preset_folder(self, model_cfg: Any) -> Path:
        """`recipes.policy.models.preset_folder`, once per preset and cache folder."""
        from recipes.policy.models import preset_folder

        key = json.dumps([model_cfg.preset.model_dump(), str(model_cfg.cache_dir), os.environ.get("ORCH_CACHE_DIR")],
                         sort_keys=True, default=str)
        if key not in self._presets:
            self._presets[key] = preset_folder(model_cfg)
        return self._presets[key]

    def standin(self, arch: Architecture) -> str:
        """A folder holding `arch`'s config.json (veRL's validation reads it), once per architecture."""
        text = json.dumps(arch.config_json(), sort_keys=True)
        if text not in self._standins:
            if self._scratch is None:
                self._scratch = tempfile.TemporaryDirectory(prefix="orch-preflight-")
            folder = Path(self._scratch.name) / f"model-{len(self._standins)}"
            folder.mkdir()
            (folder / "config.json").write_text(text)
            self._standins[text] = str(folder)
        return self._standins[text]

    def config(self, cfg: TrainConfig, job: Any) -> tuple[Any, list[str]]:
        """veRL's config for `cfg` on `job` and veRL's `validate_config` problems with it (empty: it passed, or
        `fit_only`), each computed once per distinct overrides (module docstring). Raises what Hydra raises on an
        override it cannot apply."""
        from recipes.verl.config_map import verl_config, verl_overrides

        lines = verl_overrides(cfg, job)
        key = tuple(line for line in lines if not line.startswith(_RUN_NAME))
        if key not in self._configs:
            parsed = self._parse(lines)
            if parsed is None:  # a config-group override (or no base): Hydra composes it whole, as the job does
                config = verl_config(cfg, job)
            else:
                from hydra._internal.config_loader_impl import ConfigLoaderImpl

                config = pickle.loads(self._base)  # a copy: 7x faster than copy.deepcopy of a DictConfig
                ConfigLoaderImpl._apply_overrides_to_config(parsed, config)
            self.composed += 1
            self._configs[key] = (config, [] if self.fit_only else _validation_problems(config, self))
        return self._configs[key]

    def _parse(self, lines: list[str]) -> list[Any] | None:
        """Hydra's parse of each override line (once per line), or None when one is not a plain value override
        (a config group, a package, a deletion, a Hydra key) or veRL's base config cannot be composed here."""
        if self._base is None:
            self._base = _compose_base(self)
        if self._base is False:
            return None
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = None
        parsed = []
        for line in lines:
            if line not in self._parsed:
                parser = parser or OverridesParser.create()
                self._parsed[line] = parser.parse_override(line)
            override = self._parsed[line]
            if (override.package is not None or override.is_delete() or override.is_hydra_override()
                    or self._group_exists(override.key_or_group)):
                return None
            parsed.append(override)
        return parsed


def _compose_base(cache: PreflightCache) -> Any:
    """veRL's `ppo_trainer` config as Hydra's `compose` returns it without overrides (struct mode, no `hydra` node),
    read from veRL's config folder without importing veRL (which imports torch), pickled; False if it cannot be."""
    import importlib.util

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return False
    folder = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            base = compose(config_name="ppo_trainer")
            cache._group_exists = GlobalHydra.instance().config_loader().repository.group_exists
    except Exception:  # noqa: BLE001 - the job's own composition (verl_config) then says why
        return False
    finally:
        GlobalHydra.instance().clear()
    return pickle.dumps(base)


def _validation_problems(config: Any, cache: PreflightCache) -> list[str]:
    """veRL's own `validate_config` on `config`, offline (a bad path must fail here, not wait on the Hub), its
    notices silenced: [] when it passes, else its one-line reason."""
    offline = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(dict.fromkeys(offline, "1"))
    cache.validated += 1
    try:
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # its notices and warnings
            warnings.simplefilter("ignore")
            validate_config(config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
    except Exception as err:  # veRL raises AssertionError, ValueError or its dataclasses' errors
        line = f"veRL's validate_config: {type(err).__name__}: {_one_line(err)}"
        if "vllm version None" in line:  # veRL checks vLLM's version for a LoRA actor (its rollout loads adapters)
            line += (" -- vLLM is not installed where this check ran: a LoRA cell needs it (orch's `gpu` extra, "
                     "scripts/setup_gpu.sh, as on the GPU nodes: docs/verl.md#the-gpu-stack)")
        return [line]
    finally:
        for key, value in offline.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return []


def preflight_cell(cfg: TrainConfig, nodes: int, gpus_per_node: int, gpu_mem_gb: float,
                   model_config: dict[str, Any] | None = None, cache: PreflightCache | None = None) -> CellPreflight:
    """Every check of the module docstring on `cfg` hosted on `nodes` x `gpus_per_node` GPUs of `gpu_mem_gb`;
    `cache`: what this cell shares with the others of its plan (without one, a cache of its own)."""
    if cache is None:
        with PreflightCache() as own:
            return preflight_cell(cfg, nodes, gpus_per_node, gpu_mem_gb, model_config, own)
    from recipes.policy.algorithms import get_algorithm

    cpu = cfg.trainer.device == "cpu"
    gpus = 1 if cpu else gpus_per_node
    report = CellPreflight(model=str(cfg.model.path) if cfg.model.path else f"preset {cfg.model.name}",
                           world=max(1, nodes * gpus))
    if not cpu and gpus_per_node < 1:
        report.problems.append(f"trainer.device is cuda, but the cell asks for {gpus_per_node} GPUs per node "
                               "(resources.gpus_per_node)")
    folder = _model_folder(cfg, report, cache)
    _data_problems(cfg, report)
    report.architecture, report.architecture_source = _architecture(cfg, folder, model_config, report)
    longest = _longest_prompt(cfg, folder, report)
    config = _verl_config(cfg, nodes, gpus, folder, report, cache)
    if config is None:
        return report
    uses_critic = get_algorithm(cfg.algorithm.name).uses_critic
    before = len(report.problems)
    _runtime_problems(cfg, config, longest, report)
    if report.architecture is not None and not cpu:
        report.memory = estimate_memory(report.architecture, MemorySetup.from_verl(
            config, world=report.world, gpu_mem_gb=gpu_mem_gb, critic=uses_critic))
        report.problems += [f"memory: {line}" for line in report.memory.problems]
    report.fit = report.problems[before:]
    return report


def _model_folder(cfg: TrainConfig, report: CellPreflight, cache: PreflightCache) -> Path | None:
    """The folder whose tokenizer and config.json preflight may read: `model.path` when it is a loadable
    checkpoint, the built-in preset's cached folder when there is no path (built on first use), else None. A folder
    that is not on this host, or whose weights or tokenizer are not there yet (a config.json alone: planning before
    the checkpoint is copied), is a need, each missing part named; one that is there but not loadable, a problem."""
    from recipes.runtime.hf_folder import hf_folder_problems, missing_files

    if cfg.model.path is None:
        return cache.preset_folder(cfg.model)
    found = hf_folder_problems(cfg.model.path)
    absent = not Path(str(cfg.model.path)).expanduser().is_dir()
    for line in found:
        (report.needs if absent or missing_files(line) else report.problems).append(f"model.path: {line}")
    return None if found else Path(str(cfg.model.path)).expanduser()


def _data_problems(cfg: TrainConfig, report: CellPreflight) -> None:
    """The data file the task reads, when the cell names one, exists (a need when it does not; its format is
    checked when the job loads it, a suffix its loader cannot read is a problem)."""
    missing = cfg.missing_data_file()
    if missing is not None:
        key, why = missing
        absent = not Path(str(cfg.task.env[key.removeprefix("task.env.")])).expanduser().exists()
        (report.needs if absent else report.problems).append(f"{key}: {why}")


def _architecture(cfg: TrainConfig, folder: Path | None, model_config: dict[str, Any] | None,
                  report: CellPreflight) -> tuple[Architecture | None, str]:
    """The architecture memory is estimated for: the folder's config.json (`model.path`'s, even while its weights or
    tokenizer are missing), `model_config`, the built-in table."""
    candidates: list[tuple[dict[str, Any] | None, str]] = []
    if folder is None and cfg.model.path is not None:
        folder = Path(str(cfg.model.path)).expanduser()
    if folder is not None and (folder / "config.json").is_file():
        with contextlib.suppress(OSError, ValueError):
            candidates.append((json.loads((folder / "config.json").read_text()), "config.json"))
    candidates.append((model_config, "--model-config"))
    for config, source in candidates:
        if isinstance(config, dict):
            try:
                return Architecture.from_config(config, name=report.model), source
            except ValueError as err:
                report.problems.append(f"{source}: {err}")
    if cfg.model.path is not None:
        builtin = builtin_architecture(str(cfg.model.path))
        if builtin is not None:
            return builtin, "built-in table"
        if cfg.trainer.device != "cpu":
            report.needs.append(f"memory: no config.json for {cfg.model.path} and no built-in architecture of "
                                "that name: pass --model-config FILE (a config.json) to estimate it")
    return None, ""


def _longest_prompt(cfg: TrainConfig, folder: Path | None, report: CellPreflight) -> int:
    """Tokens of the longest first prompt (unrounded), with the folder's tokenizer or from characters. A data file
    that is missing here is replaced by the task's built-in set for this measurement (its problem is listed)."""
    from recipes.verl.data import budget_for, longest_first_prompt

    measured = cfg
    missing = cfg.missing_data_file()
    if missing is not None:
        key = missing[0].removeprefix("task.env.")
        measured = cfg.model_copy(update={"task": cfg.task.model_copy(update={"env": {**cfg.task.env, key: None}})})
    count = None
    if folder is not None and any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        try:
            from recipes.policy.models import load_tokenizer
            from recipes.verl.data import chat_token_count

            count = chat_token_count(load_tokenizer(folder))
            report.prompt_source = "tokenizer"
        except Exception as err:  # a tokenizer transformers cannot load is a problem of the folder, listed here
            report.problems.append(f"model.path: its tokenizer does not load ({type(err).__name__}: {err})")
    if count is None:
        count = lambda messages: sum(  # noqa: E731
            -(-len(str(m.get("content", ""))) // int(CHARS_PER_TOKEN)) + TEMPLATE_TOKENS_PER_MESSAGE for m in messages)
        report.prompt_source = "characters"
    key = (measured.task.name, json.dumps(measured.task.env, sort_keys=True, default=str), measured.seed,
           measured.trainer.prompts_per_step,
           str(folder), report.prompt_source)
    try:
        if key not in _LONGEST:
            _LONGEST[key] = longest_first_prompt(measured, count)
        longest = _LONGEST[key]
    except (OSError, ValueError) as err:
        report.problems.append(f"task {cfg.task.name}: its first prompts cannot be built ({err})")
        return 0
    report.prompt_tokens = budget_for(longest)
    return longest


def _verl_config(cfg: TrainConfig, nodes: int, gpus: int, folder: Path | None, report: CellPreflight,
                 cache: PreflightCache) -> Any:
    """veRL's config for the cell as the job builds it (placeholders for the files it writes at run time), checked
    by veRL's own `validate_config` (unless `cache.fit_only`); None (with the problem listed) if it cannot be built.
    veRL's validation loads the model's config.json: where the checkpoint is not on this host, a stand-in folder
    with the architecture's config.json and the built-in preset's tokenizer takes its place (nothing is
    downloaded)."""
    from recipes.verl.config_map import VerlJob

    budget = min(report.prompt_tokens or 64, cfg.trainer.max_context_tokens // 2)
    model_path = tokenizer_path = str(folder) if folder is not None else ""
    if folder is None:
        if report.architecture is None:
            report.needs.append("veRL's validate_config and the memory estimate not run: no model folder on this "
                                "host and no architecture to stand in for it (--model-config FILE)")
            return None
        if cache.fit_only:  # nothing reads the folders: no stand-in, no preset tokenizer built
            model_path, tokenizer_path = "<model folder>", "<tokenizer folder>"
        else:
            model_path = cache.standin(report.architecture)
            tokenizer_path = str(cache.preset_folder(cfg.model.model_copy(update={"path": None})))
    job = VerlJob(model_path=model_path, tokenizer_path=tokenizer_path, train_file="<train prompts>.parquet",
                  val_file="<validation prompts>.parquet", checkpoint_dir="<checkpoint dir>/verl",
                  prompt_length=budget, nnodes=max(1, nodes), gpus_per_node=max(1, gpus))
    try:
        config, validation = cache.config(cfg, job)
    except Exception as err:  # Hydra's composition error: the override and veRL's reason
        report.problems.append(f"veRL's config does not compose: {type(err).__name__}: {_one_line(err)}")
        return None
    report.problems += validation
    return config


def _runtime_problems(cfg: TrainConfig, config: Any, longest: int, report: CellPreflight) -> None:
    """What veRL only finds when its workers or vLLM start (see the module docstring, step 4)."""
    problems = report.problems
    trainer, rollout = cfg.trainer, config.actor_rollout_ref.rollout
    gpus_per_node = int(config.trainer.n_gpus_per_node)
    tp = int(rollout.tensor_model_parallel_size)
    if rollout.name == "vllm":
        if tp > gpus_per_node or gpus_per_node % tp:
            problems.append(f"verl.tensor_parallel={tp} does not divide the cell's {gpus_per_node} GPUs per node "
                            "(each vLLM replica takes tp GPUs of one node)")
        arch = report.architecture
        if arch is not None and (arch.heads % tp or arch.kv_heads % tp):
            problems.append(f"verl.tensor_parallel={tp} does not divide the model's {arch.heads} attention heads and "
                            f"{arch.kv_heads} key-value heads (vLLM splits heads across its GPUs)")
    turns = int(cfg.task.env.get("max_turns", 1) or 1)
    max_model_len = int(config.data.max_prompt_length) + int(config.data.max_response_length)
    needed = report.prompt_tokens + turns * trainer.max_response_tokens
    if longest and report.prompt_tokens > trainer.max_context_tokens // 2:
        problems.append(f"the longest first prompt needs {report.prompt_tokens} tokens ({report.prompt_source}), "
                        f"more than half of trainer.max_context_tokens={trainer.max_context_tokens}: veRL would "
                        "stop on it (data.truncation=error); raise trainer.max_context_tokens")
    if longest and max_model_len < needed:
        problems.append(f"trainer.max_context_tokens={trainer.max_context_tokens} (vLLM's max_model_len) is below "
                        f"the prompt ({report.prompt_tokens}) + {turns} turns x trainer.max_response_tokens="
                        f"{trainer.max_response_tokens} = {needed}, before any observation tokens")
    arch = report.architecture
    if arch is not None and arch.max_positions and max_model_len > arch.max_positions:
        problems.append(f"max model length {max_model_len} exceeds the model's max_position_embeddings "
                        f"{arch.max_positions}")
    budget = int(config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)
    if budget < max_model_len:
        problems.append(f"the micro-batch token budget {budget} (trainer.micro_batch_size x max_context_tokens) is "
                        f"below one sequence of {max_model_len} tokens")
    trajectories = trainer.prompts_per_step * trainer.samples_per_prompt
    if trajectories % report.world:
        problems.append(f"{trainer.prompts_per_step} prompts x {trainer.samples_per_prompt} samples = {trajectories} "
                        f"trajectories do not split evenly over the cell's {report.world} GPUs (veRL dispatches "
                        "equal chunks to its workers)")
    if trainer.mini_batch_size < report.world:
        problems.append(f"trainer.mini_batch_size={trainer.mini_batch_size} trajectories is below the {report.world} "
                        "GPUs it is split over (veRL needs at least one per GPU)")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
