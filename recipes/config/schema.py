"""The typed training config of one run: `TrainConfig`, built once from the composed `conf/` tree.

    cfg = compose_train_config(["task=frozenlake", "filter.value=0.95"])   # Hydra compose + validate, once
                                        # (commands: recipes.config.resolve.resolve_cell, the one resolve)
    cfg.filter.is_off, cfg.trainer.total_steps, cfg.task.env_config()      # typed sections
    cfg.digest()                                                           # the cell identity

Both trainer backends receive a `TrainConfig`. It has the sections of `conf/` (task, algorithm, model, filter,
trainer, diagnostics; the run's backend, seed and hooks) and a separate `infra` part: how the run is hosted, not
what it computes -- the MLflow run, the checkpoint folder, resuming, CPU threads and the progress bar. In `conf/`
those keys keep the names users type (`mlflow.*`, `trainer.checkpoint_dir`, `trainer.resume`, `trainer.threads`,
`trainer.progress`); `INFRA_KEYS` maps them into `infra` and back, and is the only list of them.

A run's identity is `digest()`: the hash of the config without `infra`, computed by exactly one function
(`config_digest`). Two spellings of the same config are the same cell, and moving a run to another host, folder or
MLflow server does not make it a new one. (The device stays part of the identity: cuda and cpu runs differ
numerically, and moving it would have given every existing cell a new identity.)

Every problem is one `OrchError` line naming the key (as the user writes it) and the valid choices, before any
work: an unknown group option or key, a bad value, or settings that do not fit together.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    model_serializer,
    model_validator,
)

from orchlib.errors import OrchError, validation_issues
from orchlib.fields import boolean, integer, number, one_of
from recipes.config.compose import compose_tree, missing_keys, resolve_tree
from recipes.diagnostics.monitor import DiagnosticsConfig
from recipes.stats.filtering import FilterConfig

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl", "full")
DTYPES = ("float32", "bfloat16")
RESUME_MODES = ("auto", "never")
VERL_TRAINERS = ("legacy", "v1")
# The veRL trainer of every config stored before `verl.trainer` existed: a stored cell keeps it whatever the default
# is now (recipes.config.resolve.load_config; issue #50 item 3: a changed default must not switch a planned cell)
VERL_TRAINER_BEFORE_THE_KEY = "legacy"
# conf/ key -> field of `TrainConfig.infra`: settings that change how a run is hosted, never what it computes.
INFRA_KEYS: dict[str, str] = {
    "mlflow": "mlflow",
    "verl": "verl",
    "trainer.checkpoint_dir": "checkpoint_dir",
    "trainer.resume": "resume",
    "trainer.time_limit": "time_limit",
    "trainer.threads": "threads",
    "trainer.progress": "progress",
}

Count = Annotated[int, integer(1)]
Cadence = Annotated[int, integer(0)]  # steps between events; 0: never
Flag = Annotated[bool, boolean()]


class Section(BaseModel):
    """A section of the training config: closed (unknown keys are errors) and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Keys added after cells were planned with this section set: a cell's identity (`config_digest`) leaves them out
    # while they hold their default, so adding them changed no planned cell (as `envs.base.EnvConfig.late_keys`).
    late_keys: ClassVar[tuple[str, ...]] = ()


class TaskConfig(Section):
    """`task`: the environment (`envs` registry name) and its settings, validated by the environment's own
    config class (kept as written here, so that the identity hashes exactly what `conf/` says)."""

    name: str
    env: dict[str, Any]

    def env_config(self) -> Any:
        """The environment's validated config (`envs.EnvConfig` subclass)."""
        from envs.registry import build_config

        return build_config(self.name, self.env)


def _algorithm_names() -> list[str]:
    from recipes.policy.algorithms import algorithm_names

    return algorithm_names()


