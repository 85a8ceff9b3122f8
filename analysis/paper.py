"""RAGEN-2 ("Reasoning Collapse in Agentic RL", arXiv 2604.06268), item by item: the paper map.

Every result table and figure of the paper is one :class:`Item`: the sweep file(s) that produce it, the metrics each
of their cells must log, the report section that shows it, the settings rule its sweeps follow (RAGEN's script, or
the main-table script plus the one change the paper describes), the data its tasks need, and the published values
(with where they are printed and what they mean). **The paper's published numbers live here and nowhere else**:
the predictor's reference points, the tests and the report read them from this module.

Tables are numbered as in the paper (its Tables 1-3 describe the method and setup and report no result). The
paper's figures are named by what they show (``Figure: ...``): no source available to this project gives their
numbers; `docs/paper.md` says so.

`orch paper` prints the map with each item's cells and their states in the store; `orch paper --check` lists every
item that has no sweep file, needs a metric no cell of its sweeps logs, has no published value or no report section.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis import names
from envs.base import DataSource

SWEEPS_DIR = Path(__file__).resolve().parents[1] / "sweeps"
# How a published value is judged (`analysis.stats.verdicts.judge` has one path per kind).
LEVEL, EFFECT, NO_EFFECT, DIRECTION, ORDER, CORRELATION = (
    "level", "effect", "no effect", "direction", "ordering", "correlation")
KINDS = (LEVEL, EFFECT, NO_EFFECT, DIRECTION, ORDER, CORRELATION)


def printed_digits(printed: str) -> int:
    """Decimal places of a number as the paper prints it ("12.9" -> 1, "0.20" -> 2, "128" -> 0)."""
    text = printed.strip().lstrip("+-\u2212")
    return len(text.split(".", 1)[1]) if "." in text else 0


def rounding(printed: str) -> float:
    """Half the last digit the paper prints: the rounding tolerance of a printed value."""
    return 0.5 * 10.0 ** -printed_digits(printed)


# --- metrics an item may need, beyond analysis.names -----------------------------------------------------------
ROLLOUT_ARTIFACT = "artifact:rollouts"  # a rollout batch dumped as an MLflow artifact (rollouts/step_NNNN.parquet)
GRAD_BUCKET_TASK = "grad_norm/bucket_0/task"  # the gradient split by RV bucket (diagnostics.grad_every)
GRAD_BUCKET_REG = "grad_norm/bucket_0/reg"

# The paper's task names as its tables print them -> orch's task names.
TASKS = {"Sokoban": "sokoban", "FrozenLake": "frozenlake", "MetaMathQA": "metamathqa", "Countdown": "countdown",
         "SearchQA": "searchqa", "WebShop": "webshop", "DeepCoder": "deepcoder", "Sokoban 8x8": "sokoban_8x8"}
TABLE4_TASKS = ("Sokoban", "FrozenLake", "MetaMathQA", "Countdown")


@dataclass(frozen=True)
class Value:
    """One published value: where it is, what it means, the cell it describes (``at``: the keys a measured value is
    matched on, e.g. variant, task, stat) and how it is judged (``kind``: one of :data:`KINDS`).
    ``value`` is the number as the paper prints it -- a string keeps its printed digits ("0.20"); a float's are
    read from its shortest form, or given as ``digits`` -- and the rounding tolerance is half its last digit.
    ``margin``: the declared margin where the paper gives a spread, or, for a claim of no effect, the smallest
    effect of interest; ``why``: where it comes from (printed beside every verdict). ``pooled``: for a correlation,
    where the paper says it pooled tasks ("" -- judged per task). ``figure_only``: the paper shows it in a figure
    without printing a number; ``value`` is then the claim's sign (+1 higher, -1 lower), never a made-up
    magnitude."""

    where: str
    quantity: str
    value: float
    at: dict[str, Any] = field(default_factory=dict)
    kind: str = LEVEL
    figure_only: bool = False
    margin: float | None = None
    why: str = ""
    digits: int | None = None
    pooled: str = ""
    printed: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        printed = (self.value if isinstance(self.value, str) else f"{self.value:.{self.digits}f}"
                   if self.digits is not None else repr(float(self.value)))
        object.__setattr__(self, "printed", printed)
        object.__setattr__(self, "value", float(self.value))

    @property
    def band(self) -> float:
        """The margin the judge uses: the declared one, at least the rounding tolerance (none for a sign)."""
        if self.kind in (DIRECTION, ORDER):
            return 0.0
        return max(self.margin or 0.0, rounding(self.printed))

    def margin_text(self) -> str:
        """The margin and how it was chosen, as every report row prints it."""
        if self.kind == DIRECTION:
            return "none: the sign is the claim (a figure, no number)"
        if self.kind == ORDER:
            return "1/2: MI first in more runs than success first"
        half = f"half the last printed digit of {self.printed}"
        if self.margin is None or self.margin < rounding(self.printed) or not self.why:
            return f"\u00b1{self.band:g} ({half}; the paper gives no spread)"
        return f"\u00b1{self.band:g} ({self.why})"


@dataclass(frozen=True)
class Item:
    """One result table or figure of the paper."""

    key: str
    ref: str  # "Table 4" | "Figure: ..."
    title: str
    claim: str  # what the paper concludes from it, in one sentence
    sweeps: tuple[str, ...]  # sweep files under sweeps/ (without .yaml)
    metrics: tuple[str, ...]  # MLflow metrics every cell of those sweeps must log (ROLLOUT_ARTIFACT: a batch dump)
    section: str  # the report section that shows it (analysis.reports.report.PAPER_SECTIONS)
    settings: str  # the settings rule its sweeps follow
    published: tuple[Value, ...] = ()
    coverage: int = 1  # published values the paper rehearsal (one seed, 2 steps) must measure: its floor


# --- Table 4 -------------------------------------------------------------------------------------------------------
# variant -> (baseline peak success % per task, filter delta per task, published avg baseline, published avg delta);
# None where the paper prints "-" (or no average). GRPO FrozenLake has two reports (-3.0 and +2.3); the printed
# average +3.7 is the one with +2.3 ((9.0 + 2.3 + 1.2 + 2.2) / 4 = 3.7; with -3.0 it would be 2.4), kept here.
TABLE4: dict[str, tuple[tuple[float | None, ...], tuple[float | None, ...], float | None, float]] = {
    "PPO Qwen2.5-3B": ((12.9, 67.0, 92.6, 97.9), (16.0, 10.9, 0.6, 0.0), 67.6, 6.9),
    "DAPO": ((16.2, 66.8, 90.8, 95.7), (5.1, 2.1, 2.8, 1.6), 67.4, 2.9),
    "GRPO": ((12.1, 70.9, 91.2, 95.7), (9.0, 2.3, 1.2, 2.2), 67.5, 3.7),
    "Dr.GRPO": ((12.1, 23.2, 91.2, 96.5), (-0.4, 0.6, 1.4, 1.4), 55.8, 0.8),
    "Qwen2.5-0.5B": ((3.3, 19.5, 10.0, 23.0), (22.9, 0.0, -0.2, -0.7), 14.0, 5.5),
    "Qwen2.5-1.5B": ((17.0, 36.5, 80.3, 56.6), (6.2, 1.6, 7.0, 1.6), None, 4.1),
    "Qwen2.5-7B": ((42.4, 85.0, 84.0, 97.7), (4.9, -0.6, 11.7, 0.3), 77.3, 4.1),
    "Qwen2.5-3B-Instruct": ((22.5, 83.6, 91.2, 96.3), (14.2, 2.3, 0.4, -0.6), None, 4.1),
    "Llama3.2-3B": ((24.4, 84.6, 86.1, 99.2), (18.8, -0.2, 3.7, -1.2), 73.6, 5.3),
    "Qwen2.5-VL-3B, text input": ((53.0, 16.0, None, None), (6.0, 53.5, None, None), None, 29.8),
    "Qwen2.5-VL-3B, image input": ((65.0, 19.5, None, None), (12.0, 59.5, None, None), 42.3, 35.8),
}


# A claim of no effect on success needs a smallest effect of interest; the paper declares none. orch's: 1 point of
# peak validation success (the gains the paper reads as gains start at a few tenths of a point on one run each).
SUCCESS_SESOI = 1.0
SUCCESS_SESOI_WHY = "orch's smallest effect of interest on success, 1 point; the paper declares none"
# Where the paper gives two reports of one value: both (the band between them is the claim, judged as a level).
TABLE4_SPREAD = {("GRPO", "FrozenLake"): (-3.0, 2.3)}


def _table4_values() -> tuple[Value, ...]:
    out = []
    for variant, (base, delta, _, _) in TABLE4.items():
        for task, b, d in zip(TABLE4_TASKS, base, delta, strict=True):
            if b is None:
                continue
            at = {"variant": variant, "task": TASKS[task]}
            out.append(Value(f"Table 4, {variant}, {task}", "baseline peak validation success %", b,
                             {**at, "stat": "base"}))
            if d == 0.0:  # "+0.0": a claim of no effect, with orch's smallest effect of interest
                out.append(Value(f"Table 4, {variant}, {task}", "filter delta of peak validation success, points", d,
                                 {**at, "stat": "delta"}, NO_EFFECT, margin=SUCCESS_SESOI, why=SUCCESS_SESOI_WHY))
                continue
            if (variant, task) in TABLE4_SPREAD:  # two reports of opposite sign: the delta lies between them
                low, high = TABLE4_SPREAD[variant, task]
                out.append(Value(f"Table 4, {variant}, {task}", "filter delta of peak validation success, points "
                                 f"(the paper's two reports, {low:+g} and {high:+g})", f"{(low + high) / 2:.2f}",
                                 {**at, "stat": "delta"}, LEVEL, margin=(high - low) / 2,
                                 why=f"the paper's two reports, {low:+g} and {high:+g}: between them"))
                continue
            out.append(Value(f"Table 4, {variant}, {task}", "filter delta of peak validation success, points", d,
                             {**at, "stat": "delta"}, EFFECT))
    return tuple(out)


# --- Table 5: budget (prompts x samples) -> success no filter, filter; step time (s) no filter, filter ------------
TABLE5: dict[tuple[int, int], tuple[float, float | None, float, float | None]] = {
    (128, 1): (23.6, None, 89.8, None),
    (64, 2): (18.8, 27.3, 91.8, 64.9),
    (32, 4): (24.2, 27.4, 89.8, 52.6),
    (8, 16): (15.6, 23.6, 89.2, 65.9),
}


# The step times are the paper's hardware's; its claim is the relative cut the filter brings at one split (26-41%),
# judged as a direction (the sign; the size shown), with the seconds quoted in the quantity. Memory: "about
# unchanged", a printed claim without a number -- judged as a level of 0 within TABLE5_MEMORY_TOLERANCE percent
# (orch's reading of "about"), on the peak memory both backends log (names.PEAK_MEMORY).
TABLE5_MEMORY_TOLERANCE = 10.0
# The step-time cut is judged as an effect with a size: the paper's three cuts (-29.3, -41.4, -26.1 %) spread over
# 15.3 points; half of that is the margin of each (a -1 % cut does not reproduce -41 %).
TABLE5_TIME_MARGIN = 7.65
TABLE5_TIME_WHY = "half the spread of the paper's three cuts, -26.1 to -41.4 %"


def table5_time_change(prompts: int, samples: int) -> float:
    """The published step-time change the filter brings at one split, % of the unfiltered step."""
    _, _, t0, t1 = TABLE5[prompts, samples]
    return round(100.0 * (t1 / t0 - 1.0), 1)


def _table5_values() -> tuple[Value, ...]:
    out = []
    for (prompts, samples), (s0, s1, t0, t1) in TABLE5.items():
        at = {"task": "sokoban", "prompts": prompts, "samples": samples}
        where = f"Table 5, {prompts}x{samples}"
        out.append(Value(where, "success % without the filter", s0, {**at, "filtered": False, "stat": "success"}))
        if s1 is not None:
            out.append(Value(where, "success % with the filter", s1, {**at, "filtered": True, "stat": "success"}))
            out.append(Value(where, f"step-time change with the filter, % of the unfiltered step (the paper's "
                                    f"{t0:g} s -> {t1:g} s)", table5_time_change(prompts, samples),
                             {**at, "stat": "time_change"}, EFFECT, margin=TABLE5_TIME_MARGIN,
                             why=TABLE5_TIME_WHY))
            out.append(Value(where, f"peak-memory change with the filter, % (about unchanged: 0 within "
                                    f"{TABLE5_MEMORY_TOLERANCE:g})", 0.0, {**at, "stat": "memory_change"},
                             NO_EFFECT, figure_only=True, margin=TABLE5_MEMORY_TOLERANCE,
                             why="'about unchanged' read as 0 within 10 %: orch's reading of the paper's words"))
    return tuple(out)


# --- Table 6: RV quartile -> (RV range low, high, success %, MI, entropy) ----------------------------------------
TABLE6: dict[int, tuple[float, float, float, float, float]] = {
    1: (4.4, 5.6, 21.1, 0.95, 2.02),
    2: (1.5, 4.2, 19.5, 0.93, 1.53),
    3: (0.0, 0.2, 10.7, 0.81, 1.41),
    4: (0.0, 0.1, 11.0, 0.73, 1.87),
}


def _table6_values() -> tuple[Value, ...]:
    out = []
    for quartile, (_, _, success, mi, entropy) in TABLE6.items():
        at = {"task": "sokoban", "quartile": quartile}
        out.append(Value(f"Table 6, Q{quartile}", "success %", success, {**at, "stat": "success"}))
        out.append(Value(f"Table 6, Q{quartile}", "MI (end of training)", mi, {**at, "stat": "mi"}))
        out.append(Value(f"Table 6, Q{quartile}", "entropy (end of training)", entropy, {**at, "stat": "entropy"}))
    return tuple(out)


# --- Table 7: level -> (prompts kept of 8, trajectories per update, success %, MI) ---------------------------------
TABLE7: dict[str, tuple[float, float, float, float]] = {
    "none": (8.0, 128.0, 12.9, 0.83),
    "prompt": (3.2, 50.6, 23.6, 1.80),
    "trajectory": (8.0, 64.0, 16.8, 0.20),
}


def _table7_values() -> tuple[Value, ...]:
    out = []
    for level, (prompts, trajectories, success, mi) in TABLE7.items():
        at = {"task": "sokoban", "level": level}
        whole = float(prompts).is_integer()  # "8/8" and "128" are printed without decimals, "3.2" and "50.6" with one
        out.append(Value(f"Table 7, {level}", "prompts kept per update (of 8)", prompts, {**at, "stat": "prompts"},
                         digits=0 if whole else 1))
        out.append(Value(f"Table 7, {level}", "trajectories per update", trajectories, {**at, "stat": "trajectories"},
                         digits=0 if whole else 1))
        out.append(Value(f"Table 7, {level}", "success %", success, {**at, "stat": "success"}))
        out.append(Value(f"Table 7, {level}", "MI (end of training)", mi, {**at, "stat": "mi"}, digits=2))
    return tuple(out)


# --- correlations, RV proxies, the predictor's reference points ----------------------------------------------------
# Correlations are judged per task: the paper does not say it pooled tasks (a Value's ``pooled`` would cite where
# it did), and pooling mixes the tasks' difficulty (docs/science.md).
CORRELATIONS = (
    Value("Figure: diagnostics vs success", "Spearman rho of trajectory MI-ZScore with task performance", "0.39",
          {"metric": names.collapse_metric("trajectory", "mi_zscore"), "coefficient": "spearman"}, CORRELATION),
    Value("Figure: diagnostics vs success", "Spearman rho of the entropy family with task performance (low end)",
          "-0.14", {"metric": names.ENTROPY, "coefficient": "spearman", "bound": "low"}, CORRELATION),
    Value("Figure: diagnostics vs success", "Spearman rho of the entropy family with task performance (high end)",
          "-0.11", {"metric": names.ENTROPY, "coefficient": "spearman", "bound": "high"}, CORRELATION),
)
# proxy metric -> (Spearman, Pearson) with within-prompt reward variance
RV_PROXIES: dict[str, tuple[float, float]] = {
    names.REWARD_MEAN: (0.63, 0.65),
    names.RETRIEVAL_ACC: (0.13, 0.15),
    names.RESPONSE_LENGTH: (0.12, 0.08),
    names.MI_EST: (-0.10, -0.17),
    names.CONDITIONAL_ENTROPY: (-0.14, -0.18),
}
# The Std(RV)/Mean(RV) predictor's reference points: (task, model, algorithm, ratio, filter gain in points or None
# where the paper says only that filtering helped).
PREDICTOR_POINTS = (
    ("sokoban", "Qwen2.5-14B", "ppo", 1.29, None),
    ("sokoban", "Qwen2.5-3B", "ppo", 1.16, None),
    ("frozenlake", "Qwen2.5-3B", "grpo", 0.33, -5.0),
)


def predictor_references() -> str:
    """The reference points in words, as the predictor's verdicts cite them."""
    (_, _, _, big, _), (_, _, _, small, _), (_, _, _, low, gain) = PREDICTOR_POINTS
    return (f"Sokoban 14B ratio {big:.2f} and Sokoban 3B {small:.2f} helped; FrozenLake 3B GRPO {low:.2f} hurt "
            f"(about {gain:+.0f}%)")


