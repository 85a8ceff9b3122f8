"""The sweep file: its schema (pydantic), loading with `file:line` errors, profiles and `--set` overrides.

A sweep file names a base config and the dimensions that vary it (see docs/sweeps.md for the full reference):

    name: table4
    backend: verl                       # trainer backend of every cell (torch | verl)
    base: {algorithm: ppo, filter: top_p_softmax}      # config-group choices and dotted keys of conf/
    grid:                               # full product; a list of mappings is a *linked* dimension
      task: [sokoban, frozenlake]
      filtering: [{filter: none}, {filter: top_p_softmax}]
    axes:                               # one factor at a time, each row varies the base
      algorithm: [dapo, grpo]
      size: [{model.path: models/Qwen2.5-0.5B}, {model.path: models/Qwen2.5-7B}]
    seeds: [1, 2, 3]
    exclude: [{axis: modality, task: [metamathqa, countdown]}]
    resources: {default: {gpus_per_node: 1}, rules: [...]}
    cluster: {partition: gpu, array_parallelism: 32, stall: {after_s: 900, action: fail}}
    profiles: {cpu: {backend: torch, set: {model: tiny}}}

`load_sweep(path, profile, sets)` validates the whole file (schema here, cells in `orchestrator.plan`) and returns
a `SweepDefinition`; nothing is written anywhere before that succeeds.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.resources import ResourcesSpec
from orchestrator.study import StudySpec
from orchestrator.yamlsource import Loc, YamlLimitError, YamlSource, format_loc, load_yaml, parse_yaml
from orchlib.commands import command_words
from orchlib.errors import OrchError, choices_error, did_you_mean, validation_issues
from orchlib.fields import integer

KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")
# Keys the sweep file may not set because the orchestrator sets them for each cell (its job's hosting keys).
ORCHESTRATOR_KEYS = ("mlflow", "trainer.checkpoint_dir")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
PROFILES_FILE = "profiles.yaml"
SHIPPED_SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"  # the sweep files orch ships, found by name anywhere
SPEC_SET_PREFIXES = ("cluster.", "resources.")
SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def script_safe(value: Any) -> Any:
    """A value written into a job script: one line, no control characters (it is shell-quoted where written)."""
    if isinstance(value, str) and CONTROL_CHARACTERS.search(value):
        raise ValueError(f"newlines and control characters are not allowed in a job script (got {value!r})")
    return value


ScriptText = Annotated[str, AfterValidator(script_safe)]
MAX_SEED = 2**31 - 1  # stored as a database integer on every backend
Seed = Annotated[int, integer(0, "a run seed"), Field(le=MAX_SEED)]
MAX_NAME = 100  # MLflow run names and SLURM job names stay well within their limits


class StallRule(BaseModel):
    """When a running cell counts as stalled (its job's heartbeat is too old) and what the engine does then."""

    model_config = ConfigDict(extra="forbid")

    after_s: float = Field(
        600, gt=0, description="A running cell whose last heartbeat is older than this is stalled (jobs beat every "
        "$ORCH_HEARTBEAT_S, 30 s by default: keep this several beats long)."
    )
    action: Literal["flag", "fail", "requeue"] = Field(
        "flag", description="flag: `orch status` shows it; fail: its job is killed and the cell fails; requeue: its "
        "job is killed and the cell is lost, so `orch resume` or `orch sweep` runs it again from its checkpoint."
    )

    def stalled(self, state: str, heartbeat_at: float | None, now: float) -> bool:
        """Whether a cell (or attempt) in `state` that last beat at `heartbeat_at` is stalled at `now`."""
        return state == "running" and heartbeat_at is not None and now - heartbeat_at > self.after_s


class ClusterSettings(BaseModel):
    """Where and how cells are submitted (`--cluster slurm`; `local` uses only the local_* fields)."""

    model_config = ConfigDict(extra="forbid")

    partition: ScriptText | None = Field(None, description="SLURM partition (--partition).")
    account: ScriptText | None = Field(None, description="SLURM account (--account).")
    qos: ScriptText | None = Field(None, description="SLURM quality of service (--qos).")
    array_parallelism: int = Field(64, ge=1, description="Array tasks of one job array running at once (%N).")
    max_array_size: int | None = Field(
        None, ge=1, description="Split job arrays at this size (default: the cluster's MaxArraySize)."
    )
    sbatch: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Extra #SBATCH options, e.g. {constraint: a100, exclusive: true}."
    )
    setup: list[ScriptText] = Field(default_factory=list,
                                    description="Shell lines run before each job (module load ...), one line each.")
    signal_delay_s: int = Field(
        120, ge=1, description="SLURM sends SIGUSR2 this long before the time limit: the job checkpoints and requeues."
    )
    max_requeues: int = Field(5, ge=0, description="Requeues (preemption/time limit) allowed per cell before failing.")
    local_max_parallel: int | None = Field(
        None, ge=1, description="--cluster local: cells at once (default: CPU cores / cpus_per_task)."
    )
    python: ScriptText | None = Field(None, description="Python command on the compute nodes (default: this "
                                      "interpreter): an absolute path or a program name, then plain options.")
    stall: StallRule = Field(default_factory=StallRule, description="Hung jobs: when and what (see StallRule).")

    @field_validator("sbatch")
    @classmethod
    def _sbatch_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, option in value.items():
            if not SBATCH_OPTION.fullmatch(key):
                raise ValueError(f"{key!r} is not an sbatch option name (letters, digits, dashes: constraint, "
                                 f"mail-type, exclusive)")
            try:
                script_safe(option)
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from None
        return value

    @field_validator("python")
    @classmethod
    def _python_words(cls, value: str | None) -> str | None:
        if value is not None:
            command_words(value, "Python interpreter")
        return value

    def python_command(self, default: str) -> str:
        """The Python command for a job script: `python`'s words, each shell-quoted (`default` when unset)."""
        return shlex.join(shlex.split(self.python)) if self.python else shlex.quote(default)