class AlgorithmConfig(Section):
    """`algorithm`: the registered algorithm and its veRL loss settings."""

    name: Annotated[str, one_of(_algorithm_names, "algorithm")]
    gamma: float
    lam: float
    norm_adv_by_std: Flag
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float
    loss_agg_mode: Annotated[str, one_of(LOSS_AGG_MODES)]
    entropy_coeff: float
    use_kl: Flag
    kl_coef: float
    kl_penalty: Annotated[str, one_of(KL_PENALTIES)]
    cliprange_value: float
    dynamic_sampling: Flag
    max_extra_gen_batches: Cadence


class VisionPresetConfig(Section):
    """`model.preset.vision`: the vision tower of a vision-language preset (Qwen2.5-VL; `model=tiny_vl`)."""

    depth: Count
    hidden_size: Count
    intermediate_size: Count
    num_heads: Count
    patch_size: Count
    merge_size: Count
    max_pixels: Count  # frames are resized to at most this many pixels (the image processor's rule)


class PresetConfig(Section):
    """`model.preset`: the Qwen2 architecture built in code when `model.path` is null (a Qwen2.5-VL when `vision`
    is set)."""

    vocab_size: Count
    hidden_size: Count
    num_hidden_layers: Count
    num_attention_heads: Count
    num_key_value_heads: Count
    intermediate_size: Count
    max_position_embeddings: Count
    tie_word_embeddings: Flag
    vision: VisionPresetConfig | None = None

    @model_serializer(mode="wrap")
    def _text_presets_unchanged(self, handler: Any) -> dict[str, Any]:
        """A text preset dumps (and hashes: cell identity, preset cache) exactly as before `vision` existed."""
        dumped = handler(self)
        if dumped.get("vision") is None:
            dumped.pop("vision", None)
        return dumped


class WarmStartConfig(Section):
    """`model.warm_start`: supervised fine-tuning on solver demonstrations, cached by input hash."""

    enabled: Flag
    demos: Count
    epochs: Count
    batch_size: Count
    lr: float
    eval_every: Count
    eval_episodes: Count
    eval_temperature: float
    target_format_validity: float
    max_response_tokens: Count


LORA_ALL_LINEAR = "all-linear"  # peft's name for every linear layer but the output head


def _target_modules(value: Any) -> Any:
    names = value if isinstance(value, list | tuple) else None
    if value == LORA_ALL_LINEAR or (names and all(isinstance(n, str) and re.fullmatch(r"[\w.]+", n) for n in names)):
        return value if names is None else list(names)
    raise ValueError(f"must be {LORA_ALL_LINEAR!r} or a non-empty list of module names (e.g. [q_proj,v_proj]), "
                     f"got {value!r}")


class LoraSection(Section):
    """`model.lora`: LoRA adapters on the policy, as RAGEN configures them (config/base.yaml:19-22 in
    github:mll-lab-nu/RAGEN, mapped to veRL's `lora_rank`/`lora_alpha`/`target_modules` at :26-29). Rank 0, the
    default: full-parameter training. The critic (PPO, DAPO) always trains all its parameters (docs/training.md#lora)."""

    rank: Annotated[int, integer(0, "the adapters' rank; 0: full-parameter training")] = 0
    alpha: Annotated[int, integer(1, "the adapters' scale is alpha / rank")] = 64  # an int, as veRL and peft type it
    target_modules: Annotated[str | list[str], BeforeValidator(_target_modules)] = LORA_ALL_LINEAR

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def targets_text(self) -> str:
        """`target_modules` in words: all-linear, or the names comma-separated."""
        return self.target_modules if isinstance(self.target_modules, str) else ",".join(self.target_modules)


class ModelConfig(Section):
    """`model`: the policy (a local Hugging Face folder, or a preset built in code), its warm start, optimiser,
    and its LoRA adapters (`lora`)."""

    late_keys = ("lora",)  # came after cells had run: their identity is unchanged while it holds its default

    name: str
    path: str | None = None
    preset: PresetConfig
    dtype: Annotated[str, one_of(DTYPES)]
    actor_lr: float
    critic_lr: float
    weight_decay: float
    grad_clip: float
    warm_start: WarmStartConfig
    cache_dir: str | None = None
    lora: LoraSection = LoraSection()