def _claim(where: str, quantity: str, sign: float, **at: Any) -> Value:
    """A claim the paper shows in a figure: its sign only."""
    return Value(where, quantity, sign, at, DIRECTION, figure_only=True)


# A claim of no association ("flat", "does not move") needs a smallest effect of interest; the paper declares none.
RHO_SESOI = 0.3
RHO_SESOI_WHY = "orch's smallest association of interest, |rho| 0.3 (a weak correlation); the paper declares none"
RHO_BEST = (0.8, 0.98)  # the best rho lies in this range; rho <= 0.6 and rho = 1.0 are worse
# The arms the filter-strategy figure compares (filter.strategy -> filter.value; RAGEN's runs of every task have
# these three). WebShop's extra top-p 0.95 arm (RAGEN run_webshop_release_combos.sh:242-243) is a cell of its own.
FILTER_ARMS = {"top_p": 0.9, "top_k": 0.25, "none": 1.0}
RHO_VALUES = (1.0, 0.98, 0.95, 0.9, 0.8, 0.6, 0.4)
SLIP_RATES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
SLIP_KEEPS_ADVANTAGE_UP_TO = 0.5  # filtering keeps its advantage for slip <= 50%; at 80-100% it vanishes
LENGTH_DECLINE_PCT = (-66.0, -5.0)  # output length declines over training in all 8 environments, by this range

