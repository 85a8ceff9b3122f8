"""The shipped sweep files validate against conf/, and the `cpu` profile turns every paper sweep into a
torch-backend rehearsal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchlib.errors import OrchError

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
FILES = sorted(path.name for path in SWEEPS.glob("*.yaml") if path.name != "profiles.yaml"
               and "study" not in yaml.safe_load(path.read_text()))
# From the paper and RAGEN's scripts (docs/paper.md): Table 4 has 10 text rows (base, 3 algorithms, 4 sizes with
# 14B, 2 model types) x 4 tasks + 2 Qwen2.5-VL rows x 2 grid tasks, x 2 filters x 3 seeds; Table 6 has 4 quartiles
# and Table 7 3 levels; the top-p sweep is Sokoban's 7 rho values plus its unfiltered arm; the slip sweep 7 rates x
# 2 arms; the entropy and KL sweeps 6 coefficients each; the filter comparison 4 tasks x 3 arms; the length sweep 8
# environments; all x 3 seeds.
EXPECTED_CELLS = {
    "demo.yaml": 2,
    "table4.yaml": (10 * 4 + 2 * 2) * 2 * 3,
    "table5.yaml": 21,
    "table6.yaml": 4 * 3,
    "table7.yaml": 3 * 3,
    "topp.yaml": (7 + 1) * 3,
    "slip.yaml": 7 * 2 * 3,
    "entropy.yaml": 6 * 3,
    "kl.yaml": 6 * 3,
    "filters.yaml": (3 + 3 + 4 + 3) * 3,  # Sokoban, SearchQA, WebShop (its top-p 0.95 arm), DeepCoder
    "length.yaml": 8 * 3,
    "gradient.yaml": 3,
    "repro_tiny.yaml": 2 * 3,
    "repro_long.yaml": 2 * 2 * 5,
    "controls_graded.yaml": 2 * 5 * 4,  # 2 tasks x 5 plant strengths x 4 seeds
    "predictor_grid.yaml": 5 * 3 * 3,  # 5 conditions x 3 filter arms x 3 seeds
}
# laptop sweeps: the torch backend as written, no cpu profile needed
TORCH_SWEEPS = {"demo.yaml", "repro_tiny.yaml", "repro_long.yaml", "controls_graded.yaml", "predictor_grid.yaml"}


def test_every_required_sweep_file_is_shipped() -> None:
    required = {"demo.yaml", "table4.yaml", "table5.yaml", "table6.yaml", "table7.yaml", "topp.yaml", "slip.yaml",
                "entropy.yaml", "kl.yaml", "filters.yaml", "length.yaml", "gradient.yaml"}
    assert required <= set(FILES)


# Tasks whose paper data set orch can read (`envs.base.DataSource` with a key): a `data: real` sweep refuses them
# while their data key is unset.
READS_DATA = {"countdown", "metamathqa", "searchqa", "webshop", "deepcoder"}


@pytest.mark.parametrize("name", FILES)
def test_sweep_file_validates(name: str, workdir: Path) -> None:
    plan = build_plan(load_sweep(SWEEPS / name))
    if name in EXPECTED_CELLS:
        assert len(plan.cells) == EXPECTED_CELLS[name]
    tasks = {cell.settings["task"] for cell in plan.cells if "task" in cell.settings} or {"sokoban"}
    if name in TORCH_SWEEPS:
        assert plan.definition.spec.data == "any"
    else:  # a paper sweep as written needs the paper's data: each task left on a built-in set is one problem
        assert plan.definition.spec.data == "real"
        assert set(plan.builtin_data) == tasks & READS_DATA
    problems = plan.problems()
    refused = plan.builtin_data if plan.definition.spec.data == "real" else {}  # `data: any` takes built-in sets
    assert len(problems) == len(refused)
    assert all(f"task {task} would train on" in line for line, task in zip(problems, refused, strict=True))
    if not problems:
        plan.check_submittable()
    if name in TORCH_SWEEPS:
        assert {cell.backend for cell in plan.cells} == {"torch"}
    else:
        assert {cell.backend for cell in plan.cells} == {"verl"}
    assert not (workdir / ".orch").exists()


@pytest.mark.parametrize("name", [name for name in FILES if name not in TORCH_SWEEPS])
def test_cpu_profile_rehearses_a_paper_sweep(name: str) -> None:
    plan = build_plan(load_sweep(SWEEPS / name, profile="cpu"))
    plan.check_submittable()
    assert {cell.backend for cell in plan.cells} == {"torch"}
    assert all(cell.resources.gpus_per_node == 0 for cell in plan.cells)
    assert {cell.settings["model"] for cell in plan.cells} <= {"tiny", "tiny_vl"}  # tiny_vl: VL rows (table4)


@pytest.mark.parametrize("name", [name for name in FILES if name not in TORCH_SWEEPS])
def test_cpu_verl_profile_rehearses_a_paper_sweep_on_the_verl_backend(name: str) -> None:
    plan = build_plan(load_sweep(SWEEPS / name, profile="cpu-verl"))
    plan.check_submittable()
    assert {cell.backend for cell in plan.cells} == {"verl"}
    assert all(cell.resources.gpus_per_node == 0 for cell in plan.cells)
    assert {cell.settings["model"] for cell in plan.cells} == {"tiny"}
    # The cpu profile's Table 4 VL rows run tiny_vl (text, image): 8 cells; cpu-verl plays them as text on the tiny
    # model, the text row merged with the base, the image row (MI off there: docs/paper.md) its own 4 cells.
    vision_rows = 8 - 4 if name == "table4.yaml" else 0
    assert len(plan.cells) + vision_rows == len(build_plan(load_sweep(SWEEPS / name, profile="cpu")).cells)


def test_table4_rows_match_the_paper() -> None:
    plan = build_plan(load_sweep(SWEEPS / "table4.yaml"))
    rows = {
        (cell.axis, cell.settings.get("algorithm"), cell.settings.get("model.path"),
         cell.settings.get("task.env.observation"))
        for cell in plan.cells
    }
    assert len(rows) == 12  # PPO/3B base + 3 algorithms + 4 sizes (with 14B) + 2 model types + 2 modalities
    assert {cell.settings["task"] for cell in plan.cells} == {"sokoban", "frozenlake", "metamathqa", "countdown"}
    assert {cell.seed for cell in plan.cells} == {1, 2, 3}
    modality = [cell for cell in plan.cells if cell.axis == "modality"]
    assert {cell.settings["task"] for cell in modality} == {"sokoban", "frozenlake"}
    assert {cell.settings["task.env.observation"] for cell in modality} == {"text", "image"}
    assert {cell.settings["model.path"] for cell in modality} == {"models/Qwen2.5-VL-3B-Instruct"}


def test_table4_dry_run_lists_the_modality_rows(workdir: Path) -> None:
    result = CliRunner().invoke(app, ["sweep", str(SWEEPS / "table4.yaml"), "--dry-run", "--limit", "0"])
    assert result.exit_code == 0, result.output
    cells: list[str] = []  # one entry per cell: a row of the table, or a cell's wrapped lines (a narrow terminal)
    for line in result.output.splitlines():
        if re.match(r"\s*\d+\s+[0-9a-f]{12}\s", line):
            cells.append(line)
        elif cells and line.startswith(" ") and line.strip():
            cells[-1] += " " + line.strip()
    rows = [re.split(r"[\s=]+", cell) for cell in cells if "Qwen2.5-VL" in cell]
    assert len(rows) == 2 * 2 * 2 * 3  # 2 modalities x 2 grid tasks x 2 filters x 3 seeds
    assert sum("image" in row for row in rows) == sum("text" in row for row in rows) == 12
    assert not (workdir / ".orch").exists()


def test_table4_cpu_rehearsal_plays_the_modality_rows_as_vision_rows() -> None:
    plan = build_plan(load_sweep(SWEEPS / "table4.yaml", profile="cpu"))
    vision = [cell for cell in plan.cells if cell.settings["model"] == "tiny_vl"]
    assert {cell.axis for cell in vision} == {"modality"}
    assert sorted((c.settings["task"], c.settings["task.env.observation"], c.settings["filter"]) for c in vision) == \
        sorted((task, observation, name) for task in ("sokoban", "frozenlake") for observation in ("text", "image")
               for name in ("none", "top_p_softmax"))
    assert {cell.settings["model"] for cell in plan.cells} == {"tiny", "tiny_vl"}
    assert {c.settings["task.env.observation"] for c in plan.cells if c.settings["model"] == "tiny"} == {"text"}
    # PPO + 3 algorithms (model rows merge) x 4 tasks x 2 filters, + 2 modality rows x 2 grid tasks x 2 filters
    assert len(plan.cells) == 4 * 4 * 2 + 2 * 2 * 2


def test_image_observations_are_refused_on_the_torch_backend() -> None:
    definition = load_sweep(SWEEPS / "table6.yaml", profile="cpu", sets=["task.env.observation=image"])
    with pytest.raises(OrchError, match="task.env.observation: image observations need a vision-language model"):
        build_plan(definition)


def test_a_paper_sweep_refuses_generated_data_before_writing_and_takes_a_data_path(workdir: Path) -> None:
    """`data: real` (every paper sweep): a task left on orch's built-in set is refused, exit 2, one line naming the
    data key and the formats, nothing written; the dry run lists every such problem; the cpu profile allows the
    built-in sets; a data path in the grid satisfies the rule."""
    runner = CliRunner()
    refused = runner.invoke(app, ["sweep", str(SWEEPS / "filters.yaml"), "--cluster", "local"])
    assert refused.exit_code == 2, refused.output
    (line,) = refused.output.strip().splitlines()
    assert "filters.yaml:" in line and "data: real, but 9 cell(s) of task searchqa" in line
    assert "task.env.data_path to HotpotQA JSON/JSONL/Parquet" in line and "(and 2 more problem(s)" in line
    assert sorted(path.name for path in workdir.iterdir()) == []
    dry = runner.invoke(app, ["sweep", str(SWEEPS / "filters.yaml"), "--dry-run"])
    assert dry.exit_code == 0 and "problems (3;" in dry.output
    assert "task.env.products_path to WebShop items_shuffle" in dry.output and "task deepcoder" in dry.output
    assert "problems" not in runner.invoke(app, ["sweep", str(SWEEPS / "filters.yaml"), "--dry-run",
                                                 "--profile", "cpu"]).output
    own = workdir / "mm.yaml"
    own.write_text("name: mm\nbackend: torch\nbase: {trainer: test}\ndata: real\n"
                   "grid:\n  task: [{task: sokoban}, {task: metamathqa, task.env.data_path: /data/metamathqa.json}]\n")
    plan = build_plan(load_sweep(own))
    assert plan.problems() == [] and plan.builtin_data == {}
