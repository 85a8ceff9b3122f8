"""Cell identity: the hash of the resolved config (infra excluded), equal to what the job composes with Hydra."""

from __future__ import annotations

import math

import pytest

from recipes.config.compose import hydra_overrides
from recipes.config.resolve import ConfigResolver
from recipes.config.schema import compose_train_config


@pytest.fixture(scope="module")
def resolver(tmp_path_factory: pytest.TempPathFactory) -> ConfigResolver:
    return ConfigResolver(cache_dir=tmp_path_factory.mktemp("cache"))


def composed_digest(settings: dict, resolver: ConfigResolver) -> str:
    return compose_train_config(hydra_overrides(settings, resolver.groups)).digest()


@pytest.mark.parametrize(
    "settings",
    [
        {"backend": "torch", "seed": 3},
        {"task": "frozenlake", "algorithm": "grpo", "filter": "top_k", "filter.value": 0.25, "seed": 1},
        {"model": "small", "trainer": "test", "trainer.total_steps": 7, "filter.include_zero": True},
        {"filter": "none", "model.dtype": "bfloat16", "hooks": [], "seed": 0},
        {"task": "countdown", "seed": 2},  # reaches into model.warm_start (conf/model/warm_start/tiny_countdown.yaml)
        {"task": "countdown", "model": "small", "seed": 2},
    ],
)
def test_planned_identity_equals_hydra_composition(resolver: ConfigResolver, settings: dict) -> None:
    """The resolver's fast path (subtrees, shape cache, seed patch) gives the config Hydra composes."""
    resolved = resolver.resolve(settings)
    assert resolved.digest == composed_digest(resolved.settings, resolver)


def test_infra_keys_do_not_change_identity(resolver: ConfigResolver) -> None:
    base = compose_train_config(["trainer.progress=false"]).digest()
    cfg = compose_train_config(["mlflow.run_id=abc", "trainer.checkpoint_dir=/somewhere", "trainer.threads=3"])
    assert cfg.digest() == base
    assert compose_train_config(["seed=99"]).digest() != base


def test_seed_fast_path_matches_full_resolution(resolver: ConfigResolver) -> None:
    digests = {resolver.resolve({"task": "countdown", "seed": seed}).digest for seed in range(50)}
    assert len(digests) == 50
    assert resolver.resolve({"task": "countdown", "seed": 7}).digest == composed_digest(
        {"task": "countdown", "seed": 7}, resolver)


@pytest.mark.parametrize("value", ["plain", "it's", "back\\slash", "ends\\", "a b,c", "", "1.0", "true", "null"])
def test_string_values_round_trip_through_hydra(value: str) -> None:
    """Strings reach the job's config exactly (quoting, escapes, strings that look like other types)."""
    (override,) = hydra_overrides({"mlflow.run_name": value}, ())
    assert compose_train_config([override]).infra.mlflow.run_name == value


@pytest.mark.parametrize("value", [None, True, False, 0, -3, 1e-06, 2.5, math.inf, [1, "a b", None]])
def test_typed_values_round_trip_through_hydra(value) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (override,) = hydra_overrides({"x.y": value}, ())
    parsed = OverridesParser.create().parse_overrides([override])[0].value()
    assert parsed == value and type(parsed) is type(value)


def test_group_choices_are_bare_and_first(resolver: ConfigResolver) -> None:
    overrides = hydra_overrides({"filter.value": 0.5, "task": "sokoban", "seed": 1}, resolver.groups)
    assert overrides == ["task=sokoban", "filter.value=0.5", "seed=1"]


def test_a_task_can_specialise_a_models_warm_start(resolver: ConfigResolver) -> None:
    """conf/model/warm_start/<model>_<task>.yaml sets that pair's warm start over the model's; an explicit key still
    wins, and other pairs keep the model's own settings."""
    demos = {key: resolver.resolve(dict(settings)).config.model.warm_start.demos for key, settings in {
        "tiny countdown": {"task": "countdown"},
        "tiny frozenlake": {"task": "frozenlake"},
        "small countdown": {"task": "countdown", "model": "small"},
        "set by the sweep": {"task": "countdown", "model.warm_start.demos": 64},
    }.items()}
    assert demos == {"tiny countdown": 1024, "tiny frozenlake": 256, "small countdown": 256, "set by the sweep": 64}
    assert compose_train_config(["task=countdown"]).model.warm_start.demos == 1024