# Cells allowed not to log the MI proxies, with the reason (a documented deviation): setting -> value.
MI_EXEMPT = ({"task.env.observation": "image"},
             "image-input cells: the verl backend cannot cross-score image prompts yet, so sweeps/table4.yaml turns "
             "MI off for them (diagnostics.mi_every: 0); their success still counts")

EVERY_CELL = (names.MI_ZSCORE_EMA,)  # what every cell of every paper sweep logs, whatever its items need

MAIN_TABLE = "RAGEN scripts/runs/run_main_table_diff_{algo,size,model}.sh"
ONE_CHANGE = "RAGEN has no script for it: the main-table script's settings plus the one change the paper describes"

ITEMS: tuple[Item, ...] = (
    Item("table4", "Table 4", "Filtering gain per algorithm, model size, model type and modality",
         "SNR-Aware Filtering raises peak validation success on average for every variant",
         ("table4",), (names.VAL_SUCCESS, names.KEPT_RATIO), "table4",
         f"{MAIN_TABLE}; the 14B row and the VL rows: {ONE_CHANGE} (the model)", _table4_values()),
    Item("table5", "Table 5", "A fixed rollout budget of 128 trajectories, split prompts x samples",
         "With the filter, splits with several samples per prompt gain success and spend less time per step; "
         "accelerator memory stays about unchanged",
         ("table5",), (names.VAL_SUCCESS, names.STEP_TIME, names.PEAK_MEMORY), "table5",
         f"{ONE_CHANGE} (trainer.prompts_per_step x trainer.samples_per_prompt = 128)", _table5_values()),
    Item("table6", "Table 6", "Training on one reward-variance quartile only (Sokoban)",
         "High-RV quartiles train to higher success and MI than low-RV ones",
         ("table6",), (names.VAL_SUCCESS, names.MI_EST, names.ENTROPY), "table6",
         f"{ONE_CHANGE} (filter=quartile)", _table6_values()),
    Item("table7", "Table 7", "Prompt-level vs trajectory-level filtering (Sokoban)",
         "Filtering whole prompts by RV raises success and MI; filtering trajectories within prompts lowers MI",
         ("table7",), (names.VAL_SUCCESS, names.MI_EST, names.KEPT_GROUPS, names.KEPT_SAMPLES), "table7",
         f"{ONE_CHANGE} (filter=trajectory for the trajectory-level row)", _table7_values()),
    Item("correlations", "Figure: diagnostics vs task performance",
         "MI and entropy families correlated with task performance across runs",
         "The MI family correlates with performance (about +0.39) much more strongly than entropy (-0.11 to -0.14)",
         ("table4",), (names.VAL_SUCCESS, names.MI_ZSCORE_EMA, names.collapse_metric("trajectory", "mi_zscore"),
                       names.ENTROPY), "correlations", MAIN_TABLE, CORRELATIONS),
    Item("rv_proxies", "Figure: reward variance vs candidate proxies",
         "Within-prompt reward variance correlated with cheaper candidate proxies",
         "Only mean reward tracks reward variance; retrieval accuracy, response length, MI and conditional "
         "entropy do not", ("table4",),
         (names.RV_STD_MEAN, *RV_PROXIES), "correlations", MAIN_TABLE,
         tuple(v for metric, (s, p) in RV_PROXIES.items() for v in (
             Value("Figure: RV vs proxies", f"Spearman rho of {metric} with RV", s,
                   {"metric": metric, "coefficient": "spearman", "against": "rv"}, CORRELATION, digits=2),
             Value("Figure: RV vs proxies", f"Pearson r of {metric} with RV", p,
                   {"metric": metric, "coefficient": "pearson", "against": "rv"}, CORRELATION, digits=2)))),
    Item("early_warning", "Figure: MI falls before success",
         "The MI proxies over training beside success, without filtering",
         "MI falls before task success does: an early warning of template collapse",
         ("table4",), (names.VAL_SUCCESS, names.MI_ZSCORE_EMA, names.RETRIEVAL_ACC, names.ENTROPY),
         "early_warning", MAIN_TABLE,
         # analysis.stats.early_warning's decline onsets (one rule for both series), per run without the filter
         (Value("Figure: MI falls before success", "share of runs without the filter where MI-ZScore-EMA declined "
                "before success, of the runs where both declined (MI only, success only, together and no decline "
                "counted apart)", +1, {"stat": "order"}, ORDER, figure_only=True),
          _claim("Figure: MI falls before success", "lead of MI-ZScore-EMA's decline over success's, steps "
                 "(success's onset minus MI's), runs without the filter where both declined", +1, stat="lead"))),
    Item("gradient", "Figure: gradient norm by reward-variance bucket",
         "Task and regularisation gradient norms in 6 equal RV buckets (Sokoban, PPO)",
         "The task-gradient norm rises with reward variance; the regularisation-gradient norm is flat",
         ("gradient",), (GRAD_BUCKET_TASK, GRAD_BUCKET_REG), "gradient",
         "RAGEN scripts/runs/run_sokoban_ppo_filter_grad_analysis.sh",
         (_claim("Figure: gradient by RV bucket", "Spearman rho of bucket (low to high RV) with the task-gradient "
                 "norm, per run", +1, part="task"),
          Value("Figure: gradient by RV bucket", "Spearman rho of bucket with the regularisation-gradient norm, "
                "per run (flat)", 0, {"part": "reg"}, NO_EFFECT, figure_only=True, margin=RHO_SESOI, why=RHO_SESOI_WHY))),
    Item("topp", "Figure: the top-p sweep", "Success per filter rho (Sokoban, PPO / Qwen2.5-3B)",
         "The best rho lies in [0.8, 0.98]; rho <= 0.6 and rho = 1.0 are worse",
         ("topp",), (names.VAL_SUCCESS, names.KEPT_RATIO), "topp", "RAGEN scripts/runs/run_top_p_sweep.sh",
         (_claim("Figure: top-p sweep", "peak success of the best rho in [0.8, 0.98] minus rho = 1.0, points", +1,
                 against=1.0),
          _claim("Figure: top-p sweep", "peak success of the best rho in [0.8, 0.98] minus the best rho <= 0.6, "
                 "points", +1, against=0.6))),
    Item("filters", "Figure: top-p vs top-k vs no filter",
         "Filter strategies compared on Sokoban, SearchQA, WebShop and DeepCoder",
         "Top-p beats top-k, which beats no filter: it can keep few prompts when the whole batch is weak",
         ("filters",), (names.VAL_SUCCESS, names.MI_ZSCORE_EMA, names.KEPT_RATIO), "filters",
         "RAGEN scripts/runs/run_filtering_final.sh (Sokoban), run_search_benchmark.sh with docs/experiment_search.md "
         "(SearchQA), run_webshop_release_combos.sh with docs/experiment_webshop_release.md (WebShop; its top-p 0.95 "
         "arm too), docs/experiment_deepcoder.md (DeepCoder)",
         tuple(_claim("Figure: filter strategies", f"{task}: peak success of {better} minus {worse}, points", +1,
                      task=TASKS[task], better=better, worse=worse)
               for task in ("Sokoban", "SearchQA", "WebShop", "DeepCoder")
               for better, worse in (("top_p", "top_k"), ("top_k", "none")))),
    Item("entropy_kl", "Figure: entropy and KL tuning vs filtering",
         "Runs with swept entropy and KL coefficients placed on the entropy and MI axes",
         "Entropy or KL tuning moves runs along the entropy axis only, while filtering raises MI and success",
         ("entropy", "kl"), (names.VAL_SUCCESS, names.ENTROPY, names.MI_ZSCORE_EMA), "entropy_kl",
         "RAGEN scripts/runs/run_entropy_sweep.sh and run_kl_sweep.sh",
         (_claim("Figure: entropy / KL tuning", "Spearman rho of the entropy coefficient with final entropy", +1,
                 coefficient="algorithm.entropy_coeff", metric=names.ENTROPY),
          Value("Figure: entropy / KL tuning", "Spearman rho of the entropy coefficient with final MI-ZScore-EMA "
                "(MI does not move)", 0, {"coefficient": "algorithm.entropy_coeff", "metric": names.MI_ZSCORE_EMA},
                NO_EFFECT, figure_only=True, margin=RHO_SESOI, why=RHO_SESOI_WHY),
          Value("Figure: entropy / KL tuning", "Spearman rho of the KL coefficient with final MI-ZScore-EMA "
                "(MI does not move)", 0, {"coefficient": "algorithm.kl_coef", "metric": names.MI_ZSCORE_EMA},
                NO_EFFECT, figure_only=True, margin=RHO_SESOI, why=RHO_SESOI_WHY))),
    Item("length", "Figure: response length over training",
         "Mean response length over training in all 8 environments",
         "Output length declines over training in every environment (-5% to -66%)",
         ("length",), (names.RESPONSE_LENGTH,), "length",
         f"{ONE_CHANGE} (the task: 7 tasks and 8x8 Sokoban, each with the context and turn lengths RAGEN runs it with)",
         tuple(Value("Figure: response length", f"{task}: change of mean response length from the first to the "
                     f"last steps, % (the paper's range over environments: {LENGTH_DECLINE_PCT[0]:g} to "
                     f"{LENGTH_DECLINE_PCT[1]:g})", sum(LENGTH_DECLINE_PCT) / 2, {"task": orch}, EFFECT,
                     margin=(LENGTH_DECLINE_PCT[1] - LENGTH_DECLINE_PCT[0]) / 2,
                     why="the paper's range over environments, -66 to -5 %")
               for task, orch in TASKS.items())),
    Item("format", "Figure: format validity vs MI",
         "Format validity over training beside the MI proxies",
         "Format validity stays near perfect even under collapse: it cannot see template collapse",
         ("length",), (names.VAL_FORMAT_VALID, names.MI_ZSCORE_EMA), "format", f"{ONE_CHANGE} (the task)",
         tuple(Value("Figure: format validity", f"{task}: final validation format validity (near perfect: 1 within "
                     "0.05)", 1.0, {"task": orch}, LEVEL, figure_only=True, margin=0.05,
                     why="'near perfect' read as 1 within 0.05: orch's reading of the paper's words")
               for task, orch in TASKS.items())),
    Item("slip", "Figure: FrozenLake slip rate", "Filtering gain under environment noise (FrozenLake slip rates)",
         "Filtering keeps its advantage for slip 0-50%; at 80-100% it vanishes",
         ("slip",), (names.VAL_SUCCESS,), "slip", "RAGEN scripts/runs/run_frozen_lake_slipper_rate_sweep.sh",
         tuple(_claim("Figure: slip", f"slip {rate:g}: filter delta of peak success, points", +1, slip=rate)
               if rate <= SLIP_KEEPS_ADVANTAGE_UP_TO else
               Value("Figure: slip", f"slip {rate:g}: filter delta of peak success, points (vanishes)", 0,
                     {"slip": rate}, NO_EFFECT, figure_only=True, margin=SUCCESS_SESOI, why=SUCCESS_SESOI_WHY)
               for rate in SLIP_RATES)),
    Item("predictor", "Figure: the Std(RV)/Mean(RV) predictor",
         "std(RV)/mean(RV) of one rollout batch against the filter's realised gain",
         "A high ratio (bimodal RV) predicts that filtering helps; a ratio near 0 that it does not",
         ("table4",), (names.VAL_SUCCESS, ROLLOUT_ARTIFACT), "predictor", MAIN_TABLE,
         tuple(Value("Figure: predictor", f"std(RV)/mean(RV), {task} {model} {algorithm.upper()}", ratio,
                     {"task": task, "model": model, "algorithm": algorithm, "gain": gain}, digits=2)
               for task, model, algorithm, ratio, gain in PREDICTOR_POINTS)),
)

