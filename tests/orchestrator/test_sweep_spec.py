"""Sweep files: expansion (grid, axes, linked settings, include/exclude, seeds), profiles, --set, and bad input
that must name the file, the line, the key and the valid choices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchlib.errors import OrchError


def plan_of(path: Path, **kwargs):
    return build_plan(load_sweep(path, **kwargs))


def error_of(path: Path, **kwargs) -> str:
    with pytest.raises(OrchError) as info:
        plan_of(path, **kwargs)
    return str(info.value)


def test_grid_axes_linked_exclude_include_and_seeds(workdir: Path, sweep_file) -> None:
    path = sweep_file("""
        name: shape
        base: {algorithm: ppo, trainer: test}
        grid:
          task: [sokoban, frozenlake]
          filtering:                      # linked: each row sets several keys together
            - {filter: none}
            - {filter: top_p, filter.value: 0.8}
        axes:
          algo: [{algorithm: grpo}, {algorithm: dapo}]
          steps: [{trainer.total_steps: 3}]
        seeds: [1, 2]
        exclude:
          - {axis: steps, task: frozenlake}
        include:
          - {task: countdown, filter: none}
    """)
    plan = plan_of(path)
    # rows: base + 2 algo + 1 steps = 4; x 2 tasks x 2 filters x 2 seeds = 32; minus steps x frozenlake (4);
    # plus the include entry x 2 seeds.
    assert len(plan.cells) == 32 - 4 + 2
    assert plan.varied[0] == "axis"
    assert {"task", "filter", "seed", "algorithm"} <= set(plan.varied)
    axes = {cell.axis for cell in plan.cells}
    assert axes == {"base", "algo", "steps", "include"}
    steps = [cell for cell in plan.cells if cell.axis == "steps"]
    assert {cell.settings["task"] for cell in steps} == {"sokoban"}
    assert all(cell.settings["trainer.total_steps"] == 3 for cell in steps)
    linked = [cell for cell in plan.cells if cell.settings.get("filter") == "top_p"]
    assert linked and all(cell.settings["filter.value"] == 0.8 for cell in linked)
    assert len({cell.digest for cell in plan.cells}) == len(plan.cells)


def test_identity_ignores_spelling_and_normalises_types(workdir: Path, sweep_file) -> None:
    first = plan_of(sweep_file("""
        name: a
        base: {filter: top_p, trainer: test, filter.value: 1}
    """, "a.yaml"))
    # filter.value 1 -> 1.0 (a float key); the default top_p value spelled out is the same config.
    second = plan_of(sweep_file("""
        name: b
        description: a comment changes nothing
        base: {filter: top_p, trainer: test, filter.value: 1.0}
    """, "b.yaml"))
    assert first.cells[0].digest == second.cells[0].digest
    assert first.cells[0].settings["filter.value"] == 1.0
    default = plan_of(sweep_file("name: c\nbase: {trainer: test}\n", "c.yaml"))
    spelled = plan_of(sweep_file("name: d\nbase: {trainer: test, filter.value: 0.9}\n", "d.yaml"))
    assert default.cells[0].digest == spelled.cells[0].digest


def test_resources_rules_group_cells(workdir: Path, sweep_file) -> None:
    path = sweep_file("""
        name: res
        base: {trainer: test}
        grid:
          task: [sokoban, frozenlake, countdown]
        resources:
          default: {cpus_per_task: 2, time_min: 30, gpus_per_node: 1}
          rules:
            - when: {task: countdown}
              set: {time_min: 90}
            - when: {model.preset.hidden_size: 128}   # a key of the resolved config, not a setting
              set: {mem_gb: 8}
    """)
    plan = plan_of(path)
    groups = plan.resource_groups()
    assert len(groups) == 2
    times = sorted(resources.time_min for resources in groups)
    assert times == [30, 90]
    assert all(resources.mem_gb == 8 for resources in groups)
    assert plan.gpu_hours() == pytest.approx(0.5 * 2 + 1.5)


def test_profile_and_set_force_keys_and_merge_collapsed_cells(workdir: Path, sweep_file) -> None:
    path = sweep_file("""
        name: prof
        backend: verl
        base: {trainer: test, model: hf, model.path: models/big}
        axes:
          size: [{model.path: models/small}, {model.path: models/huge}]
        seeds: [1, 2]
        profiles:
          cpu:
            backend: torch
            set: {model: tiny, model.path: null}
            seeds: [7]
    """)
    plan = plan_of(path)
    assert {cell.backend for cell in plan.cells} == {"verl"}
    plan.check_submittable()  # verl cells run (the model folders need only exist where they run)
    rehearsal = plan_of(path, profile="cpu", sets=["trainer.total_steps=3", "cluster.array_parallelism=4"])
    assert len(rehearsal.cells) == 1  # the three size rows became the same config
    assert rehearsal.notes and "merged" in rehearsal.notes[0]
    cell = rehearsal.cells[0]
    assert (cell.backend, cell.seed, cell.settings["trainer.total_steps"]) == ("torch", 7, 3)
    assert rehearsal.definition.spec.cluster.array_parallelism == 4
    rehearsal.check_submittable()


def test_shared_profiles_file(workdir: Path, sweep_file) -> None:
    sweep_file("fast:\n  set: {trainer.total_steps: 1}\n", "profiles.yaml")
    path = sweep_file("name: s\nbase: {trainer: test}\n")
    assert plan_of(path, profile="fast").cells[0].settings["trainer.total_steps"] == 1
    assert "unknown profile 'slow'; valid choices: fast" in error_of(path, profile="slow")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\ngrid:\n  task: [sokobn]\n",
         r"sweep\.yaml:3: grid\.task\[0\]: unknown task option 'sokobn'; valid choices: countdown, deepcoder, frozenlake"),
        ("name: x\nbase:\n  algorithm: reinforce\n",
         r"sweep\.yaml:3: base\.algorithm: unknown algorithm option 'reinforce'; valid choices: dapo, dapo_dynamic, drgrpo"),
        ("name: x\nbase:\n  model: gpt5\n", r":3: base\.model: unknown model option 'gpt5'; valid choices: .*tiny"),
        ("name: x\ngrid:\n  trainer.bogus: [1]\n",
         r"sweep\.yaml:3: grid\.trainer\.bogus.*unknown config key 'bogus' under 'trainer'; valid choices: .*total_steps"),
        ("name: x\nbase:\n  trainer.total_steps: lots\n",
         r":3: base\.trainer\.total_steps: config key trainer\.total_steps: expected an integer"),
        ("name: x\nbase:\n  filter.strategy: top_q\n", r":3: base\.filter\.strategy: config key filter\.strategy"),
        ("name: x\nbogus: 1\n", r"sweep\.yaml:2: bogus: unknown key 'bogus'; valid choices: axes, backend, base"),
        ("name: x\ncluster:\n  partitions: gpu\n", r":3: cluster\.partitions: unknown key .*valid choices: account"),
        ("name: x\nresources:\n  default: {gpus: 1}\n", r":3: resources\.default\.gpus: unknown key 'gpus'"),
        ("name: x\nseeds: [a]\n", r":2: seeds\[0\]: must be an integer >= 0"),
        ("grid: {}\n", r"sweep\.yaml:1: name: required key missing"),
        ("name: x\ngrid:\n  task: []\n", r":3: grid\.task: empty list"),
        ("name: x\ngrid:\n  task: [sokoban, sokoban]\n", r":3: grid\.task\[1\]: duplicate value"),
        ("name: x\ngrid:\n  task: [sokoban, {filter: none}]\n", r":3: grid\.task: mix of values and mappings"),
        ("name: x\ngrid:\n  task: [sokoban]\n  t2: [{task: frozenlake}]\n",
         r":4: grid\.t2: conflicting linked settings: task is also set by grid dimension 'task' \(line 3\)"),
        ("name: x\ngrid:\n  task: [sokoban]\naxes:\n  a: [{task: countdown}]\n",
         r":5: axes\.a: conflicting settings: axis 'a' sets task, which grid dimension 'task' varies"),
        ("name: x\naxes:\n  a: [{filter: none}]\n  b: [{filter: none}]\n", r"duplicate cells: axes\.b\[0\] \(line 4\)"),
        ("name: x\ngrid:\n  filter.value: [0.9]\n  f: [{filter.value: 0.9}]\n", r"conflicting linked settings"),
        ("name: x\nexclude:\n  - {task: sokobn}\n", r":3: exclude\[0\]: this exclude rule matches no cell"),
        ("name: x\ngrid:\n  task: [sokoban]\nexclude:\n  - {task: sokoban}\n", r"the sweep has no cells"),
        ("name: x\nbase:\n  seed: 3\n", r":3: base\.seed: set seeds with the top-level `seeds:` list"),
        ("name: x\nbase:\n  mlflow.run_id: abc\n", r":3: base\.mlflow\.run_id: .*set by the orchestrator"),
        ("name: x\nbase:\n  trainer: {total_steps: 3}\n", r"trainer option"),
        ("name: x\nbase:\n  task.env: 3\n", r"config key task\.env: is a section; set one of its keys"),
        ("name: x\nbase: {trainer: test}\nbase: {}\n", r"sweep\.yaml:3: base: duplicate key 'base' \(first set on line 2\)"),
        ("name: x\ngrid: [1\n", r"sweep\.yaml:3:1: YAML syntax error"),
        ("- 1\n", r"sweep\.yaml:1: a sweep file is a mapping"),
        ("name: bad name\n", r":1: name: String should match pattern"),
    ],
)
def test_bad_input_names_file_line_key_and_choices(workdir: Path, sweep_file, text: str, expected: str) -> None:
    path = sweep_file(text)
    message = error_of(path)
    assert re.search(expected, message), message
    assert not (workdir / ".orch").exists()


def test_bad_set_and_profile(workdir: Path, sweep_file) -> None:
    path = sweep_file("name: x\nbase: {trainer: test}\n")
    assert "expected KEY=VALUE" in error_of(path, sets=["trainer.total_steps"])
    assert "no profiles defined" in error_of(path, profile="cpu")
    assert "unknown config key 'bogus'" in error_of(path, sets=["trainer.bogus=1"])
    assert "cluster.array_parallelism" in error_of(path, sets=["cluster.array_parallelism=0"])


def test_missing_file() -> None:
    with pytest.raises(OrchError, match="sweep 'nope.yaml': no such file in .*, nor a sweep orch ships; shipped"):
        load_sweep("nope.yaml")


@pytest.mark.parametrize(("stall", "line", "message"), [
    ("{after_s: 60, action: explode}", 3, "cluster.stall.action: Input should be 'flag', 'fail' or 'requeue'"),
    ("{after_s: 0}", 3, "cluster.stall.after_s: Input should be greater than 0"),
    ("{after: 60}", 3, "cluster.stall.after: unknown key 'after'; valid choices: action, after_s"),
])
def test_a_bad_stall_rule_names_its_line_and_the_choices(workdir: Path, sweep_file, stall: str, line: int,
                                                        message: str) -> None:
    path = sweep_file(f"name: s\ncluster:\n  stall: {stall}\nbase: {{trainer: test}}\n")
    assert error_of(path).startswith(f"{path}:{line}: {message}")


def test_the_stall_rule_defaults_to_flagging_after_ten_minutes(workdir: Path, sweep_file) -> None:
    rule = load_sweep(sweep_file("name: s\nbase: {trainer: test}\n")).spec.cluster.stall
    assert (rule.after_s, rule.action) == (600, "flag")
    assert rule.stalled("running", 1000.0, 1601.0) and not rule.stalled("running", 1000.0, 1599.0)
    assert not rule.stalled("queued", 0.0, 1e9) and not rule.stalled("running", None, 1e9)


@pytest.mark.parametrize(("text", "line", "key", "meant"), [
    ("name: s\nbase:\n  trainer: test\n  trainer.total_step: 3\n", 4, "unknown config key 'total_step' under 'trainer'",
     "total_steps"),
    ("name: s\nbase: {trainer: test}\nseed: [0]\n", 3, "unknown key 'seed'", "seeds"),
    ("name: s\nbase: {trainer: test}\ngrid:\n  task: [frozenlak]\n", 4, "unknown task option 'frozenlak'", "frozenlake"),
    ("name: s\nbase: {trainer: test}\ncluster:\n  stall: {after: 60}\n", 4, "unknown key 'after'", "after_s"),
])
def test_a_typo_gets_the_near_choice_after_the_valid_ones(workdir: Path, sweep_file, text: str, line: int, key: str,
                                                          meant: str) -> None:
    """A misspelt key or option still lists every valid choice, then names the one close to it."""
    path = sweep_file(text)
    message = error_of(path)
    assert message.startswith(f"{path}:{line}: ") and key in message, message
    choices = message.split("; valid choices: ", 1)[1]
    assert meant in choices.split(";")[0].split(", ") and f"; did you mean {meant!r}?" in choices, message


def test_a_key_near_no_choice_gets_no_guess(workdir: Path, sweep_file) -> None:
    message = error_of(sweep_file("name: s\nbase: {trainer: test}\nbogus: 1\n"))
    assert "unknown key 'bogus'; valid choices: axes" in message and "did you mean" not in message
