"""The paper map (analysis/paper.py): every result table and figure of RAGEN-2 (arXiv 2604.06268) is in it, every
item has a sweep that logs what it needs and a report section, `orch paper` and `orch paper --check` say so, and
the report puts the published value beside the measured one with a verdict (analysis/reports/paper_report.py,
analysis/stats/verdicts.py)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analysis import paper
from analysis.cli import paper_problems
from analysis.reports.paper_report import SECTIONS, comparison, paper_sections, table4_row
from analysis.stats import verdicts
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
    from analysis.stats.predictor import PAPER_REFERENCES

    assert "1.29" in PAPER_REFERENCES and "1.16" in PAPER_REFERENCES and "0.33" in PAPER_REFERENCES
    table4 = paper.BY_KEY["table4"].published
    assert len(table4) == 2 * sum(b is not None for base, _, _, _ in paper.TABLE4.values() for b in base)
    assert all(value.kind == (verdicts.NO_EFFECT if value.value == 0 else verdicts.LEVEL if "two reports" in
                              value.quantity else verdicts.EFFECT)
               for value in table4 if value.at["stat"] == "delta")  # a gain with its size; "+0.0" no effect
    # a claim the paper only draws carries its sign, never a made-up magnitude
    for item in paper.ITEMS:
        for value in item.published:
            if value.figure_only and value.kind == verdicts.DIRECTION:
                assert value.value in (-1, 0, 1), (item.key, value)
    # no published number of the paper as a literal anywhere else in analysis/ (prose may cite them)
    import ast

    distinctive = {12.9, 67.6, 1.29, 1.16, 0.33, 89.8, 21.1, 0.39, 0.63, 23.6}
    for path in Path(paper.__file__).parent.rglob("*.py"):  # every room
        if path.name != "paper.py":
            literals = {node.value for node in ast.walk(ast.parse(path.read_text()))
                        if isinstance(node, ast.Constant) and isinstance(node.value, float)}
            assert not literals & distinctive, (path.name, literals & distinctive)


def test_every_paper_sweep_turns_the_diagnostics_on_for_every_cell() -> None:
    assert paper_problems(set(SECTIONS)) == []


def test_check_names_a_sweep_without_diagnostics_a_missing_sweep_and_a_missing_section(tmp_path, monkeypatch) -> None:
    sweeps = tmp_path / "sweeps"
    shutil.copytree(paper.SWEEPS_DIR, sweeps)
    topp = sweeps / "topp.yaml"
    topp.write_text(topp.read_text().replace("  hooks: [collapse]\n", ""))
    (sweeps / "gradient.yaml").unlink()
    monkeypatch.setattr(paper, "SWEEPS_DIR", sweeps)
    problems = paper_problems(set(SECTIONS) - {"slip"}, profile="cpu")
    # every paper sweep logs the MI diagnostics, as every RAGEN run does, whatever its own items need
    assert "sweeps/topp.yaml (topp): 8 of 8 cells of sweeps/topp.yaml do not log collapse/trajectory/mi_zscore_ema " \
           "(set hooks: [collapse] with diagnostics.mi_every > 0)" in problems, problems
    assert any("(gradient): no sweep file sweeps/gradient.yaml" in line for line in problems), problems
    assert any("(slip): no report section 'slip'" in line for line in problems), problems
    # a sweep an MI item needs, without the hook: every one of its cells is named
    table6 = sweeps / "table6.yaml"
    table6.write_text(table6.read_text().replace("  hooks: [collapse]", "  hooks: []"))
    problems = paper_problems(set(SECTIONS), profile="cpu")
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

@pytest.mark.parametrize(("published", "kind", "measured", "n", "margin", "verdict"), [
    (12.9, "level", (12.9, 12.86, 12.94), 3, 0.05, verdicts.REPRODUCED),  # the interval within the band
    (12.9, "level", (11.0, 9.0, 13.0), 3, 0.05, verdicts.INCONCLUSIVE),  # a wide interval, whatever it contains
    (12.9, "level", (20.0, 18.0, 22.0), 3, 0.05, verdicts.NOT_REPRODUCED),
    (12.9, "level", (12.0, 10.0, 12.86), 3, 0.05, verdicts.INCONCLUSIVE),  # reaches the band, not within it
    (12.9, "level", (12.9, 12.86, 12.94), 2, 0.05, verdicts.INCONCLUSIVE),  # too few seeds
    (16.0, "effect", (14.0, 10.0, 18.0), 3, 0.05, verdicts.REPRODUCED),  # overlaps the band and excludes 0
    (16.0, "effect", (3.0, 0.5, 6.0), 3, 0.05, verdicts.NOT_REPRODUCED),  # right sign, wrong size
    (16.0, "effect", (6.0, -1.0, 17.0), 3, 0.05, verdicts.INCONCLUSIVE),  # overlaps the band but spans 0
    (-41.4, "effect", (-1.0, -2.0, -0.5), 3, 7.65, verdicts.NOT_REPRODUCED),  # a -1 % cut is not -41 %
    (0.0, "no effect", (0.5, -1.0, 2.0), 3, 1.0, verdicts.INCONCLUSIVE),  # spans 0, reaches past the margin
    (0.0, "no effect", (0.1, -0.5, 0.6), 3, 1.0, verdicts.REPRODUCED),
    (0.0, "no effect", (2.0, 1.5, 3.0), 3, 1.0, verdicts.NOT_REPRODUCED),
    (16.0, "direction", (3.0, 0.5, 6.0), 3, 0.0, verdicts.REPRODUCED),  # a figure's sign: the sign is the claim
    (16.0, "direction", (-3.0, -6.0, -0.5), 3, 0.0, verdicts.NOT_REPRODUCED),
    (16.0, "direction", (1.0, -1.0, 3.0), 3, 0.0, verdicts.INCONCLUSIVE),
    (0.15, "correlation", (-0.021, -0.167, 0.122), 20, 0.005, verdicts.NOT_REPRODUCED),  # issue 56's Pearson r
    (0.39, "correlation", (-0.02, -0.59, 0.55), 10, 0.005, verdicts.INCONCLUSIVE),  # a wide interval
    (12.9, "level", (math.nan, math.nan, math.nan), 3, 0.05, verdicts.NOT_MEASURED),  # NaN is never a verdict
])
def test_judge_follows_the_written_rules(published, kind, measured, n, margin, verdict) -> None:
    assert verdicts.judge(published, kind, measured, n, margin=margin).verdict == verdict


def test_judge_refuses_an_unknown_kind_and_an_effect_inside_its_margin() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        verdicts.judge(1.0, "trend", (1.0, 0.0, 2.0), 3)
    with pytest.raises(ValueError, match="claim of no effect"):
        verdicts.judge(0.0, "effect", (1.0, 0.0, 2.0), 3, margin=0.05)


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
    from analysis.reports.sections import Section
    from analysis.stats.summary import summarize

    summary = summarize(demo_data)
    sections = paper_sections(demo_data, summary, [paper.BY_KEY["table4"], paper.BY_KEY["length"],
                                                   paper.BY_KEY["gradient"], paper.BY_KEY["early_warning"]],
                              n_boot=100)
    assert all(isinstance(section, Section) for section in sections)
    table4, length, gradient, early = sections
    text = " ".join(block for block in table4.blocks if isinstance(block, str))
    assert "REHEARSAL" in text and "Claim: SNR-Aware Filtering raises" in text
    from analysis.reports.paper_report import build_context

    frame = comparison(build_context(demo_data, summary, 100), paper.BY_KEY["table4"]).set_index(["where", "quantity"])
    base = frame.loc[("Table 4, PPO Qwen2.5-3B, Sokoban", "baseline peak validation success %")]
    assert base["published"] == "12.9" and math.isclose(base["measured"], 21.0)  # peaks 20% and 22%
    assert base["runs"] == 2 and base["verdict"] == verdicts.INCONCLUSIVE  # two seeds: no interval is trusted
    delta = frame.loc[("Table 4, GRPO, FrozenLake", "filter delta of peak validation success, points (the paper's "
                       "two reports, -3 and +2.3)")]  # judged as the band between the two
    assert math.isclose(delta["measured"], -3.0, abs_tol=1e-9)
    assert len(frame) == 8  # 2 rows x 2 tasks x (base, delta)
    assert any(not isinstance(block, str) for block in table4.blocks)  # the figure on shared axes
    length_text = " ".join(block for block in length.blocks if isinstance(block, str))
    assert "measured" in length_text or "published values measured" in length_text
    gradient_text = " ".join(block for block in gradient.blocks if isinstance(block, str))
    assert "No finished cell of sweeps/gradient.yaml measures this item yet." in gradient_text
    assert not any(not isinstance(block, str) for block in gradient.blocks)  # never an empty chart
    # the early warning, measured by analysis.stats.early_warning's onsets: every baseline run's MI falls first (step 25)
    # and its success later (step 50); the filtered runs, whose MI never falls, are not its runs
    early_frame = comparison(build_context(demo_data, summary, 100), paper.BY_KEY["early_warning"])  # order, lead
    assert list(early_frame["runs"]) == [8, 8] and list(early_frame["measured"]) == [1.0, 25.0]
    assert set(early_frame["verdict"]) == {verdicts.REPRODUCED}
    early_text = " ".join(block for block in early.blocks if isinstance(block, str))
    assert "2 reproduced of 2 published values measured" in early_text and "MI first 8." in early_text


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
    from analysis.reports.report import build_paper_report

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


# --- measurements on constructed runs with known answers -----------------------------------------------------------

def _constructed(cells: list[tuple[dict[str, str], dict[str, list[float]]]]):
    """RunData and its summary for finished cells given as (params, metric -> values at steps 1, 2, ...)."""
    import pandas as pd

    from analysis.stats.summary import summarize
    from analysis.stores.mlflow_store import RunData

    runs, rows = [], []
    for index, (params, series) in enumerate(cells):
        run = f"r{index}"
        runs.append({"run_id": run, "run_name": run, "status": "FINISHED", "experiment": "constructed",
                     "tags.cell": f"c{index}", "params.backend": "torch", "params.task.name": "sokoban",
                     "params.algorithm.name": "ppo", "params.model.name": "tiny", "params.model.path": "None",
                     "params.seed": str(index), **{f"params.{key}": value for key, value in params.items()}})
        for key, values in series.items():
            rows += [(run, key, step, value) for step, value in enumerate(values, start=1)]
    metrics = pd.DataFrame(rows, columns=["run_id", "key", "step", "value"]).assign(timestamp=0)
    data = RunData(runs=pd.DataFrame(runs), metrics=metrics, tracking_uri="none", reader="archive")
    return data, summarize(data)


def test_entropy_and_kl_are_two_dose_response_curves_each_against_its_own_coefficient() -> None:
    """The entropy sweep's cells carry kl_coef 0.001 with the KL loss off, the KL sweep's an entropy coefficient of 0:
    final entropy rises along the entropy curve and falls along the KL curve. Each curve, over the runs whose other
    regulariser is off (the run with both off is the origin of both), is exactly monotone (rho +1 and -1 over 5
    runs); the raw coefficients of the pooled runs mix the two."""
    from analysis.paper import Value
    from analysis.reports.paper_report import SECTIONS, build_context, dose_curve
    from analysis.stats.correlations import correlate

    names = paper.names
    cells = [({"algorithm.entropy_coeff": str(coef), "algorithm.use_kl": "False", "algorithm.kl_coef": "0.001"},
              {names.ENTROPY: [1.0 + 10 * coef] * 3}) for coef in (0.0, 0.001, 0.01, 0.1)]
    cells += [({"algorithm.entropy_coeff": "0.0", "algorithm.use_kl": str(coef > 0), "algorithm.kl_coef": str(coef)},
               {names.ENTROPY: [1.0 - 5 * coef] * 3}) for coef in (0.0, 0.001, 0.01, 0.1)]
    data, summary = _constructed(cells)
    ctx = build_context(data, summary, n_boot=50)
    assert sorted(dose_curve(ctx.runs, "algorithm.kl_coef")) == [0.0, 0.0, 0.001, 0.01, 0.1]
    measure = SECTIONS["entropy_kl"]
    for coefficient, rho in (("algorithm.entropy_coeff", 1.0), ("algorithm.kl_coef", -1.0)):
        value = Value("constructed", "rho", 0.0, {"coefficient": coefficient, "metric": names.ENTROPY})
        measured = measure(ctx, value)
        assert (measured.value, measured.n) == (pytest.approx(rho), 5), coefficient
    final = ctx.runs["run_id"].map(ctx.final(names.ENTROPY))
    for coefficient in ("algorithm.entropy_coeff", "algorithm.kl_coef"):  # what pooling the raw columns gave
        pooled = correlate(ctx.runs[f"config.{coefficient}"].astype(float), final, n_boot=10)["spearman"]
        assert abs(pooled) < 0.9, (coefficient, pooled)
    sections = paper_sections(data, summary, [paper.BY_KEY["entropy_kl"]], n_boot=50)
    captions = " ".join(block for block in sections[0].blocks if isinstance(block, str))
    assert "The two dose-response curves" in captions and "KL loss" in captions


def test_table5_is_judged_as_the_relative_step_time_and_memory_change_of_the_filter() -> None:
    """Two splits of the budget, 3 seeds per arm: at 8 samples the filter cuts the step from 100 s to 60 s (-40%) and
    memory stays at 20 GB (0%); at 2 samples it lengthens the step (-> 120 s, +20%) and raises memory by 50%. The
    seconds are not the paper's hardware's, so they are never compared with its numbers."""
    from analysis.paper import Value
    from analysis.reports.paper_report import build_context, comparison

    names = paper.names
    cells = []
    for samples, time_on, memory_on in ((8, 60.0, 20.0), (2, 120.0, 30.0)):
        for filtered, time, memory in ((False, 100.0, 20.0), (True, time_on, memory_on)):
            for seed in range(3):
                params = {"trainer.prompts_per_step": str(64 // samples), "trainer.samples_per_prompt": str(samples),
                          "filter.strategy": "top_p" if filtered else "none", "filter.value": "0.9" if filtered
                          else "1.0"}
                cells.append((params, {names.STEP_TIME: [time + seed - 1, time - seed + 1],
                                       names.PEAK_MEMORY: [memory - 1, memory], names.VAL_SUCCESS: [0.2, 0.3]}))
    data, summary = _constructed(cells)
    at = {"task": "sokoban", "prompts": 8, "samples": 8}
    values = (Value("T5, 8x8", "time", -40.0, {**at, "stat": "time_change"}, verdicts.EFFECT, margin=7.65, why="w"),
              Value("T5, 8x8", "memory", 0.0, {**at, "stat": "memory_change"}, verdicts.NO_EFFECT, margin=10.0,
                    why="w"),
              Value("T5, 32x2", "time", -40.0, {**at, "samples": 2, "stat": "time_change"}, verdicts.EFFECT,
                    margin=7.65, why="w"),
              Value("T5, 32x2", "memory", 0.0, {**at, "samples": 2, "stat": "memory_change"}, verdicts.NO_EFFECT,
                    margin=10.0, why="w"))
    item = paper.Item("t5", "Table 5", "constructed", "constructed", ("table5",), (), "table5", "", values)
    frame = comparison(build_context(data, summary, 200), item)
    assert list(frame["measured"]) == [pytest.approx(-40.0), pytest.approx(0.0), pytest.approx(20.0),
                                       pytest.approx(50.0)]
    assert list(frame["runs"]) == [3, 3, 3, 3]
    assert list(frame["verdict"]) == [verdicts.REPRODUCED, verdicts.REPRODUCED, verdicts.NOT_REPRODUCED,
                                      verdicts.NOT_REPRODUCED]
    # the map's own Table 5: success levels, and per filtered split the time change (a direction, the paper's
    # relative cut) and the memory change (0 within the tolerance); no step time in seconds is judged
    stats = [value.at["stat"] for value in paper.BY_KEY["table5"].published]
    assert "step_time" not in stats and stats.count("time_change") == stats.count("memory_change") == 3
    cuts = {value.at["samples"]: value.value for value in paper.BY_KEY["table5"].published
            if value.at["stat"] == "time_change"}
    assert cuts == {2: -29.3, 4: -41.4, 16: -26.1}  # 91.8 -> 64.9 s, 89.8 -> 52.6 s, 89.2 -> 65.9 s


@pytest.mark.parametrize(("base", "treated", "change"), [
    ([100.0, 100.0, 100.0], [60.0, 60.0, 60.0], (-40.0, -40.0, -40.0)),
    ([90.0, 100.0, 110.0], [60.0, 60.0, 60.0], None),  # the base's spread widens the interval around -40
    ([0.0, 0.0], [1.0], (math.nan,) * 3),  # no positive base
])
def test_change_interval_is_percent_of_the_base(base, treated, change) -> None:
    measured = verdicts.change_interval(base, treated, n_boot=500)
    if change is None:
        assert measured[0] == pytest.approx(-40.0) and measured[1] < -40.0 < measured[2]
    else:
        assert measured == pytest.approx(change, nan_ok=True)


def test_check_names_an_item_without_a_published_value(monkeypatch) -> None:
    bare = paper.BY_KEY["slip"]
    monkeypatch.setattr(paper, "ITEMS", (paper.Item(bare.key, bare.ref, bare.title, bare.claim, bare.sweeps,
                                                    bare.metrics, bare.section, bare.settings),))
    assert paper_problems(set(SECTIONS)) == [
        "Figure: FrozenLake slip rate (slip): no published value (a printed number, or the claim's sign)"]


def test_the_early_warning_is_measured_by_the_decline_rule_on_runs_without_the_filter() -> None:
    """analysis.stats.early_warning's onsets (recipes.stats.collapse_alert.decline_onset under the legacy rule: 30% below the running peak twice in a row) on constructed runs: MI falls at
    step 3 and success at step 5 (lead 2, MI first); success falls alone (-1); nothing falls (0); a filtered run
    whose MI falls alone is not one of the item's runs. The order is scored on the one run where both fell (MI
    first: 1 of 1), "success only" and "no decline" counted apart; the lead is 2 over 1 run."""
    from analysis.reports.paper_report import build_context, comparison

    names = paper.names
    flat_mi, flat_success = [2.0] * 6, [0.5] * 6
    off, on = {"filter.strategy": "none", "filter.value": "1.0"}, {"filter.strategy": "top_p", "filter.value": "0.9"}
    cells = [(off, {names.MI_ZSCORE_EMA: [2.0, 2.0, 1.0, 1.0, 1.0, 1.0],
                    names.VAL_SUCCESS: [0.5, 0.5, 0.5, 0.5, 0.2, 0.2]}),
             (off, {names.MI_ZSCORE_EMA: flat_mi, names.VAL_SUCCESS: [0.5, 0.5, 0.2, 0.2, 0.2, 0.2]}),
             (off, {names.MI_ZSCORE_EMA: flat_mi, names.VAL_SUCCESS: flat_success}),
             (on, {names.MI_ZSCORE_EMA: [2.0, 1.0, 1.0, 1.0, 1.0, 1.0], names.VAL_SUCCESS: flat_success})]
    data, summary = _constructed(cells)
    frame = comparison(build_context(data, summary, 200), paper.BY_KEY["early_warning"])
    assert list(frame["measured"]) == [1.0, 2.0] and list(frame["runs"]) == [1, 1]
    assert list(frame["verdict"]) == [verdicts.INCONCLUSIVE, verdicts.INCONCLUSIVE]  # one run
    assert "success only 1" in frame["reason"][0] and "no decline 1" in frame["reason"][0]


def test_length_change_reads_a_short_runs_halves() -> None:
    """The first and the last 3 logged lengths of a long run; a run of fewer than 6 steps compares its two halves
    (a 2-step rehearsal: step 1 against step 2), never overlapping ends."""
    from analysis.reports.paper_report import build_context, comparison

    names = paper.names
    cells = [({}, {names.RESPONSE_LENGTH: [100.0, 100.0, 100.0, 70.0, 50.0, 50.0, 50.0]}),  # -50%
             ({}, {names.RESPONSE_LENGTH: [100.0, 80.0]}),  # -20%
             ({}, {names.RESPONSE_LENGTH: [100.0]})]  # one step: no change to read
    data, summary = _constructed(cells)
    frame = comparison(build_context(data, summary, 100), paper.BY_KEY["length"])
    [sokoban] = frame[frame["where"].str.contains("response length")].itertuples()
    assert (sokoban.measured, sokoban.runs) == (pytest.approx(-35.0), 2)


def test_the_predictor_reads_a_code_built_model_as_the_3b_and_says_when_no_ratio_exists() -> None:
    """A rehearsal's code-built text model stands for Qwen2.5-3B (as in Table 4's rows), so its baseline run's ratio
    is the Sokoban 3B PPO point, never the 14B one; a batch in which every group scored alike has no ratio, and the
    section says so instead of 'no finished cell'."""
    import pandas as pd

    from analysis.reports.paper_report import build_context, comparison

    names = paper.names
    off = {"filter.strategy": "none", "filter.value": "1.0"}
    data, summary = _constructed([(off, {names.VAL_SUCCESS: [0.1, 0.2]}), (off, {names.VAL_SUCCESS: [0.1, 0.2]})])
    runs = list(summary["run_id"])
    predictions = pd.DataFrame({"run_id": runs, "step": [1, 1], "ratio": [1.2, 0.8], "verdict": ["", ""],
                                "num_prompts": [8, 8], "zero_variance_share": [0.5, 0.25]})
    frame = comparison(build_context(data, summary, 100, predictions), paper.BY_KEY["predictor"])
    assert list(frame["quantity"]) == ["std(RV)/mean(RV), sokoban Qwen2.5-3B PPO"]  # not the 14B point
    assert (frame["measured"].item(), frame["runs"].item()) == (pytest.approx(1.0), 2)
    flat = predictions.assign(ratio=math.nan, zero_variance_share=1.0)
    [section] = paper_sections(data, summary, [paper.BY_KEY["predictor"]], n_boot=50, predictions=flat)
    text = " ".join(block for block in section.blocks if isinstance(block, str))
    assert "Not measurable on these runs: the first rollout batch of each of the 2 run(s)" in text
    assert "zero reward variance in every group" in text and "No finished cell" not in text