class FilterSection(FilterConfig):
    """`filter`: SNR-Aware Filtering's settings (`recipes.stats.filtering.FilterConfig`) and the option's name."""

    name: str


def _device(value: Any) -> Any:
    if not isinstance(value, str) or re.fullmatch(r"cpu|cuda(:\d+)?", value) is None:
        raise ValueError(f"{value!r} is not a device; valid choices: cpu, cuda, cuda:N")
    return value


Temperature = Annotated[float, number(lambda v: v > 0, "> 0 (a sampling temperature)")]


class TrainerConfig(Section):
    """`trainer`: batch sizes, steps, cadences and the device (its hosting keys live in `TrainConfig.infra`)."""

    device: Annotated[str, BeforeValidator(_device)]
    total_steps: Count
    prompts_per_step: Count
    samples_per_prompt: Count
    temperature: Temperature
    max_response_tokens: Count
    max_context_tokens: Count
    mini_batch_size: Count
    micro_batch_size: Count
    ppo_epochs: Count
    val_every: Cadence
    val_size: Cadence
    val_temperature: Temperature
    save_every: Cadence
    dump_every: Cadence
    max_empty_steps: Cadence  # 0: never stop on empty steps (RAGEN's rollout_filter_empty_stop_steps=0)


class MlflowConfig(Section):
    """Where the run's metrics go: `mlflow.*` in `conf/`."""

    tracking_uri: str | None = None  # None: recipes.run.tracking.default_tracking_uri
    experiment_name: str = "orch"
    run_id: str | None = None  # attach to this existing run (the sweep pre-creates runs); None creates one
    run_name: str | None = None
    # A run whose tracking store is unreachable buffers its metrics and trains on; after this many seconds (or
    # `recipes.run.tracking.MAX_PENDING` buffered metrics) it checkpoints and stops (recipes.run.tracking.RunTracker).
    outage_s: Annotated[float, number(lambda v: v > 0, "> 0")] = 1800.0


class VerlHosting(Section):
    """`verl.*` in `conf/`: how the verl backend hosts a run (rollout engine, parallelism, the Ray cluster)."""

    rollout: Annotated[str, one_of(("auto", "hf", "vllm"))] = "auto"
    gpu_memory_utilization: Annotated[float, number(lambda v: 0 < v <= 1, "in (0, 1]")] = 0.3
    tensor_parallel: Count = 1
    attention: Annotated[str, one_of(("auto", "flash_attention_2", "sdpa"))] = "auto"
    param_offload: Flag = False
    entropy_chunking: Flag = True
    nnodes: Annotated[int, integer(1)] | None = None
    gpus_per_node: Annotated[int, integer(1)] | None = None
    ray_cpus: Count = 8
    ray_join_timeout_s: Annotated[float, number(lambda v: v > 0, "> 0 (seconds)")] = 300.0
    # veRL's trainer: v1 (veRL's V1 sync trainer, recipes.verl.v1) | legacy (RayPPOTrainer, recipes.verl.trainer).
    # Hosting, not identity; a resumed cell keeps the trainer that wrote its checkpoint (recipes.verl.backend), and a
    # config stored before the key existed keeps legacy (VERL_TRAINER_BEFORE_THE_KEY).
    trainer: Annotated[str, one_of(VERL_TRAINERS)] = "v1"


class InfraConfig(Section):
    """How the run is hosted (see `INFRA_KEYS`): never part of its identity."""

    mlflow: MlflowConfig = MlflowConfig()
    verl: VerlHosting = VerlHosting()
    checkpoint_dir: str | None = None  # None: checkpoints/<mlflow run id> in the working directory
    resume: Annotated[str, one_of(RESUME_MODES)] = "auto"
    # Seconds this run may take from its start (None: no limit): before a step that would overrun it, it checkpoints and
    # stops as on a stop signal (`recipes.runtime.time_limit`; SLURM's own limit comes as SIGUSR2 `signal_delay_s` ahead).
    time_limit: Annotated[float, number(lambda v: v > 0, "> 0 (seconds)")] | None = None
    threads: Annotated[int, integer(1)] | None = None  # None: recipes.torch_trainer.backend.available_cpus()
    progress: Flag = True