class ProfileRule(BaseModel):
    """`when` a cell matches (its settings before the profile, see `orchestrator.rules`), force `set` on it too."""

    model_config = ConfigDict(extra="forbid")

    when: dict[str, Any] = Field(min_length=1)
    set: dict[str, Any] = Field(min_length=1)


class Profile(BaseModel):
    """A named variant of a sweep: `orch sweep FILE --profile NAME`."""

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    backend: str | None = Field(None, description="Replace the backend of every cell.")
    set: dict[str, Any] = Field(default_factory=dict, description="Config keys forced on every cell.")
    rules: list[ProfileRule] = Field(default_factory=list, description="Config keys forced on matching cells.")
    seeds: list[Seed] | None = Field(None, min_length=1, description="Replace the seeds.")
    resources: ResourcesSpec | None = Field(None, description="Replace the resources section.")
    cluster: dict[str, Any] = Field(default_factory=dict, description="Cluster fields to change.")
    data: Literal["real", "any"] | None = Field(None, description="Replace the sweep's `data` rule.")
    exclude: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict, description="Per sweep name: more exclude rules (e.g. a rehearsal's subset of cells).")


class SweepSpec(BaseModel):
    """The schema of a sweep file."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, max_length=MAX_NAME,
                      description="Sweep name: the store key, the MLflow experiment and the SLURM job name.")
    description: str = ""
    backend: str = Field("torch", description="Trainer backend of every cell (config key `backend`).")
    base: dict[str, Any] = Field(default_factory=dict, description="Settings of every cell.")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="Dimensions crossed in a full product.")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="One-factor-at-a-time rows.")
    include_base: bool = Field(True, description="With axes: also run the base row itself.")
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, description="Seeds crossed with every row.")
    include: list[dict[str, Any]] = Field(default_factory=list, description="Extra cells (settings over base).")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="Rules removing grid/axes cells.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    profiles: dict[str, Profile] = Field(default_factory=dict)
    data: Literal["real", "any"] = Field(
        "any", description="real: refuse a cell whose task would train on orch's built-in or generated data "
                           "instead of the data set it reads in the paper (the paper sweeps; their cpu profiles "
                           "set any).")
    study: StudySpec | None = Field(None, description="An Optuna search over conf/ keys (`orch tune`).")


@dataclass
class SweepDefinition:
    """A validated sweep file with its profile and `--set` overrides applied."""

    spec: SweepSpec
    source: YamlSource
    profile: str | None = None
    forced: dict[str, Any] = field(default_factory=dict)  # config keys forced on every cell (profile, --set)
    forced_where: dict[str, str] = field(default_factory=dict)  # key -> where it was forced (for messages)
    forced_rules: list[ProfileRule] = field(default_factory=list)  # the profile's per-cell forcing (after `forced`)
    # the profile's exclude rules for this sweep: (rule, the profile file, the rule's location in it)
    profile_exclude: list[tuple[dict[str, Any], YamlSource, Loc]] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """The sweep file."""
        return self.source.path


def shipped_sweeps() -> list[str]:
    """The names of the sweep files orch ships (`sweeps/*.yaml` but the profiles)."""
    return sorted(path.stem for path in SHIPPED_SWEEPS.glob("*.yaml") if path.name != PROFILES_FILE)


def sweep_file(path: str | Path) -> Path:
    """The sweep file `path` names: the file itself when it exists; otherwise a shipped sweep by its name (`demo`,
    `demo.yaml`, or `sweeps/demo.yaml` outside the repository). OrchError naming the shipped sweeps when neither is
    found (a name near one of them suggested)."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    name = given.stem if given.suffix in (".yaml", ".yml") else given.name
    shipped = SHIPPED_SWEEPS / f"{name}.yaml"
    if name != Path(PROFILES_FILE).stem and (given.parent in (Path(), Path("sweeps"))) and shipped.is_file():
        return shipped
    if given.suffix in (".yaml", ".yml") and given.parent not in (Path(), Path("sweeps")):
        return given  # a path of the user's: load_yaml says it cannot be read
    names = shipped_sweeps()
    raise OrchError(f"sweep {str(path)!r}: no such file in {Path.cwd()}, nor a sweep orch ships; shipped "
                    f"({SHIPPED_SWEEPS}): {', '.join(names)}{did_you_mean(name, names)}")