BY_KEY = {item.key: item for item in ITEMS}
TABLES = tuple(item.ref for item in ITEMS if item.ref.startswith("Table"))


def items_of_sweep(sweep: str) -> list[Item]:
    """The map items a sweep (by name) produces."""
    return [item for item in ITEMS if sweep in item.sweeps]


def paper_sweeps() -> list[str]:
    """Every sweep file name the map names, in map order."""
    return list(dict.fromkeys(sweep for item in ITEMS for sweep in item.sweeps))


# --- what a cell logs, from its resolved config ------------------------------------------------------------------

def cell_logs(config: Any, metric: str) -> bool:
    """Whether a cell with this resolved training config (`recipes.config.schema.TrainConfig`) logs `metric`: the MI
    proxies need the `collapse` hook with MI on and the metric's sample set; the gradient split needs the hook with
    `diagnostics.grad_every`; validation metrics need `trainer.val_every`; a rollout batch needs
    `trainer.dump_every`; every other metric is logged at every step by both trainers."""
    hooks = set(config.hooks)
    if metric == ROLLOUT_ARTIFACT:
        return config.trainer.dump_every > 0
    if metric.startswith("collapse/"):
        sample_set = metric.split("/")[1]
        return (names.COLLAPSE_HOOK in hooks and config.diagnostics.mi_every > 0
                and (sample_set not in names.SAMPLE_SETS or sample_set in config.diagnostics.sets))
    if metric.startswith("grad_norm/"):
        return names.COLLAPSE_HOOK in hooks and config.diagnostics.grad_every > 0
    if metric.startswith("val/"):
        return config.trainer.val_every > 0
    return True


