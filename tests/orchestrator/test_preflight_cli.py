"""`orch sweep FILE --preflight [--json] [--model-config F]` (issue 27): every problem of every cell class, grouped,
exit 1 if any; nothing written; the JSON fields a lab's tooling reads. And (issue 49 item 4) the same checks before
`orch sweep` submits a verl sweep's GPU cells: a cell that cannot fit refuses the sweep (exit 2, one line per class,
nothing written) unless --submit-anyway; what only the user can supply is listed apart; `orch paper --check` names
a paper sweep that does not fit its declared GPUs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

KEYS = {"model", "nodes", "gpus_per_node", "cells", "est_gb_per_gpu", "gpu_mem_gb", "fits", "max_micro_batch",
        "gpu_hours", "problems"}
SWEEP = """
    name: pre
    backend: verl
    base: {trainer: paper, model: hf, model.path: models/Qwen2.5-7B, algorithm: grpo, trainer.micro_batch_size: 1}
    grid:
      task: [sokoban, frozenlake]
    seeds: [1, 2]
    resources:
      default: {gpus_per_node: 4, mem_gb: 256, time_min: 1440}
      rules:
        - when: {task: frozenlake}
          set: {gpus_per_node: 1}
"""


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_preflight_groups_cells_names_every_problem_and_writes_nothing(workdir: Path, sweep_file) -> None:
    path = sweep_file(SWEEP)
    result = invoke("sweep", str(path), "--preflight")
    assert result.exit_code == 1, result.output
    out = result.output
    assert "preflight pre: 4 cells in 2 classes" in out
    assert "c1 models/Qwen2.5-7B on 1n x 4 GPU (verl): 2 cells, 1 configs" in out
    assert "model Qwen2.5-7B (built-in table, 7.62B)" in out and ": fits, micro-batch <=" in out
    assert "c2 models/Qwen2.5-7B on 1n x 1 GPU (verl): 2 cells, 1 configs" in out and "DOES NOT FIT" in out
    assert "memory: rollout needs ~" in out and "set verl.param_offload=true" in out
    assert out.count("no such folder") == 1 and "veRL validate_config: passed" in out  # a need, listed once
    assert "needs from you" in out and "a relative path is read from the folder orch runs in) [c1, c2]" in out
    assert "GPU-hours" in out and "nothing written, nothing submitted" in out
    assert re.search(r"memory verdicts: (\d+) of \1 public runs called right", out)  # its measured record beside it
    assert not (workdir / ".orch").exists() and not (workdir / "mlflow.db").exists()


def test_preflight_json_is_one_object_per_class(workdir: Path, sweep_file) -> None:
    result = invoke("sweep", str(sweep_file(SWEEP)), "--preflight", "--json")
    assert result.exit_code == 1
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and all(row.keys() >= KEYS for row in rows)
    fits = {row["gpus_per_node"]: row["fits"] for row in rows}
    assert fits == {4: True, 1: False}
    assert all(isinstance(line, str) and "\n" not in line for row in rows for line in row["problems"])
    assert rows[0]["gpu_hours"] > 0 and rows[0]["gpu_mem_gb"] == 80


def test_preflight_says_what_a_cell_trains_and_lora_lowers_its_update(workdir: Path, sweep_file) -> None:
    """model.lora (#49 item 2) shows in preflight: the class names its adapters and their count, and the memory model
    counts adapter-only gradients and optimiser state."""
    path = str(sweep_file(SWEEP))

    def classes(*extra: str) -> dict[int, dict]:
        out = invoke("sweep", path, "--preflight", "--json", *extra).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return {row["gpus_per_node"]: row for row in rows}

    full, lora = classes(), classes("--set", "model.lora.rank=8")
    assert full[4]["training"] == ["full-parameter"]
    [line] = lora[4]["training"]
    assert line.startswith("LoRA rank 8, alpha 64 on all-linear: ") and "M adapter parameters" in line
    assert lora[4]["update_gb"] < full[4]["update_gb"]


def test_a_model_config_stands_in_for_a_missing_folder_and_bad_input_exits_2(workdir: Path, sweep_file,
                                                                             tmp_path) -> None:
    path = sweep_file(SWEEP.replace("models/Qwen2.5-7B", "models/My-Own-7B"))
    result = invoke("sweep", str(path), "--preflight")  # only what the user must supply: listed, not failed
    assert result.exit_code == 0 and "pass --model-config FILE" in result.output.split("needs from you")[1]
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                                  "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                                  "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768}))
    result = invoke("sweep", str(path), "--preflight", "--model-config", str(config))
    assert "(--model-config, 7.62B)" in result.output and "pass --model-config" not in result.output
    config.write_text("[1, 2]")
    result = invoke("sweep", str(path), "--preflight", "--model-config", str(config))
    assert result.exit_code == 2 and "not a JSON object" in result.output
    assert invoke("sweep", str(path), "--json").exit_code == 2  # --json goes with --preflight
    assert not (workdir / ".orch").exists()


def test_finished_gpu_runs_of_a_model_calibrate_its_cost(workdir: Path, sweep_file) -> None:
    """A finished verl GPU run of the same model in the tracking store, whose steps took twice what the anchor
    predicts for its own config and GPUs, doubles the estimate of every cell of that model and says so."""
    import yaml
    from mlflow import MlflowClient

    from recipes.config.schema import TrainConfig, compose_tree, resolve_tree
    from recipes.verl.cost import DEVICE_TAG, WORLD_TAG, estimate_cost
    from recipes.verl.memory import BUILTIN

    path = sweep_file(SWEEP)
    before = {row["gpus_per_node"]: row for row in (
        json.loads(line) for line in invoke("sweep", str(path), "--preflight", "--json").stdout.splitlines()
        if line.startswith("{"))}
    uri = f"sqlite:///{workdir / 'runs.db'}"
    tree, _ = compose_tree(["backend=verl", "trainer=paper", "model=hf", "model.path=models/Qwen2.5-7B",
                            "algorithm=grpo", "task=sokoban", "trainer.micro_batch_size=1"])
    cfg = TrainConfig.from_tree(resolve_tree(tree))
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("gpu"), tags={"backend": "verl", DEVICE_TAG: "cuda",
                                                                   WORLD_TAG: "4"})
    client.log_text(run.info.run_id, yaml.safe_dump(cfg.to_tree(), sort_keys=False), "config.yaml")
    predicted = estimate_cost(cfg, BUILTIN["Qwen2.5-7B"].parameters(), 4).step_s
    for step in range(1, 5):
        client.log_metric(run.info.run_id, "timing_s/step", 2 * predicted if step > 1 else 100 * predicted, step=step)
    client.set_terminated(run.info.run_id, "FINISHED")
    after = {row["gpus_per_node"]: row for row in (
        json.loads(line) for line in invoke("sweep", str(path), "--preflight", "--json", "--tracking-uri",
                                             uri).stdout.splitlines() if line.startswith("{"))}
    for gpus in (4, 1):
        assert after[gpus]["gpu_hours"] == pytest.approx(2 * before[gpus]["gpu_hours"], rel=0.02)
        assert "calibrated from 1 finished run(s) of models/Qwen2.5-7B" in after[gpus]["cost_basis"]
        assert before[gpus]["cost_basis"].startswith("anchor: RAGEN-2 Table 5")


# --- the fit check before a submission (issue 49 item 4) ------------------------------------------------------------
# Cases far from any boundary the memory model could move: 14.7B parameters on one 80 GB GPU (the AdamW state alone
# is ~16 bytes a parameter, ~220 GiB), and the tiny code-built model on one GPU (a few MB).
UNFIT = """
    name: unfit
    backend: verl
    base: {trainer: paper, model: hf, model.path: models/Qwen2.5-14B, algorithm: grpo, task: sokoban}
    grid:
      filter: [none, top_p]
    seeds: [1, 2]
    resources:
      default: {gpus_per_node: 1, mem_gb: 64, time_min: 60}
"""
FITS = """
    name: fits
    backend: verl
    base: {trainer: paper, algorithm: grpo, task: sokoban}
    grid:
      filter: [none, top_p]
    seeds: [1]
    resources:
      default: {gpus_per_node: 1, mem_gb: 64, time_min: 60}
"""


@pytest.fixture
def submitted(monkeypatch) -> list:
    """`orch sweep`'s submission replaced by a record of the plans it was given (no job starts)."""
    from orchestrator import engine

    plans: list = []

    def submit_plan(plan, store, executor, **kwargs):
        plans.append(plan)
        return engine.SubmitReport(sweep=plan.name, executor=executor, cells=len(plan.cells), new=len(plan.cells),
                                   submitted=len(plan.cells))

    monkeypatch.setattr(engine, "submit_plan", submit_plan)
    return plans


def test_a_sweep_that_cannot_fit_is_refused_before_anything_is_written(workdir: Path, sweep_file,
                                                                      submitted) -> None:
    result = invoke("sweep", str(sweep_file(UNFIT)), "--cluster", "local")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("orch: error: ") and "1 of 1 verl GPU cell class(es) cannot start as planned" in lines[0]
    assert "--submit-anyway" in lines[0] and "nothing submitted or written" in lines[0]
    classes = [line for line in lines if line.startswith("  c")]
    assert len(classes) == 1  # one line per class: 4 cells, 2 configs, one class
    assert classes[0].startswith("  c1 models/Qwen2.5-14B on 1n x 1 GPU (verl, 4 cells): memory: ")
    # the memory verdict's record beside it: held-out accuracy on its calibration set, the inferred cases marked
    [record] = [line for line in lines if "memory model's record" in line]
    assert "leave-one-out 8 of 9" in record and "3 are inferred" in record and "none seen to fail" in record
    assert "needs from you (a job stops at its start without it):" in lines
    assert any("models/Qwen2.5-14B (" in line and "): no such folder" in line for line in lines)
    assert submitted == [] and not (workdir / ".orch").exists() and not (workdir / "mlflow.db").exists()


def test_submit_anyway_submits_with_the_findings_as_warnings(workdir: Path, sweep_file, submitted) -> None:
    result = invoke("sweep", str(sweep_file(UNFIT)), "--cluster", "local", "--submit-anyway")
    assert result.exit_code == 0, result.output
    assert "orch: warning (--submit-anyway): c1 models/Qwen2.5-14B on 1n x 1 GPU" in result.output
    assert len(submitted) == 1 and "submitted 4" in result.output
    assert invoke("sweep", str(sweep_file(UNFIT)), "--preflight", "--submit-anyway").exit_code == 2


def test_a_sweep_that_fits_is_submitted(workdir: Path, sweep_file, submitted) -> None:
    result = invoke("sweep", str(sweep_file(FITS)), "--cluster", "local")
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output and len(submitted) == 1 and "submitted 2" in result.output


STUDY = """
    study:
      space:
        filter.value: {type: categorical, choices: [0.5, 0.9]}
      objectives:
        - {metric: val/success_rate, reduce: max, direction: maximize}
      sampler: {name: grid, seed: 0}
      trials: 2
      parallel: 2
"""
RESOURCES = """    seeds: [1]
    resources:
      default: {gpus_per_node: 1, mem_gb: 64, time_min: 60}
"""


def test_a_study_none_of_whose_corners_fits_is_refused_and_submit_anyway_tunes_it(workdir: Path, sweep_file,
                                                                                  monkeypatch) -> None:
    """`orch tune` runs the fit check of `orch sweep` before it writes anything: every corner of the space refused
    -> exit 2, one line naming the file, a corner and why, no store; --submit-anyway warns and starts the tuner."""
    from orchestrator import tune

    path = sweep_file(UNFIT.split("    grid:")[0] + STUDY.lstrip("\n") + RESOURCES)
    result = invoke("tune", str(path), "--cluster", "local")
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]  # (above it, at most a first build's progress of the tiny model)
    assert line.startswith(f"orch: error: {path}: no trial of the study can start as planned")
    assert "all 2 corners" in line and "models/Qwen2.5-14B on 1n x 1 GPU" in line and "--submit-anyway" in line
    assert "leave-one-out 8 of 9" in line and "inferred" in line  # the fit verdict's record where it is read
    assert not (workdir / ".orch").exists() and not (workdir / "mlflow.db").exists()
    started: list = []
    monkeypatch.setattr(tune, "start_detached", lambda *args: started.append(args) or (1, workdir / "tuner.log"))
    result = invoke("tune", str(path), "--cluster", "local", "--submit-anyway")
    assert result.exit_code == 0, result.output
    assert "orch: warning (--submit-anyway): " in result.output and started and started[0][-1] is True
    assert invoke("tune", str(path), "--dry-run", "--submit-anyway").exit_code == 2