def load_sweep(path: str | Path, profile: str | None = None, sets: list[str] | tuple[str, ...] = ()) -> SweepDefinition:
    """Read and validate a sweep file (`sweep_file`: a shipped sweep by its name too), apply `profile` and `--set
    KEY=VALUE` overrides. Raises `OrchError`."""
    source = load_yaml(sweep_file(path))
    if not isinstance(source.data, dict):
        raise source.error((), "a sweep file is a mapping with at least `name:`")
    spec = validate_model(SweepSpec, source.data, source)
    definition = SweepDefinition(spec=spec, source=source)
    check_keys(definition)
    if profile is not None:
        apply_profile(definition, profile)
    apply_sets(definition, list(sets))
    return definition


def validate_model(model: type[BaseModel], data: Any, source: YamlSource, loc: Loc = ()) -> Any:
    """`model.model_validate(data)`, with the first error turned into a located `OrchError`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        issues = validation_issues(err, model)
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        raise source.error((*loc, *issues[0].loc), issues[0].message + more) from None


def check_key(key: Any, source: YamlSource, loc: Loc) -> None:
    """A settable config key: dotted identifiers, not one the orchestrator owns."""
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise source.error(loc, f"{key!r} is not a config key (expected dotted names like filter.value)")
    if key == "seed":
        raise source.error(loc, "set seeds with the top-level `seeds:` list")
    if key == "backend":
        raise source.error(loc, "set the backend with the top-level `backend:` key (or a profile)")
    for owned in ORCHESTRATOR_KEYS:
        if key == owned or key.startswith(owned + "."):
            raise source.error(loc, f"{key} is set by the orchestrator for each cell")


def check_keys(definition: SweepDefinition) -> None:
    """Syntax of every config key the file sets (the keys' existence is checked against conf/ in the plan)."""
    spec, source = definition.spec, definition.source
    for key in spec.base:
        check_key(key, source, ("base", key))
    for section in ("include",):
        for index, entry in enumerate(getattr(spec, section)):
            for key in entry:
                check_key(key, source, (section, index, key))
    for name, profile in spec.profiles.items():
        for key in profile.set:
            check_key(key, source, ("profiles", name, "set", key))
        for index, rule in enumerate(profile.rules):
            for key in rule.set:
                check_key(key, source, ("profiles", name, "rules", index, "set", key))
    if spec.study is not None:
        for key in spec.study.space:
            check_key(key, source, ("study", "space", key))
        for section in ("grid", "axes", "include"):
            if getattr(spec, section):
                raise source.error((section,), f"a sweep with a `study:` searches its own space: remove `{section}` "
                                               "(put fixed settings in `base`)")
        if spec.study.seeds_per_trial > len(spec.seeds):
            raise source.error(("study", "seeds_per_trial"), f"{spec.study.seeds_per_trial} seeds per trial, but the "
                                                             f"sweep lists {len(spec.seeds)} seed(s) in `seeds`")


def load_profiles(definition: SweepDefinition) -> dict[str, tuple[Profile, YamlSource, Loc]]:
    """Profiles of `profiles.yaml` next to the sweep file, then those of the file itself (which win)."""
    profiles: dict[str, tuple[Profile, YamlSource, Loc]] = {}
    shared = definition.path.parent / PROFILES_FILE
    if shared.is_file() and shared.resolve() != definition.path.resolve():
        source = load_yaml(shared)
        if not isinstance(source.data, dict):
            raise source.error((), "a profiles file maps profile names to profiles")
        for name, data in source.data.items():
            profile = validate_model(Profile, data, source, (name,))
            for key in profile.set:
                check_key(key, source, (name, "set", key))
            for index, rule in enumerate(profile.rules):
                for key in rule.set:
                    check_key(key, source, (name, "rules", index, "set", key))
            profiles[name] = (profile, source, (name,))
    for name, profile in definition.spec.profiles.items():
        profiles[name] = (profile, definition.source, ("profiles", name))
    return profiles


def apply_profile(definition: SweepDefinition, name: str) -> None:
    """Apply profile `name` to `definition` in place."""
    profiles = load_profiles(definition)
    if not profiles:
        raise OrchError(f"{definition.path}: no profiles defined (add `profiles:` to the file, or a "
                        f"{PROFILES_FILE} next to it); --profile {name} cannot apply")
    if name not in profiles:
        raise choices_error("profile", name, list(profiles), where=str(definition.path))
    profile, source, loc = profiles[name]
    spec = definition.spec
    updates: dict[str, Any] = {}
    if profile.backend is not None:
        updates["backend"] = profile.backend
    if profile.seeds is not None:
        updates["seeds"] = profile.seeds
    if profile.resources is not None:
        updates["resources"] = profile.resources
    if profile.data is not None:
        updates["data"] = profile.data
    if profile.cluster:
        merged = {**spec.cluster.model_dump(exclude_unset=True), **profile.cluster}
        updates["cluster"] = validate_model(ClusterSettings, merged, source, (*loc, "cluster"))
    definition.spec = spec.model_copy(update=updates)
    definition.profile = name
    for key, value in profile.set.items():
        definition.forced[key] = value
        definition.forced_where[key] = source.where((*loc, "set", key))
    definition.forced_rules = list(profile.rules)
    for index, rule in enumerate(profile.exclude.get(spec.name, [])):
        where = (*loc, "exclude", spec.name, index)
        if not rule:
            raise source.error(where, "empty rule: it would exclude every cell")
        definition.profile_exclude.append((rule, source, where))


def apply_sets(definition: SweepDefinition, sets: list[str]) -> None:
    """Apply `--set KEY=VALUE` overrides: `cluster.*`, `resources.*`, `seeds` and `backend` change the sweep;
    any other key is a config key forced on every cell. VALUE is read as YAML (`0.9`, `true`, `[1, 2]`)."""
    for text in sets:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OrchError(f"--set {text!r}: expected KEY=VALUE")
        try:
            value = parse_yaml(raw, f"--set {text}").data if raw.strip() else ""
        except YamlLimitError:
            raise
        except OrchError:  # not YAML: the text itself
            value = raw
        if key in ("seeds", "backend") or key.startswith(SPEC_SET_PREFIXES):
            _set_spec_field(definition, key, value, text)
            continue
        check_key(key, YamlSource(path=Path(f"--set {text}"), data=None), ())
        definition.forced[key] = value
        definition.forced_where[key] = f"--set {text}"


def _set_spec_field(definition: SweepDefinition, key: str, value: Any, text: str) -> None:
    data = definition.spec.model_dump()
    node: Any = data
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            valid = list(node) if isinstance(node, dict) else []
            raise choices_error("sweep field", part, valid, where=f"--set {text}")
        node = node[part]
    node[parts[-1]] = value
    spec = validate_model(SweepSpec, data, YamlSource(path=Path(f"--set {text}"), data=None))
    definition.spec = spec


def describe_loc(source: YamlSource, loc: Loc) -> str:
    """`grid.task[1] (line 12)` for cell origins in messages."""
    line = source.line(loc)
    return f"{format_loc(loc)} (line {line})" if line else format_loc(loc)