EVAL_CHECKPOINTS = ("best", "latest")


class EvalSection(Section):
    """`evaluation.*` in `conf/`: set `source` to make the run an evaluation of a finished training run's checkpoint
    instead of a training run (`orch eval --sweep S --best`: one evaluation cell per finished cell of S). The rest of
    the config is the source run's own, so the evaluation plays its task under its chat protocol and settings."""

    source: str | None = None  # the source run's checkpoint folder (trainer.checkpoint_dir); None: train
    checkpoint: Annotated[str, one_of(EVAL_CHECKPOINTS)] = "best"  # best: best/ (peak validation success)
    episodes: Count = 512  # validation seeds (problems), disjoint from training
    samples: Count = 1  # samples per problem (n of pass@k)
    temperature: Temperature | None = None  # None: trainer.val_temperature
    pass_k: Count = 1
    seed: Annotated[int, integer(0)] = 0


class ControlSection(Section):
    """`control.*` in `conf/`: planted effects for the controls of the MI diagnostics (docs/diagnostics.md#controls).
    Off by default; a control run is a run of its own (the section is part of its identity when set)."""

    late_keys = ("blind_strength",)  # came after control cells had run (blind_from_step alone: every row)

    # From this step on (0: never) every rollout reply is generated from the batch's first chat instead of its own,
    # while the trajectories keep their real, distinct prompts: a planted template collapse (replies cannot depend
    # on their input) that the MI proxies must see. Validation keeps the real inputs.
    blind_from_step: Cadence = 0
    # The share of each planted step's training rows (trajectories) that are blinded, the rows chosen by
    # `recipes.runtime.seeds.blinded_rows` (round(strength x rows), seeded by (seed, step)): a graded plant. 1: every
    # row (the total plant); 0: none (a negative control of the same config shape).
    blind_strength: Annotated[float, number(lambda v: 0 <= v <= 1, "in [0, 1] (the share of rows blinded)")] = 1.0


def _backend_names() -> list[str]:
    from recipes.config.backends import backend_names

    return backend_names()


def _hook_names() -> list[str]:
    from recipes.diagnostics.registry import HOOKS

    return HOOKS.names()