def test_a_refused_trial_fails_alone_and_the_study_goes_on(workdir: Path, sweep_file, monkeypatch) -> None:
    """Each trial passes the fit check before its cells are stored: a refused one fails in Optuna (the sampler
    learns from it) with the reason in its event line, the next is submitted; --submit-anyway submits both."""
    from orchestrator import tune
    from orchestrator.spec import load_sweep
    from orchestrator.store import Store

    path = sweep_file(FITS.split("    grid:")[0] + STUDY.lstrip("\n") + RESOURCES)
    submitted: list = []
    monkeypatch.setattr(tune, "submit_cells", lambda store, sweep, rows, *rest: submitted.extend(rows))
    monkeypatch.setattr(tune, "trial_refusal", lambda plan: "c1 too big" if any(
        cell.resolved.config.filter.value == 0.5 for cell in plan.cells) else None)
    tuner = tune.Tuner(Store.open(), tune.plan_study(load_sweep(path)), "local")
    report = tuner.poll()
    states = {trial.params["filter.value"]: trial.state.name for trial in tuner.study.get_trials()}
    assert states == {0.5: "FAIL", 0.9: "RUNNING"}, report.events
    assert any("{'filter.value': 0.5}: refused by the fit check: c1 too big" in event for event in report.events)
    (running,) = [trial for trial in tuner.study.get_trials() if trial.state.name == "RUNNING"]
    assert [row.digest for row in submitted] == running.user_attrs[tune.CELLS_ATTR]