def sweep_path(sweep: str) -> Path:
    """`sweeps/<sweep>.yaml` of this checkout."""
    return SWEEPS_DIR / f"{sweep}.yaml"


def check(sections: set[str], planned: Mapping[str, Sequence[Any] | str],
          unfit: Mapping[str, Sequence[str]]) -> list[str]:
    """One line per problem of the map: an item with no sweep file, a metric that some cell of its sweep does not
    log (every cell must: a table cannot mix runs with and without the diagnostics), no published value or no
    report section, a cell class of a paper sweep that does not fit its declared GPUs (`orch sweep --preflight`'s
    memory and vLLM checks, one line per class). `sections`: the report's section keys
    (`analysis.reports.paper_report.SECTIONS`). The orchestrator's side plans the sweep files (nothing is written) and the
    CLI hands the result in: `planned`, paper sweep -> its planned cells (records with `.settings` and `.config`,
    `orchestrator.api.PlannedConfig`) or the one line saying why it cannot be planned
    (`orchestrator.paper_check.plan_sweeps`); `unfit`, paper sweep -> one line per cell class that does not fit
    (`orchestrator.paper_check.unfit_by_sweep`)."""
    exempt, _ = MI_EXEMPT

    def unlogged(where: str, sweep: str, metrics: tuple[str, ...]) -> list[str]:
        """One line per metric that some cell of `sweep` does not log (the MI-exempt cells are not asked for MI)."""
        path = sweep_path(sweep)
        if not path.exists():
            return [f"{where}: no sweep file {path.relative_to(SWEEPS_DIR.parent)}"]
        configs = planned[sweep]
        if isinstance(configs, str):
            return [f"{where}: {configs}"]
        out = []
        for metric in metrics:
            cells = [cell for cell in configs if not (metric.startswith("collapse/") and all(
                cell.settings.get(key) == value for key, value in exempt.items()))]
            missing = sum(not cell_logs(cell.config, metric) for cell in cells)
            if missing:
                out.append(f"{where}: {missing} of {len(cells)} cells of sweeps/{sweep}.yaml do not log {metric} "
                           f"({_how_to_log(metric)})")
        return out

    problems = []
    for item in ITEMS:
        where = f"{item.ref} ({item.key})"
        if not item.sweeps:
            problems.append(f"{where}: no sweep produces it")
        if not item.published:  # its section would have nothing to measure
            problems.append(f"{where}: no published value (a printed number, or the claim's sign)")
        for sweep in item.sweeps:
            problems += unlogged(where, sweep, item.metrics)
        if item.section not in sections and item.ref.startswith(("Table", "Figure")):
            problems.append(f"{where}: no report section {item.section!r}")
    # RAGEN computes the MI diagnostics in every run (config/base.yaml:147-153): so does every paper sweep
    for sweep in paper_sweeps():
        problems += unlogged(f"sweeps/{sweep}.yaml ({sweep})", sweep, EVERY_CELL)
    # and every verl GPU cell fits the GPUs its sweep file declares (preflight's memory and vLLM checks)
    for sweep in paper_sweeps():
        problems += [f"sweeps/{sweep}.yaml ({sweep}): does not fit its declared hardware: {line}"
                     for line in unfit.get(sweep, ())]
    return problems


