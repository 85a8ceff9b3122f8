"""The paper map (analysis/paper.py): every result table and figure of RAGEN-2 (arXiv 2604.06268) is in it, every
item has a sweep that logs what it needs and a report section, `orch paper` and `orch paper --check` say so, and
the report puts the published value beside the measured one with a verdict (analysis/paper_report.py,
analysis/verdicts.py)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analysis import paper, verdicts
from analysis.paper_report import SECTIONS, comparison, paper_sections, table4_row
from orchestrator.cli import app

# The paper's result tables (Tables 1-3 describe the method and setup) and the result figures its text describes,
# by what they show (no source here numbers the figures: docs/paper.md).
RESULT_TABLES = ("Table 4", "Table 5", "Table 6", "Table 7")
RESULT_FIGURES = (
    "Figure: diagnostics vs task performance",  # MI family ~ +0.39, entropy family -0.11 to -0.14
    "Figure: reward variance vs candidate proxies",  # reward 0.63/0.65 ... conditional entropy -0.14/-0.18
    "Figure: MI falls before success",  # the early warning
    "Figure: gradient norm by reward-variance bucket",  # the SNR mechanism, 6 RV buckets
    "Figure: the top-p sweep",  # rho in {1.0, 0.98, 0.95, 0.9, 0.8, 0.6, 0.4}
    "Figure: top-p vs top-k vs no filter",  # Sokoban, SearchQA, WebShop, DeepCoder
    "Figure: entropy and KL tuning vs filtering",  # tuning moves runs along the entropy axis only
    "Figure: response length over training",  # all 8 environments, -5% to -66%
    "Figure: format validity vs MI",  # near perfect even under collapse
    "Figure: FrozenLake slip rate",  # slip 0-50% keeps the gain, 80-100% loses it
    "Figure: the Std(RV)/Mean(RV) predictor",  # 1.29, 1.16 helped; 0.33 hurt
)


def test_the_map_holds_every_result_table_and_figure_once() -> None:
    refs = [item.ref for item in paper.ITEMS]
    assert sorted(refs) == sorted(RESULT_TABLES + RESULT_FIGURES)
    assert len({item.key for item in paper.ITEMS}) == len(paper.ITEMS)
    for item in paper.ITEMS:
        assert item.sweeps and item.metrics and item.section and item.settings and item.claim, item.key
        assert all(paper.sweep_path(sweep).exists() for sweep in item.sweeps), item.key
        assert item.section in SECTIONS, item.key


def test_published_values_are_the_papers_and_live_only_in_the_map() -> None:
    assert paper.TABLE4["PPO Qwen2.5-3B"][:2] == ((12.9, 67.0, 92.6, 97.9), (16.0, 10.9, 0.6, 0.0))
    assert paper.TABLE5[(8, 16)] == (15.6, 23.6, 89.2, 65.9)
    assert paper.TABLE6[1] == (4.4, 5.6, 21.1, 0.95, 2.02)
    assert paper.TABLE7["trajectory"] == (8.0, 64.0, 16.8, 0.20)
    assert [point[3] for point in paper.PREDICTOR_POINTS] == [1.29, 1.16, 0.33]
    from analysis.predictor import PAPER_REFERENCES

    assert "1.29" in PAPER_REFERENCES and "1.16" in PAPER_REFERENCES and "0.33" in PAPER_REFERENCES
    table4 = paper.BY_KEY["table4"].published
    assert len(table4) == 2 * sum(b is not None for base, _, _, _ in paper.TABLE4.values() for b in base)
    assert all(value.kind == verdicts.DIRECTION for value in table4 if value.at["stat"] == "delta")
    # a claim the paper only draws carries its sign, never a made-up magnitude
    for item in paper.ITEMS:
        for value in item.published:
            if value.figure_only and value.kind == verdicts.DIRECTION:
                assert value.value in (-1, 0, 1), (item.key, value)
    # no published number of the paper as a literal anywhere else in analysis/ (prose may cite them)
    import ast

    distinctive = {12.9, 67.6, 1.29, 1.16, 0.33, 89.8, 21.1, 0.39, 0.63, 23.6}
    for path in Path(paper.__file__).parent.glob("*.py"):
        if path.name != "paper.py":
            literals = {node.value for node in ast.walk(ast.parse(path.read_text()))
                        if isinstance(node, ast.Constant) and isinstance(node.value, float)}
            assert not literals & distinctive, (path.name, literals & distinctive)


def test_every_paper_sweep_turns_the_diagnostics_on_for_every_cell() -> None:
    assert paper.check(set(SECTIONS)) == []


def test_check_names_a_sweep_without_diagnostics_a_missing_sweep_and_a_missing_section(tmp_path, monkeypatch) -> None:
    sweeps = tmp_path / "sweeps"
    shutil.copytree(paper.SWEEPS_DIR, sweeps)
    topp = sweeps / "topp.yaml"
    topp.write_text(topp.read_text().replace("  hooks: [collapse]\n", ""))
    (sweeps / "gradient.yaml").unlink()
    monkeypatch.setattr(paper, "SWEEPS_DIR", sweeps)
    problems = paper.check(set(SECTIONS) - {"slip"}, profile="cpu")
    # every paper sweep logs the MI diagnostics, as every RAGEN run does, whatever its own items need
    assert "sweeps/topp.yaml (topp): 8 of 8 cells of sweeps/topp.yaml do not log collapse/trajectory/mi_zscore_ema " \
           "(set hooks: [collapse] with diagnostics.mi_every > 0)" in problems, problems
    assert any("(gradient): no sweep file sweeps/gradient.yaml" in line for line in problems), problems
    assert any("(slip): no report section 'slip'" in line for line in problems), problems
    # a sweep an MI item needs, without the hook: every one of its cells is named
    table6 = sweeps / "table6.yaml"
    table6.write_text(table6.read_text().replace("  hooks: [collapse]", "  hooks: []"))
    problems = paper.check(set(SECTIONS), profile="cpu")
    assert "Table 6 (table6): 4 of 4 cells of sweeps/table6.yaml do not log collapse/trajectory/mi_est (set hooks: " \
           "[collapse] with diagnostics.mi_every > 0)" in problems, problems


def test_orch_paper_prints_the_map_and_check_exits_by_its_problems(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    listed = CliRunner().invoke(app, ["paper", "--json"])
    assert listed.exit_code == 0, listed.output
    items = json.loads(listed.stdout)["items"]
    assert [item["ref"] for item in items] == [item.ref for item in paper.ITEMS]
    table4 = items[0]
    assert table4["sweeps"] == {"table4": None}  # no store here: the sweep is not in it
    assert any(line.startswith("metamathqa: task.env.data_path") for line in table4["data"])
    checked = CliRunner().invoke(app, ["paper", "--check", "--profile", "cpu"])
    assert checked.exit_code == 0, checked.output
    assert "paper --check: 0 problem(s) in 15 items" in checked.output
    assert list(tmp_path.iterdir()) == []  # nothing written
    sweeps = tmp_path.parent / f"{tmp_path.name}-copy" / "sweeps"
    shutil.copytree(paper.SWEEPS_DIR, sweeps)
    (sweeps / "length.yaml").unlink()
    monkeypatch.setattr(paper, "SWEEPS_DIR", sweeps)
    failed = CliRunner().invoke(app, ["paper", "--check", "--profile", "cpu"])
    assert failed.exit_code == 1
    assert "paper --check: Figure: response length over training (length): no sweep file sweeps/length.yaml" \
           in failed.output


def test_orch_paper_bad_profile_is_one_line_exit_2(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["paper", "--check", "--profile", "gpu-please"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "gpu-please" in lines[0] and "cpu" in lines[0], result.output
    assert list(tmp_path.iterdir()) == []


# --- the verdict rules -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("published", "kind", "measured", "n", "verdict"), [
    (12.9, "level", (11.0, 9.0, 13.0), 3, verdicts.REPRODUCED),
    (12.9, "level", (20.0, 18.0, 22.0), 3, verdicts.NOT_REPRODUCED),
    (12.9, "level", (12.0, 10.0, 12.86), 3, verdicts.REPRODUCED),  # within half the last printed digit
    (12.9, "level", (11.0, 9.0, 13.0), 2, verdicts.INCONCLUSIVE),  # too few seeds
    (16.0, "direction", (3.0, 0.5, 6.0), 3, verdicts.REPRODUCED),  # the sign is the claim, not the size
    (16.0, "direction", (-3.0, -6.0, -0.5), 3, verdicts.NOT_REPRODUCED),
    (16.0, "direction", (1.0, -1.0, 3.0), 3, verdicts.INCONCLUSIVE),
    (-0.4, "direction", (-2.0, -3.0, -1.0), 3, verdicts.REPRODUCED),
    (0.0, "direction", (0.5, -1.0, 2.0), 3, verdicts.REPRODUCED),  # "no effect" and the interval spans 0
    (0.0, "direction", (2.0, 1.0, 3.0), 3, verdicts.NOT_REPRODUCED),
])
def test_judge_follows_the_written_rules(published, kind, measured, n, verdict) -> None:
    assert verdicts.judge(published, kind, measured, n)[0] == verdict


def test_judge_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="kind must be 'level' or 'direction'"):
        verdicts.judge(1.0, "trend", (1.0, 0.0, 2.0), 3)


# --- the report, side by side ------------------------------------------------------------------------------------

def test_table4_rows_follow_the_paper_naming() -> None:
    def row(algorithm, path=None, name="hf", observation="text"):
        return table4_row({"config.algorithm.name": algorithm, "config.model.path": path,
                           "config.model.name": name, "config.task.env.observation": observation})

    assert row("ppo", "models/Qwen2.5-3B") == "PPO Qwen2.5-3B" and row("dapo", "models/Qwen2.5-3B") == "DAPO"
    assert row("ppo", None, "tiny") == "PPO Qwen2.5-3B"  # a rehearsal's code-built model stands for the base
    assert row("ppo", "models/Llama-3.2-3B-Instruct") == "Llama3.2-3B"
    assert row("ppo", "models/Qwen2.5-VL-3B-Instruct", observation="image") == "Qwen2.5-VL-3B, image input"
    assert row("grpo", "models/Qwen2.5-7B") is None and row("ppo", "models/Qwen2.5-14B") is None


def test_the_report_shows_published_beside_measured_with_a_verdict(demo_data) -> None:
    """The synthetic demo sweep (tests/analysis/conftest.py: sokoban and frozenlake x ppo and grpo x filter off/on x
    2 seeds, a code-built model): Table 4's PPO and GRPO rows are measured, published beside them."""
    from analysis.sections import Section
    from analysis.summary import summarize

    summary = summarize(demo_data)
    sections = paper_sections(demo_data, summary, [paper.BY_KEY["table4"], paper.BY_KEY["length"],
                                                   paper.BY_KEY["gradient"], paper.BY_KEY["early_warning"]],
                              n_boot=100)
    assert all(isinstance(section, Section) for section in sections)
    table4, length, gradient, early = sections
    text = " ".join(block for block in table4.blocks if isinstance(block, str))
    assert "REHEARSAL" in text and "Claim: SNR-Aware Filtering raises" in text
    from analysis.paper_report import build_context

    frame = comparison(build_context(demo_data, summary, 100), paper.BY_KEY["table4"]).set_index(["where", "quantity"])
    base = frame.loc[("Table 4, PPO Qwen2.5-3B, Sokoban", "baseline peak validation success %")]
    assert base["published"] == "12.9" and math.isclose(base["measured"], 21.0)  # peaks 20% and 22%
    assert base["runs"] == 2 and base["verdict"] == verdicts.INCONCLUSIVE  # two seeds: no interval is trusted
    delta = frame.loc[("Table 4, GRPO, FrozenLake", "filter delta of peak validation success, points")]
    assert math.isclose(delta["measured"], -3.0, abs_tol=1e-9)
    assert len(frame) == 8  # 2 rows x 2 tasks x (base, delta)
    assert any(not isinstance(block, str) for block in table4.blocks)  # the figure on shared axes
    length_text = " ".join(block for block in length.blocks if isinstance(block, str))
    assert "measured" in length_text or "published values measured" in length_text
    gradient_text = " ".join(block for block in gradient.blocks if isinstance(block, str))
    assert "No finished cell of sweeps/gradient.yaml measures this item yet." in gradient_text
    assert not any(not isinstance(block, str) for block in gradient.blocks)  # never an empty chart
    assert any("prints no number" in block for block in early.blocks if isinstance(block, str))