def test_preflight_lists_needs_apart_and_they_do_not_fail_it(workdir: Path, sweep_file) -> None:
    """The model folder only the user can supply is under "needs from you", not a problem: a preflight of a
    sweep that fits, on a host without its checkpoint, exits 0."""
    path = sweep_file(FITS.replace("base: {", "base: {model: hf, model.path: models/Qwen2.5-0.5B, "))
    result = invoke("sweep", str(path), "--preflight")
    assert result.exit_code == 0, result.output
    assert "needs from you" in result.output and "no problems" in result.output
    assert "model.path: models/Qwen2.5-0.5B (" in result.output.split("needs from you")[1]
    row = json.loads(invoke("sweep", str(path), "--preflight", "--json").stdout.splitlines()[0])
    assert row["problems"] == [] and len(row["needs"]) == 1 and row["fits"] is True


def test_paper_check_names_a_paper_sweep_that_does_not_fit(workdir: Path, monkeypatch) -> None:
    """`orch paper --check`: one line per class of a paper sweep that does not fit its declared GPUs (the memory
    and vLLM checks only: no model folder asked for); a sweep that fits adds none."""
    import dataclasses
    import textwrap

    from analysis import paper
    from analysis.cli import paper_problems
    from analysis.reports.paper_report import SECTIONS

    sweeps = workdir / "sweeps"
    sweeps.mkdir()
    (sweeps / "unfit.yaml").write_text(textwrap.dedent(UNFIT))
    (sweeps / "fits.yaml").write_text(textwrap.dedent(FITS))
    monkeypatch.setattr(paper, "SWEEPS_DIR", sweeps)
    monkeypatch.setattr(paper, "ITEMS", (dataclasses.replace(paper.ITEMS[0], sweeps=("unfit", "fits")),))
    problems = paper_problems(set(SECTIONS))
    unfit = [line for line in problems if "does not fit" in line]
    assert len(unfit) == 1, problems
    assert unfit[0].startswith("sweeps/unfit.yaml (unfit): does not fit its declared hardware: models/Qwen2.5-14B on "
                               "1n x 1 GPU (verl, 4 cells): memory: ")
    assert "no such folder" not in unfit[0]
    assert "leave-one-out 8 of 9 on its calibration set" in unfit[0] and "inferred" in unfit[0]