def _how_to_log(metric: str) -> str:
    if metric.startswith("collapse/"):
        return "set hooks: [collapse] with diagnostics.mi_every > 0"
    if metric.startswith("grad_norm/"):
        return "set hooks: [collapse] and diagnostics.grad_every"
    if metric == ROLLOUT_ARTIFACT:
        return "set trainer.dump_every > 0"
    return "set trainer.val_every > 0" if metric.startswith("val/") else "the trainers log it at every step"


def status(states: Mapping[str, Mapping[str, int] | None]) -> list[dict[str, Any]]:
    """Per item: its sweeps and, for each, the counts of its cells' states in the orch store (`states`: paper sweep
    -> state -> count, None when the store does not know the sweep; `orchestrator.paper_check.state_counts`, read by
    the CLI)."""
    rows = []
    for item in ITEMS:
        sweeps = {sweep: None if states.get(sweep) is None else dict(states[sweep]) for sweep in item.sweeps}
        rows.append({"key": item.key, "ref": item.ref, "title": item.title, "claim": item.claim,
                     "sweeps": sweeps, "metrics": list(item.metrics), "section": item.section,
                     "settings": item.settings, "published": len(item.published)})
    return rows


def sweep_tasks(sweep: str) -> list[str]:
    """The tasks a sweep file names (its base, grid and axes), read from the file without planning it."""
    import yaml

    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("task", "task.name"):
                    found.extend(value if isinstance(value, list) else [value])
                else:
                    walk(value)
        elif isinstance(node, list):
            for entry in node:
                walk(entry)

    path = sweep_path(sweep)
    if not path.exists():  # `orch paper --check` names it
        return []
    spec = yaml.safe_load(path.read_text()) or {}
    walk({key: spec.get(key) for key in ("base", "grid", "axes")})
    return list(dict.fromkeys(str(task) for task in found))