class TrainConfig(Section):
    """The training config of one run (see the module docstring)."""

    backend: Annotated[str, one_of(_backend_names)]
    seed: Annotated[int, integer(0)]
    hooks: list[Annotated[str, one_of(_hook_names, "step hook")]]
    task: TaskConfig
    algorithm: AlgorithmConfig
    model: ModelConfig
    filter: FilterSection
    trainer: TrainerConfig
    diagnostics: DiagnosticsConfig
    evaluation: EvalSection = EvalSection()
    control: ControlSection = ControlSection()
    infra: InfraConfig = InfraConfig()

    @model_validator(mode="after")
    def _settings_fit_together(self) -> TrainConfig:
        _require(self.trainer.samples_per_prompt >= 2 or self.filter.is_off, "trainer.samples_per_prompt",
                 "filtering ranks prompts by their reward spread and needs >= 2 samples per prompt; use filter=none")
        from recipes.policy.algorithms import get_algorithm

        _require(self.trainer.samples_per_prompt >= 2 or not get_algorithm(self.algorithm.name).group_relative,
                 "trainer.samples_per_prompt", f"{self.algorithm.name} computes advantages within a group of samples "
                 "per prompt and needs >= 2 (one sample is its own group mean: every advantage 0); use algorithm=ppo")
        _require(self.diagnostics.grad_every == 0 or self.trainer.samples_per_prompt >= 2, "diagnostics.grad_every",
                 "the gradient split buckets prompts by their reward spread and needs trainer.samples_per_prompt >= 2")
        _require(self.evaluation.pass_k <= self.evaluation.samples, "evaluation.pass_k",
                 f"pass@{self.evaluation.pass_k} needs evaluation.samples >= {self.evaluation.pass_k} "
                 f"(got {self.evaluation.samples})")
        env = self.task.env_config()  # OrchError naming the environment and the key
        vision_model = self.model.path is not None or self.model.preset.vision is not None
        _require(env.observation == "text" or vision_model, "task.env.observation",
                 "image observations need a vision-language model: model=tiny_vl (built in code), or model=hf "
                 "model.path=<Qwen2.5-VL folder>; the tiny/small presets are text-only: use task.env.observation=text")
        if self.model.lora.enabled and self.model.path is None:
            from recipes.policy.lora import preset_linear_names, unknown_targets

            unknown = unknown_targets(self.model.lora.target_modules, preset_linear_names(self.model.preset.model_dump()))
            _require(not unknown, "model.lora.target_modules", _unknown_targets_message(unknown, f"the {self.model.name} "
                     "preset (a Qwen2)"))
        if self.backend == "verl":
            _require(get_algorithm(self.algorithm.name).verl_estimator is not None, "algorithm.name",
                     f"{self.algorithm.name} declares no veRL advantage estimator (recipes.policy.algorithms: "
                     "verl_estimator): it runs on backend=torch only")
            _require(env.observation == "text" or self.rollout_engine() == "vllm", "task.env.observation",
                     "image observations on the verl backend need vLLM rollouts of a Qwen2.5-VL checkpoint on GPU "
                     "(trainer.device=cuda; the hf rollout replica for CPU is text-only): use task.env.observation=text")
            _require(env.observation == "text" or "collapse" not in self.hooks or self.diagnostics.mi_every == 0,
                     "hooks", "the MI diagnostics cross-score text prompts through veRL's actor workers and do not "
                     "take image observations yet: set diagnostics.mi_every=0 (the gradient split still runs) or "
                     "use task.env.observation=text")
            _require(self.infra.verl.trainer != "v1" or "collapse" not in self.hooks
                     or self.diagnostics.mi_every == 0 or self.diagnostics.method != "naive", "diagnostics.method",
                     "naive cross-scoring (the reference N x M method) is not on the V1 trainer's path: use "
                     "diagnostics.method=prefix or verl.trainer=legacy")
            _require(set(self.hooks) <= {"collapse"}, "hooks",
                     f"{sorted(set(self.hooks) - {'collapse'})}: on backend=verl only the collapse hook runs (it "
                     "cross-scores through veRL's actor workers); other hooks need the policy in the trainer's process")
        return self

    def rollout_engine(self) -> str:
        """The verl backend's rollout engine: `verl.rollout`, or `hf` on cpu and `vllm` on cuda when it is auto."""
        chosen = self.infra.verl.rollout
        return ("hf" if self.trainer.device == "cpu" else "vllm") if chosen == "auto" else chosen

    def missing_data_file(self) -> tuple[str, str] | None:
        """(the config key, why) when the task names a data file that does not exist on this host, or one its loader
        cannot read by its suffix; else None."""
        from envs.registry import env_class

        source = env_class(self.task.name).data
        if source is None or source.key is None or source.uses_builtin(self.task.env):
            return None
        path = Path(str(self.task.env[source.key])).expanduser()
        if not path.exists():
            return f"task.env.{source.key}", f"{str(path)!r} does not exist ({source.formats})"
        problem = source.suffix_problem(str(path))
        return None if problem is None else (f"task.env.{source.key}", problem)

    def check_host(self) -> TrainConfig:
        """What only the host that trains can check (a sweep plans on another host): the model folder is a loadable
        Hugging Face checkpoint (`recipes.runtime.hf_folder.hf_folder_problems`) and the task's data file exists. `orch train`
        and every sweep job compose through here, before anything is written."""
        from recipes.runtime.hf_folder import hf_folder_problems

        _require(self.model.path is None or Path(self.model.path).expanduser().is_dir(), "model.path",
                 f"{self.model.path!r} is not a local Hugging Face checkpoint folder")
        missing = self.missing_data_file()
        _require(missing is None, missing[0] if missing else "", missing[1] if missing else "")
        if self.model.path is not None and self.task.env_config().observation == "image":
            from recipes.policy.vision import is_vision_folder

            folder = Path(self.model.path).expanduser()
            _require((folder / "config.json").is_file() and is_vision_folder(folder), "task.env.observation",
                     f"image observations need a vision-language checkpoint; {self.model.path!r} has no vision_config "
                     "(use a Qwen2.5-VL folder, model=tiny_vl, or task.env.observation=text)")
        problems = hf_folder_problems(self.model.path) if self.model.path is not None else []
        _require(not problems, "model.path", problems[0] if problems else "")
        if self.model.path is not None and self.model.lora.enabled and not isinstance(self.model.lora.target_modules,
                                                                                       str):
            from recipes.policy.lora import folder_linear_names, unknown_targets

            unknown = unknown_targets(self.model.lora.target_modules,
                                      folder_linear_names(Path(self.model.path).expanduser()))
            _require(not unknown, "model.lora.target_modules", _unknown_targets_message(unknown, self.model.path))
        from recipes.config.backends import check_backend_host

        check_backend_host(self)  # the backend's own (verl: vLLM's CPU build for verl.rollout=vllm on cpu)
        return self

    # -- the conf/ layout ---------------------------------------------------------------------------------------

    @classmethod
    def from_tree(cls, tree: dict[str, Any]) -> TrainConfig:
        """Validate a composed, resolved `conf/` tree (the layout users write: infra keys where `INFRA_KEYS` says).
        Raises `OrchError` naming the first bad key as the user writes it."""
        missing = missing_keys(tree)
        if missing:
            raise OrchError(f"config key {missing[0]}: required value not set (??? in conf/); set {missing[0]}=...")
        try:
            return cls.model_validate(_to_infra_layout(tree))
        except ValidationError as err:
            issue = validation_issues(err, cls)[0]
            raise OrchError(f"config key {_conf_key(issue.loc)}: {issue.message}") from None

    def to_tree(self) -> dict[str, Any]:
        """The config in the `conf/` layout (what `--print-config` shows and MLflow records as params)."""
        tree = self.model_dump()
        infra = tree.pop("infra")
        for conf_key, field in INFRA_KEYS.items():
            *parents, leaf = conf_key.split(".")
            node = tree
            for part in parents:
                node = node[part]
            node[leaf] = infra[field]
        return tree

    def with_hosting(self, settings: dict[str, Any]) -> TrainConfig:
        """A copy with hosting keys set (`{"mlflow.run_id": ..., "trainer.checkpoint_dir": ...}`, keys as `conf/`
        names them, each under `INFRA_KEYS`): only the `infra` part changes (validated), so the identity stays.
        Raises `OrchError` naming a key that is not a hosting key, or a bad value."""
        infra = self.infra.model_dump()
        for key, value in settings.items():
            conf_key = next((name for name in INFRA_KEYS if key == name or key.startswith(f"{name}.")), None)
            if conf_key is None:
                raise OrchError(f"config key {key}: not a hosting key ({', '.join(INFRA_KEYS)}); the other keys "
                                "make the run's identity")
            rest = key[len(conf_key) + 1:]
            node = infra
            parts = [INFRA_KEYS[conf_key], *rest.split(".")] if rest else [INFRA_KEYS[conf_key]]
            for part in parts[:-1]:
                if not isinstance(node.get(part), dict):
                    raise OrchError(f"config key {key}: {part} is a value, not a section")
                node = node[part]
            node[parts[-1]] = value
        try:
            return self.model_copy(update={"infra": InfraConfig.model_validate(infra)})
        except ValidationError as err:
            issue = validation_issues(err, InfraConfig)[0]
            raise OrchError(f"config key {_conf_key(('infra', *issue.loc))}: {issue.message}") from None

    def digest(self) -> str:
        """The run's identity: see `config_digest`."""
        return config_digest(self)

    def training_digest(self) -> str:
        """The identity of the training run this config evaluates (`evaluation.source` set), else its own."""
        return config_digest(self.model_copy(update={"evaluation": EvalSection()}))