def test_preflight_composes_the_config_the_job_composes_once_per_distinct_overrides() -> None:
    """The shared composition (veRL's base config once, each cell's overrides applied by Hydra's own code) gives
    the config `recipes.verl.config_map.verl_config` composes, less the `orch` node; configs that differ only in
    the filter (veRL's run name) share one composition and one validation."""
    from omegaconf import OmegaConf

    from recipes.config.schema import TrainConfig, compose_tree, resolve_tree
    from recipes.verl.config_map import VerlJob, verl_config
    from recipes.verl.preflight import PreflightCache

    def config(*overrides: str) -> TrainConfig:
        tree, _ = compose_tree(["backend=verl", "trainer=paper", "task=sokoban", *overrides])
        return TrainConfig.from_tree(resolve_tree(tree))

    job = VerlJob(model_path="/m", tokenizer_path="/t", train_file="a.parquet", val_file="b.parquet",
                  checkpoint_dir="/c", prompt_length=256, nnodes=1, gpus_per_node=2)
    with PreflightCache() as cache:
        for cfg in (config("algorithm=ppo"), config("algorithm=grpo", "verl.tensor_parallel=2")):
            fast, _ = cache.config(cfg, job)
            slow = OmegaConf.to_container(verl_config(cfg, job))
            del slow["orch"]
            assert OmegaConf.to_container(fast) == slow
            assert OmegaConf.is_struct(fast)
        assert (cache.composed, cache.validated) == (2, 2)
        cache.config(config("algorithm=grpo", "verl.tensor_parallel=2", "filter=top_p"), job)
        assert (cache.composed, cache.validated) == (2, 2)