def data_sources() -> dict[str, DataSource]:
    """Each task that reads a data set in the paper -> its source (`envs.base.DataSource`, declared by the env)."""
    from envs.registry import env_class, list_envs

    return {name: env_class(name).data for name in list_envs() if env_class(name).data is not None}


def data_needs(sweep: str) -> list[str]:
    """What data a sweep's tasks read on a cluster (one line per task that reads a data set)."""
    sources = data_sources()
    return [f"{task}: {f'task.env.{source.key}' if source.key else 'no loader'} ({source.formats})"
            for task in sweep_tasks(sweep) if task in sources for source in [sources[task]]]


# --- RAGEN's batch padding (the `padding` deviation below), to measure what it would have changed ---------------------
# After filtering, RAGEN makes the kept batch a multiple of lcm(env groups, PPO mini-batch, GPUs per node) by copying
# random kept trajectories (ragen/trainer/agent_trainer.py:1190-1196; adjust_batch mode "copy", :104-110), before the
# advantages are computed (:1359). The paper's settings: 8 groups of 16 (config/base.yaml:158-160), mini-batch 32
# trajectories (config/base.yaml:14, run_filtering_final.sh:79), 1-8 GPUs: the divisor is 32.
RAGEN_ENV_GROUPS, RAGEN_GROUP_SIZE, RAGEN_PPO_MINI_BATCH = 8, 16, 32


def ragen_duplicates(kept: int, gpus: int = 8, groups: int = RAGEN_ENV_GROUPS,
                     mini_batch: int = RAGEN_PPO_MINI_BATCH) -> int:
    """Trajectories RAGEN copies into a kept batch of `kept` trajectories (0 when it is already a multiple)."""
    if kept <= 0:
        return 0  # an empty step is skipped, not padded (agent_trainer.py:1126-1186)
    return -kept % math.lcm(groups, mini_batch, gpus)


def ragen_duplicate_share(kept_groups: list[float], gpus: int = 8) -> float:
    """Mean share of copies in RAGEN's update over the steps of a run whose filter kept `kept_groups[i]` groups of
    `RAGEN_GROUP_SIZE` (orch's `rollout/kept_groups` per step; empty steps are left out). NaN when no step kept
    anything."""
    shares = [ragen_duplicates(int(k) * RAGEN_GROUP_SIZE, gpus) / (int(k) * RAGEN_GROUP_SIZE
                                                                  + ragen_duplicates(int(k) * RAGEN_GROUP_SIZE, gpus))
              for k in kept_groups if k >= 1]
    return sum(shares) / len(shares) if shares else math.nan