def test_a_model_and_task_pair_with_a_file_of_its_own_is_composed_whole(tmp_path, monkeypatch) -> None:
    """Each group's subtree composed alone can look clean (countdown's 1024 demonstrations equal the default pair's,
    tiny_sokoban.yaml's), yet the pair picks its own file: the planned config must still be Hydra's."""
    import shutil

    from recipes.config import compose

    conf = tmp_path / "conf"
    shutil.copytree(compose.CONF_DIR, conf)
    (conf / "model" / "warm_start" / "small_countdown.yaml").write_text("demos: 77\n")
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    resolver = ConfigResolver(cache_dir=tmp_path / "cache")
    resolver.resolve({"task": "countdown"})  # the single-group subtrees, cached first
    resolver.resolve({"model": "small"})
    resolved = resolver.resolve({"task": "countdown", "model": "small"})
    assert resolved.config.model.warm_start.demos == 77
    assert resolved.digest == composed_digest(resolved.settings, resolver)


def test_a_combination_composed_whole_is_cached_on_disk_until_conf_changes(tmp_path, monkeypatch) -> None:
    """A paper grid composes dozens of model x task pairs whole (seconds each under Hydra); the next plan reads them
    from the cache file, and an edit of `conf/` composes them again."""
    import shutil

    from recipes.config import compose

    conf = tmp_path / "conf"
    shutil.copytree(compose.CONF_DIR, conf)
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    composed = []
    real = compose._compose
    monkeypatch.setattr(compose, "_compose", lambda overrides: composed.append(list(overrides)) or real(overrides))
    pair = {"task": "countdown", "model": "small", "seed": 3}

    first = ConfigResolver(cache_dir=tmp_path / "cache")
    digest = first.resolve(pair).digest
    assert ["model=small", "task=countdown"] in composed
    first.flush()

    composed.clear()
    again = ConfigResolver(cache_dir=tmp_path / "cache").resolve(pair)
    assert composed == [] and again.digest == digest

    (conf / "model" / "warm_start" / "small_countdown.yaml").write_text("demos: 77\n")
    edited = ConfigResolver(cache_dir=tmp_path / "cache").resolve(pair)
    assert ["model=small", "task=countdown"] in composed
    assert edited.config.model.warm_start.demos == 77 and edited.digest == composed_digest(edited.settings, first)


def test_the_planner_resolves_a_cell_in_one_call_into_the_config_room(resolver: ConfigResolver, tmp_path) -> None:
    """Issue #47: a walk of `build_plan` goes down into the config room once per cell (`ConfigResolver.resolve`:
    settings -> validated config and digest) and comes back up once; no orchestrator frame calls a composition
    helper, and nothing in the config room calls back up into the orchestrator."""
    import sys

    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep

    path = tmp_path / "walk.yaml"
    path.write_text("name: walk\nbackend: torch\nbase: {trainer: test}\ngrid: {task: [sokoban, frozenlake]}\n"
                    "seeds: [1, 2]\n")
    definition = load_sweep(path)
    down, up = [], []

    def watch(frame, event, _arg) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_globals.get("__name__", ""), frame.f_back.f_globals.get("__name__", "")
        if caller.startswith("orchestrator.") and callee.startswith("recipes.config."):
            down.append(f"{callee}:{frame.f_code.co_qualname}")
        elif caller.startswith("recipes.config.") and callee.startswith("orchestrator."):
            up.append(f"{caller} -> {callee}:{frame.f_code.co_qualname}")

    sys.setprofile(watch)
    try:
        plan = build_plan(definition, resolver)
    finally:
        sys.setprofile(None)
    assert len(plan.cells) == 4 and up == []
    resolves = [call for call in down if call == "recipes.config.resolve:ConfigResolver.resolve"]
    assert len(resolves) == len(plan.cells)
    assert not [call for call in down if call.startswith("recipes.config.compose:")]
    assert set(down) <= {"recipes.config.resolve:ConfigResolver.resolve", "recipes.config.resolve:ConfigResolver.flush",
                         "recipes.config.resolve:frozen"}, sorted(set(down))