def test_orch_report_paper_bad_input_is_one_line_exit_2(demo_store, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    neither = CliRunner().invoke(app, ["report", "--out", str(tmp_path / "r.html")])
    both = CliRunner().invoke(app, ["report", "demo", "--paper", "--out", str(tmp_path / "r.html")])
    for result in (neither, both):
        assert result.exit_code == 2 and "give a sweep name or --paper" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    # the demo store holds no paper sweep: nothing to report, said in one line, nothing written
    empty = CliRunner().invoke(app, ["report", "--paper", "--tracking-uri", demo_store.uri,
                                     "--out", str(tmp_path / "r.html")])
    assert empty.exit_code == 2 and "no paper sweep has runs" in empty.output, empty.output
    assert list(tmp_path.iterdir()) == []


def test_orch_report_paper_puts_every_item_in_one_report(demo_store, monkeypatch, tmp_path) -> None:
    """`orch report --paper`: every item from the runs of its sweeps; items whose sweeps never ran say so in one
    line. Here the demo sweep stands in for table4 (the items that read table4's runs are measured)."""
    from analysis.report import build_paper_report

    monkeypatch.setattr(paper, "ITEMS", tuple(
        paper.Item(item.key, item.ref, item.title, item.claim,
                   tuple("demo" if sweep == "table4" else sweep for sweep in item.sweeps), item.metrics,
                   item.section, item.settings, item.published) for item in paper.ITEMS))
    built = build_paper_report(demo_store.uri, n_boot=50, rollouts=False)
    assert [section.title.split(":")[0] for section in built.sections] == \
        [f"The paper, {item.ref.split(':')[0]}" for item in paper.ITEMS]
    texts = {section.title: " ".join(b for b in section.blocks if isinstance(b, str)) for section in built.sections}
    table4 = next(text for title, text in texts.items() if "Table 4" in title)
    assert "published values measured" in table4 and "REHEARSAL" in table4
    table5 = next(text for title, text in texts.items() if "Table 5" in title)
    assert "No cell of sweeps/table5.yaml has run yet." in table5