# --- deliberate deviations from RAGEN's scripts (tests/analysis/test_fidelity.py holds RAGEN's values) ------------
# id -> (what differs, why). A resolved paper cell that differs from RAGEN in a setting whose id is not here fails
# the fidelity test; semantic differences that no config value shows are listed here too.
DEVIATIONS: dict[str, tuple[str, str]] = {
    "seeds": ("3 seeds per cell (RAGEN: one run per setting, config/base.yaml:8-10)",
              "a verdict needs an interval over seeds (analysis/stats/verdicts.py); one run cannot give one"),
    "padding": ("a kept batch is not padded with duplicated trajectories (RAGEN agent_trainer.py:104-133, 1190-1196 "
                "duplicates random kept trajectories up to a mini-batch multiple): the veRL backend pads with masked "
                "no-op groups, the torch backend runs fewer mini-batches",
                "duplicates carry gradient twice and enter GRPO's group statistics (the advantage is computed after "
                "the padding, agent_trainer.py:1359), so RAGEN's update depends on which trajectories its random "
                "draw copies; orch keeps every kept trajectory once. Size: ragen_duplicates(), docs/paper.md"),
    "early_stop": ("no early stop on collapsed reward variance (RAGEN agent_trainer.py:1210-1235) or on validation "
                   "success below 1% for 5 validations (agent_trainer.py:1482-1499); the empty-filter stop after 5 "
                   "steps is RAGEN's",
                   "not built yet; a run that RAGEN would stop runs to its last step here (listed, not hidden)"),
    "observation": ("Sokoban and FrozenLake show the grid as symbol rows (RAGEN: grid_coord, coordinates plus the "
                    "grid, config/envs.yaml:78,187)", "orch's environments have one text rendering; not built yet"),
    "sokoban_generation": ("Sokoban rooms: reverse-play depth 30 and solvable within the 10-action budget (RAGEN: "
                           "depth 300, no budget check, ragen/env/sokoban/config.py:9)",
                           "an unsolvable room is pure noise in the reward; kept from earlier sessions"),
    "metamathqa_turns": ("MetaMathQA: 3 turns, 3 graded attempts, reward 1/2^attempt (RAGEN: 5 turns but one graded "
                         "answer, config/envs.yaml:190-195)",
                         "follows the paper's text (the reward halves per retry), which RAGEN's code does not reach"),
    "countdown_data": ("Countdown-Tasks-3to4 (task.env.data_path; RAGEN: scripts/download_data.py:16-18) is read as "
                       "RAGEN selects its records (ragen/env/countdown/env.py:46-50), but every 10th record is held "
                       "out for validation (envs/split.py; RAGEN plays record seed % N for every seed, env.py:54)",
                       "validation must never score a problem the policy trained on, as for every task with records"),
    "heldout_data": ("SearchQA, WebShop and DeepCoder hold out every 10th record for validation (envs/split.py): "
                     "SearchQA reads the first 20,000 HotpotQA records as RAGEN does but RAGEN plays record seed % "
                     "20,000 for training and validation alike (ragen/env/search/config.py:22, env.py:103); RAGEN "
                     "validates WebShop on goals 500-1499 and trains on 1500 on (ragen/env/webshop/env.py:102-107); "
                     "RAGEN draws DeepCoder problems at random from the DeepCoder-Preview test split for both "
                     "(ragen/env/deepcoder/config.py:12, env.py:68-70, utils.py:36-37)",
                     "validation must never score a problem the policy trained on, as for every task with records "
                     "(countdown_data)"),
    "searchqa_retrieval": ("SearchQA searches the data set's own paragraphs with BM25 in the training process "
                           "(task.env.corpus all; whole paragraphs shown); RAGEN queries a server running E5 dense "
                           "retrieval over 21M Wikipedia passages, each cut to 300 characters, 4,000 in all "
                           "(docs/experiment_search.md:31-46; ragen/env/search/retrieval_client.py:125-139, "
                           "config.py:28). An action that is neither search[...] nor finish[...] is invalid here "
                           "(the format penalty); RAGEN reads an answer out of it with heuristics "
                           "(ragen/env/search/env.py:138-140,188-220, reward.py:77-123)",
                           "a CPU-only limit: RAGEN's retriever is a 74 GB index served from a dedicated GPU "
                           "(experiment_search.md:31,46,160) and orch's environments run offline, in process; an "
                           "action outside a task's grammar is a format error in every orch task, and RAGEN charges "
                           "the same penalty for one (config/base.yaml:156)"),
    "searchqa_topk_arm": ("SearchQA's top-k arm runs the other arms' 5,000-token context and mini-batch of 64 "
                          "trajectories (RAGEN's top-k run: 4,000 and 32, docs/experiment_search.md:78,128,162)",
                          "RAGEN's doc gives both as workarounds -- KV-cache memory (:162) and an assertion that the "
                          "mini-batch not exceed the 32 trajectories top-k keeps (:84,161) -- and says the sweep keeps "
                          "every other hyperparameter fixed (:13); orch has neither limit, and 32 kept trajectories "
                          "make one update with a mini-batch of 64 as with one of 32"),
    "mi_off_runs": ("the MI diagnostics run in the SearchQA and DeepCoder cells of the filters sweep too; RAGEN turns "
                    "them off there (collapse_detection.compute_freq 999, docs/experiment_search.md:146-147; "
                    "first_turn_enabled and multi_turn_enabled False, docs/experiment_deepcoder.md:115-116)",
                    "the filters item reads MI-ZScore-EMA beside success on every task, as RAGEN's base config "
                    "computes it in every run (config/base.yaml:147-153); the diagnostics only score the batch, "
                    "without gradients (docs/diagnostics.md), so the update is the same"),
    "webshop_env": ("WebShop is orch's re-implementation (envs/webshop: BM25 search, WebShop's reward re-written, "
                    "titles and features cut to 120 and 240 characters, no shopping tips in the state); RAGEN runs "
                    "WebShop's own webshop-minimal (Lucene search, ragen/env/webshop/env.py:3,45-57) and appends "
                    "tips to every state (env.py:13-23,161-168)",
                    "webshop-minimal needs Java and a Lucene index (pyserini) beside Python; orch's environments run "
                    "offline, in process. Its pages, budget (9 turns of one action) and reward (1 for a full match) "
                    "are RAGEN's: conf/task/webshop.yaml"),
    "deepcoder_env": ("DeepCoder runs each test in a bubblewrap sandbox with limits per test (2 s CPU, 4 s wall, "
                      "512 MiB); RAGEN runs the program's tests in one unsandboxed subprocess with a 3 s timeout "
                      "(ragen/env/deepcoder/utils.py:107,315-332). A prompt longer than the context fails RAGEN's run "
                      "(agent_proxy.fail_on_prompt_too_long, docs/experiment_deepcoder.md:108); orch cuts the "
                      "trajectory (no loss on it)",
                      "generated code must not run unisolated on a shared cluster node; a run that dies on one long "
                      "problem loses every other cell's comparison"),
    "gradient_batch": ("the gradient split uses the step's own unfiltered 8 x 16 batch and reports task vs the "
                       "combined regulariser (RAGEN: a separate 128 x 16 rollout, filtered and unfiltered, task / "
                       "entropy / KL separately, scripts/runs/run_sokoban_ppo_filter_grad_analysis.sh:41-42,196-203)",
                       "no second rollout per analysis step; the direction of the claim is testable either way"),
    "mi_image": ("no MI diagnostics on image-input cells (sweeps/table4.yaml's image row)", MI_EXEMPT[1]),
}