# Sections added after cells were first planned: part of a run's identity only when set (not at their defaults).
OPTIONAL_SECTIONS = ("evaluation", "control")


def config_digest(config: TrainConfig) -> str:
    """Stable 16-hex-digit hash of a training config without its `infra` part: a cell's identity. The one
    function that computes it (the sweep planner, the job's check and MLflow tags all call it)."""
    from envs.registry import env_class

    dump = config.model_dump(exclude={"infra"})
    for name in OPTIONAL_SECTIONS:  # left out while unset: adding them changed no cell planned before
        if dump[name] == type(getattr(config, name))().model_dump():
            del dump[name]
    for name, section in config:  # likewise a section's late keys at their default (`Section.late_keys`)
        if not isinstance(section, BaseModel) or name not in dump:
            continue
        for key in section.late_keys if isinstance(section, Section) else ():
            default = type(section).model_fields[key].default  # a section (`model.lora`) compares as its dump
            if dump[name][key] == (default.model_dump() if isinstance(default, BaseModel) else default):
                del dump[name][key]
        for key, part in section:  # and a nested part's late keys at the values that reproduce it from before them
            legacy = getattr(part, "late_keys", None)  # {key: value} (`recipes.stats.collapse_alert.CollapseRule`)
            for late, value in legacy.items() if isinstance(legacy, dict) else ():
                if dump[name][key].get(late) == value:
                    del dump[name][key][late]
    env_config = env_class(config.task.name).config_class
    for key in env_config.late_keys:  # likewise the task's late keys at their default (envs.base.EnvConfig)
        if dump["task"]["env"].get(key) == env_config.model_fields[key].default:
            del dump["task"]["env"][key]
    text = json.dumps(dump, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compose_train_config(overrides: list[str] | tuple[str, ...] = (), host: bool = True) -> TrainConfig:
    """The validated training config of `conf/train.yaml` with Hydra-syntax `overrides` applied, checked for this
    host (`check_host`) unless `host` is false. Commands resolve through `recipes.config.resolve.resolve_cell`, which
    composes through here when it is given overrides.

    Raises:
        OrchError: bad override syntax, unknown group option or key, an invalid value, or settings that do not
            fit together -- one line naming the override or key and the valid choices.
    """
    tree, _ = compose_tree(overrides)
    config = TrainConfig.from_tree(resolve_tree(tree))
    return config.check_host() if host else config


def flatten_config(cfg: TrainConfig) -> dict[str, str]:
    """The config in the `conf/` layout as `{"dotted.key": "value"}` (MLflow params; lists and dicts as repr)."""
    flat: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = str(node)

    walk(cfg.to_tree(), "")
    return flat


def _unknown_targets_message(unknown: list[str], model: str) -> str:
    return (f"{unknown} match no linear layer of {model}; use all-linear or names such as q_proj, k_proj, v_proj, "
            "o_proj, gate_proj, up_proj, down_proj (a module matches a name it ends with, as in peft)")


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise OrchError(f"config key {key}: {message}")


def _to_infra_layout(tree: dict[str, Any]) -> dict[str, Any]:
    """A copy of a `conf/` tree with the `INFRA_KEYS` moved into `infra` (copying only the dicts on the way)."""
    tree = dict(tree)
    infra = {}
    for conf_key, field in INFRA_KEYS.items():
        *parents, leaf = conf_key.split(".")
        node = tree
        for part in parents:
            if not isinstance(node.get(part), dict):
                break
            node[part] = node = dict(node[part])
        else:
            if leaf in node:
                infra[field] = node.pop(leaf)
    tree["infra"] = infra
    return tree


def _conf_key(loc: tuple[Any, ...]) -> str:
    """A validation location as the `conf/` key the user writes (`infra.threads` -> `trainer.threads`)."""
    parts = [str(part) for part in loc]
    if parts[:1] == ["infra"] and len(parts) > 1:
        conf_key = next(key for key, field in INFRA_KEYS.items() if field == parts[1])
        parts = [conf_key, *parts[2:]]
    return ".".join(parts) or "(top level)"