def test_resume_replan_runs_the_fit_check_and_submit_anyway_replans_all_the_same(workdir: Path, sweep_file,
                                                                                 monkeypatch) -> None:
    """Issue 60: `orch resume --replan` gave cells their new configs without the fit check `orch sweep` and `orch
    tune` run. A stored verl sweep whose cells cannot fit (here as planned with --submit-anyway): the replan is refused
    with exit 2 and one line per class, nothing written or submitted; --submit-anyway replans and resumes with the
    findings as warnings; --dry-run prints the check's finding and writes nothing."""
    from orchestrator import engine
    from orchestrator.engine import cell_fields, save_sweep_row
    from orchestrator.plan import build_plan
    from orchestrator.spec import load_sweep
    from orchestrator.store import Store

    plan = build_plan(load_sweep(sweep_file(UNFIT)))
    store = Store.open()
    sweep = save_sweep_row(store, plan.definition, "local", plan.varied)
    store.add_cells(sweep.id, cell_fields(plan))
    resumed: list = []
    monkeypatch.setattr(engine, "resume", lambda store, name, **kwargs: resumed.append(name) or engine.SubmitReport(
        sweep=name, executor="local", cells=4, submitted=4))
    before = [(row.digest, row.state, row.updated_at) for row in store.cell_rows(sweep.id)]

    refused = invoke("resume", "unfit", "--replan")
    assert refused.exit_code == 2, refused.output
    lines = refused.output.strip().splitlines()
    assert lines[0].startswith("orch: error: ") and "1 of 1 verl GPU cell class(es) cannot start as planned" in lines[0]
    assert [line for line in lines if line.startswith("  c")][0].startswith(
        "  c1 models/Qwen2.5-14B on 1n x 1 GPU (verl, 4 cells): memory: ")
    assert resumed == [] and [(r.digest, r.state, r.updated_at) for r in store.cell_rows(sweep.id)] == before

    dry = invoke("resume", "unfit", "--replan", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("sweep unfit (dry run: nothing written): 4 cell(s)") and "fit check: " in dry.output
    assert "cannot start as planned" in dry.output and resumed == []
    assert [(r.digest, r.state, r.updated_at) for r in store.cell_rows(sweep.id)] == before

    anyway = invoke("resume", "unfit", "--replan", "--submit-anyway")
    assert anyway.exit_code == 0, anyway.output
    assert "orch: warning (--submit-anyway): c1 models/Qwen2.5-14B on 1n x 1 GPU" in anyway.output
    assert "4 same identity (config stored again), 0 changed identity" in anyway.output and resumed == ["unfit"]
    for args in (["--dry-run"], ["--submit-anyway"]):  # they go with --replan
        assert invoke("resume", "unfit", *args).exit_code == 2
    assert invoke("resume", "unfit", "--replan", "--dry-run", "--submit-anyway").exit_code == 2


def test_a_model_folder_with_only_its_config_json_serves_the_memory_estimate_and_names_what_is_missing(
        workdir: Path, sweep_file) -> None:
    """Issue 60, tried as a new user would: a model folder holding only config.json (planning before the weights are
    copied) got `memory: no config.json for <folder> ... pass --model-config FILE`, though the file is there. Its
    config.json now serves the memory estimate (a name the built-in table does not know), and the needs say what is
    missing: the tokenizer and the weights."""
    from recipes.verl.memory import BUILTIN

    folder = workdir / "models" / "lab-model-small"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(BUILTIN["Qwen2.5-0.5B"].config_json()))
    path = sweep_file(FITS.replace("base: {", "base: {model: hf, model.path: models/lab-model-small, "))
    result = invoke("sweep", str(path), "--preflight", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.splitlines()[0])
    assert row["architecture"].startswith("models/lab-model-small (config.json, 0.4") and row["fits"] is True
    assert row["problems"] == [] and not any("no config.json" in line for line in row["needs"])
    assert sorted(line.split(": ", 2)[2].split(" (")[0] for line in row["needs"]) == ["no tokenizer", "no weights"]
    text = invoke("sweep", str(path), "--preflight").output
    assert "model.path: models/lab-model-small: no tokenizer" in text and "pass --model-config" not in text
    assert "model.path: models/lab-model-small: no weights" in text
