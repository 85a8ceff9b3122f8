"""The paper, side by side: one report section per item of the paper map (`analysis.paper`) that a sweep produces,
with every published value beside the measured one (mean over seeds, 95% bootstrap interval, the difference) and a
verdict per value by the rules of `analysis.stats.verdicts`, then one figure on shared axes (published on x, measured on
y for levels; the measured difference with its interval for directions, the published sign marked).

Below the comparison, some sections show what their verdicts were taken from (`DETAILS`: Table 5's seconds and
gigabytes, the early warning's per-run onsets, the entropy and KL dose-response curves).

An item whose sweep has no finished cells for it says so in one line (or, where its runs say why nothing could be
measured, that reason: `UNMEASURABLE`); it never draws an empty chart. A sweep run on the code-built tiny model (a
rehearsal, `--profile cpu`) or on generated data carries a banner saying so: its levels are not comparable with the
paper's, only its directions are indicative.

    sections = paper_sections(data, summary, items)   # `analysis.reports.report` calls this
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis import names, paper
from analysis.stats.early_warning import OUTCOMES, decline_order  # noqa: F401  (re-exported: the ordering measurement)
from analysis.stats.verdicts import (
    CORRELATION,
    DIRECTION,
    INCONCLUSIVE,
    KINDS,
    NOT_MEASURED,
    ORDER,
    Measurement,
    change_interval,
    correlation_interval,
    delta_interval,
    detectable,
    judge,
    load_rates,
    mean_interval,
    rate_line,
)

if TYPE_CHECKING:
    import pandas as pd

    from analysis.paper import Item, Value
    from analysis.reports.sections import Section
    from analysis.stores.mlflow_store import RunData

Measured = Measurement  # value, lo, hi, runs (and the per-run values, where there are some)
NONE: Measured = Measurement(math.nan, math.nan, math.nan, 0)
COLUMNS = ["where", "quantity", "published", "kind", "margin", "measured", "95% interval", "runs",
           "measured - published", "detectable", "verdict", "reason"]
CONFIG_KEYS = ("model.name", "model.path", "task.env.observation", "algorithm.name", "filter.strategy",
               "filter.value", "algorithm.entropy_coeff", "algorithm.kl_coef", "algorithm.use_kl",
               *sorted({f"task.env.{source.key}" for source in paper.data_sources().values() if source.key}))


@dataclass
class Context:
    """What every item's measurement reads: the per-run summary (`analysis.stats.summary.summarize`) with the config keys
    above as columns (`config.<key>`), the paper's Table 4 row of each run, and the runs' metric histories."""

    data: RunData
    runs: pd.DataFrame
    n_boot: int
    predictions: pd.DataFrame | None = None  # analysis.stats.predictor.predictions of the first dumped batches
    _stats: dict[tuple[str, str], pd.Series] = field(default_factory=dict)  # (metric, how) -> per run, computed once
    _leads: pd.DataFrame | None = None
    _tasks: dict[str, Context] = field(default_factory=dict)  # task -> the context of its runs, built once

    def task(self, task: str) -> Context:
        """The context of one task's runs (:meth:`only`), built once: every correlation the paper did not pool
        asks for each task's (13 values x 4 tasks, each a pass over the sweep's 3 million values: issue 60)."""
        if task not in self._tasks:
            self._tasks[task] = self.only(self.runs["task"] == task)
        return self._tasks[task]

    def history(self, key: str) -> pd.DataFrame:
        return self.data.history(key)

    def only(self, mask: pd.Series) -> Context:
        """The same context over the runs `mask` selects (their metric histories and predictions with them)."""
        from analysis.stores.mlflow_store import RunData

        runs = self.runs[mask]
        ids = set(runs["run_id"])
        data = RunData(runs=self.data.runs[self.data.runs["run_id"].isin(ids)],
                       metrics=self.data.metrics[self.data.metrics["run_id"].isin(ids)],
                       tracking_uri=self.data.tracking_uri, reader=self.data.reader)
        predictions = None if self.predictions is None else self.predictions[self.predictions["run_id"].isin(ids)]
        return Context(data, runs, self.n_boot, predictions)

    def final(self, key: str) -> pd.Series:
        """Per run: the mean of the metric's last logged values (`analysis.stats.summary.metric_stats`'s final)."""
        return self.per_run(key, "final")

    def per_run(self, key: str, how: str) -> pd.Series:
        """Per run: one statistic of the metric's history (a column of `analysis.stats.summary.metric_stats`)."""
        from analysis.stats.summary import metric_stats

        if (key, how) not in self._stats:
            stats = metric_stats(self.data, key)
            self._stats[key, how] = stats[how] if not stats.empty else stats.reindex(columns=[how])[how]
        return self._stats[key, how]

    def leads(self) -> pd.DataFrame:
        """`analysis.stats.early_warning.early_warning`'s per-run frame for the runs without the filter (computed once)."""
        from analysis.stats.early_warning import early_warning

        if self._leads is None:
            leads = early_warning(self.data)
            self._leads = leads[leads["run_id"].isin(_filtered(self.runs, False)["run_id"])].reset_index(drop=True)
        return self._leads


def build_context(data: RunData, summary: pd.DataFrame, n_boot: int = 1000,
                  predictions: pd.DataFrame | None = None) -> Context:
    from analysis.stats.summary import cell_runs, config_value

    cells = cell_runs(data.runs)
    runs = summary.copy()
    by_id = {key: dict(zip(cells["run_id"], config_value(cells, key), strict=True)) for key in CONFIG_KEYS}
    for key, values in by_id.items():
        runs[f"config.{key}"] = runs["run_id"].map(values)
    runs["table4_row"] = [table4_row(row) for row in runs.to_dict("records")]
    return Context(data, runs, n_boot, predictions)


def metric_gaps(item: Item, data: RunData) -> list[str]:
    """One line per (finished cell run, metric the item needs) without a single finite value: what the CI rehearsal
    (`orch report --paper --strict`) refuses. The MI proxies are not asked of the cells `paper.MI_EXEMPT` names;
    rollout-batch artifacts (`paper.ROLLOUT_ARTIFACT`) are not checked here."""
    import numpy as np

    exempt, _ = paper.MI_EXEMPT
    runs = data.runs
    if "params.backend" in runs:  # a sweep's parent run has no training config
        runs = runs[runs["params.backend"].notna()]
    if "status" in runs:
        runs = runs[runs["status"] == "FINISHED"]
    finite = data.metrics[np.isfinite(data.metrics["value"].astype(float))]
    logged = set(zip(finite["run_id"], finite["key"], strict=True))
    gaps = []
    for run in runs.to_dict("records"):
        mi_exempt = all(str(run.get(f"params.{key}")) == str(value) for key, value in exempt.items())
        for metric in item.metrics:
            if metric == paper.ROLLOUT_ARTIFACT or (metric.startswith("collapse/") and mi_exempt):
                continue
            if (run["run_id"], metric) not in logged:
                gaps.append(f"{item.ref} ({item.key}): run {run['run_id']} ({run.get('experiment', '?')}) has no "
                            f"finite value of {metric}")
    return gaps


def generated_data(ctx: Context) -> list[str]:
    """One line per task some run trained on built-in or generated data instead of the paper's data set."""
    lines = []
    for task, source in paper.data_sources().items():
        runs = ctx.runs[ctx.runs["task"] == task]
        if runs.empty:
            continue
        column = f"config.task.env.{source.key}"
        built_in = runs if source.key is None or column not in runs else runs[
            runs[column].isna() | runs[column].isin(["", "None", "null"])]
        if not built_in.empty:
            lines.append(f"{task} ({len(built_in)} run(s)) trained on {source.builtin}, not the paper's data "
                         f"({source.formats})")
    return lines


CODE_BUILT_STANDS_FOR = "Qwen2.5-3B"  # the paper's model a code-built text model (no model.path) stands for


def model_of(runs: pd.DataFrame) -> pd.Series:
    """Per run, the paper's model it stands for: its checkpoint folder's name, or, for a code-built text model (a
    rehearsal), `CODE_BUILT_STANDS_FOR` (a code-built vision-language model stands for none of the text models)."""
    paths = runs["config.model.path"].where(~runs["config.model.path"].isin(["", "None", "null"]))
    folders = paths.map(lambda path: PurePath(str(path)).name, na_action="ignore")
    code_built = paths.isna() & (runs["config.model.name"].astype(str) != "tiny_vl")
    return folders.where(~code_built, CODE_BUILT_STANDS_FOR)


def table4_row(run: dict[str, Any]) -> str | None:
    """The paper's Table 4 row a run belongs to, from its algorithm, model and observation; a code-built model
    (no model.path) stands for the paper's Qwen2.5-3B (or, when vision-language, Qwen2.5-VL-3B)."""
    path, name = run.get("config.model.path"), str(run.get("config.model.name") or "")
    model = PurePath(str(path)).name if isinstance(path, str) and path else None
    algorithm = str(run.get("config.algorithm.name") or "")
    if name == "tiny_vl" or (model and "-VL-" in model):
        return f"Qwen2.5-VL-3B, {run.get('config.task.env.observation') or 'text'} input"
    if model in (None, CODE_BUILT_STANDS_FOR):
        return {"ppo": "PPO Qwen2.5-3B", "dapo": "DAPO", "grpo": "GRPO", "drgrpo": "Dr.GRPO"}.get(algorithm)
    if algorithm != "ppo":
        return None
    label = "Llama3.2-3B" if model.startswith("Llama-3.2-3B") else model
    return label if label in paper.TABLE4 else None


def is_rehearsal(ctx: Context) -> bool:
    """Whether any run trained a code-built model (no checkpoint path): a rehearsal, not the paper's models."""
    paths = ctx.runs["config.model.path"]
    return bool(paths.isna().any() or paths.isin(["", "None", "null"]).any())


# --- measurements ------------------------------------------------------------------------------------------------

def _level(values: Any, n_boot: int) -> Measured:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return NONE
    return Measurement(*mean_interval(values, n_boot), int(values.size), samples=(values,))


def _delta(base: Any, treated: Any, n_boot: int) -> Measured:
    base, treated = (np.asarray(v, dtype=np.float64) for v in (base, treated))
    base, treated = base[np.isfinite(base)], treated[np.isfinite(treated)]
    if not base.size or not treated.size:
        return NONE
    return Measurement(*delta_interval(base, treated, n_boot), int(min(base.size, treated.size)),
                       samples=(base, treated))


def _change(base: Any, treated: Any, n_boot: int) -> Measured:
    """The relative change from `base` to `treated`, % of the base (`analysis.stats.verdicts.change_interval`), with
    both arms in % of the base's mean as its samples: the judge then takes Welch's t interval of their difference, the
    interval `benchmarks/bench_judge.py` calibrates the effect path with (not the bootstrap's, which it never ran)."""
    base, treated = (np.asarray(v, dtype=np.float64) for v in (base, treated))
    base, treated = base[np.isfinite(base)], treated[np.isfinite(treated)]
    change = change_interval(base, treated, n_boot)
    if math.isnan(change[0]):
        return NONE
    scale = 100.0 / base.mean()
    return Measurement(*change, int(min(base.size, treated.size)), samples=(base * scale, treated * scale))


def _filtered(runs: pd.DataFrame, on: bool) -> pd.DataFrame:
    return runs[runs["filtered"].fillna(not on).astype(bool) == on]


def _spearman_per_run(xs: dict[str, list[float]], ys: dict[str, list[float]]) -> list[float]:
    from scipy.stats import spearmanr

    out = []
    for run in xs:
        x, y = np.asarray(xs[run]), np.asarray(ys.get(run, []))
        if len(x) >= 3 and len(x) == len(y) and np.ptp(x) > 0 and np.ptp(y) > 0:
            out.append(float(spearmanr(x, y).statistic))
    return out


SECTIONS: dict[str, Callable[[Context, Value], Measured]] = {}


def measures(key: str) -> Callable[[Callable[[Context, Value], Measured]], Callable[[Context, Value], Measured]]:
    """Register the measurement of a map item's published values (one function per report section)."""
    def register(function: Callable[[Context, Value], Measured]) -> Callable[[Context, Value], Measured]:
        SECTIONS[key] = function
        return function
    return register


@measures("table4")
def _table4(ctx: Context, value: Value) -> Measured:
    runs = ctx.runs[(ctx.runs["table4_row"] == value.at["variant"]) & (ctx.runs["task"] == value.at["task"])]
    base = _filtered(runs, False)["peak_success"]
    if value.at["stat"] == "base":
        return _level(base, ctx.n_boot)
    return _delta(base, _filtered(runs, True)["peak_success"], ctx.n_boot)


def _table5_runs(ctx: Context, task: str, samples: int) -> pd.DataFrame:
    """The runs of one split of the budget with their mean step time (s) and peak memory (GB, names.PEAK_MEMORY).
    A split is named by its samples per prompt: a smaller budget split the same way (the `rehearsal` profile's 16
    trajectories) lands in the same row."""
    runs = ctx.runs[(ctx.runs["task"] == task) & (ctx.runs["samples"] == samples)]
    return runs.assign(peak_memory=runs["run_id"].map(ctx.per_run(names.PEAK_MEMORY, "peak")))


@measures("table5")
def _table5(ctx: Context, value: Value) -> Measured:
    # Success is a level; step time and memory are judged as the change the filter brings at the same split, % of
    # the unfiltered runs' mean: the paper's seconds are its hardware's, its claim the relative cut (analysis.paper).
    at = value.at
    runs = _table5_runs(ctx, at["task"], at["samples"])
    if at["stat"] == "success":
        return _level(_filtered(runs, at["filtered"])["peak_success"], ctx.n_boot)
    column = "step_time" if at["stat"] == "time_change" else "peak_memory"
    return _change(_filtered(runs, False)[column], _filtered(runs, True)[column], ctx.n_boot)


def _final_of(ctx: Context, runs: pd.DataFrame, stat: str) -> Any:
    if stat == "success":
        return runs["peak_success"]
    key = {"mi": names.MI_EST, "entropy": names.ENTROPY}[stat]
    return runs["run_id"].map(ctx.final(key))


@measures("table6")
def _table6(ctx: Context, value: Value) -> Measured:
    runs = ctx.runs[(ctx.runs["config.filter.strategy"] == "quartile")
                    & (ctx.runs["config.filter.value"].astype(float) == value.at["quartile"])]
    return _level(_final_of(ctx, runs, value.at["stat"]), ctx.n_boot)


TABLE7_LEVELS = {"none": ("none",), "prompt": ("top_p",), "trajectory": ("trajectory",)}


@measures("table7")
def _table7(ctx: Context, value: Value) -> Measured:
    runs = ctx.runs[ctx.runs["config.filter.strategy"].isin(TABLE7_LEVELS[value.at["level"]])]
    stat = value.at["stat"]
    if stat in ("prompts", "trajectories"):
        return _level(runs["kept_groups" if stat == "prompts" else "kept_samples"], ctx.n_boot)
    return _level(_final_of(ctx, runs, stat), ctx.n_boot)


@measures("correlations")
def _correlations(ctx: Context, value: Value) -> Measured:
    from analysis.stats.correlations import correlate, rv_proxy_pairs

    # The pairs go with the measurement: the judge's interval is Fisher's z over runs, or the delete-one-run
    # jackknife for (run, step) pairs (analysis.stats.verdicts.correlation_interval), not the bootstrap over 3-10 runs.
    coefficient = value.at["coefficient"]
    if value.at.get("against") == "rv":  # RV against a proxy over (run, step)
        paired = rv_proxy_pairs(ctx.data, value.at["metric"])
        if paired.empty:
            return NONE
        stats = correlate(paired["value"], paired["rv"], n_boot=0)
        return Measurement(stats[coefficient], math.nan, math.nan, int(paired["run_id"].nunique()),
                           samples=(paired["value"].to_numpy(float), paired["rv"].to_numpy(float),
                                    paired["run_id"].to_numpy()), coefficient=coefficient)
    means = ctx.runs["run_id"].map(ctx.final(value.at["metric"]))
    stats = correlate(means, ctx.runs["peak_success"], n_boot=0)
    return Measurement(stats[coefficient], math.nan, math.nan, int(stats["n"]),
                       samples=(means.to_numpy(float), ctx.runs["peak_success"].to_numpy(float)),
                       coefficient=coefficient)


@measures("early_warning")
def _early_warning(ctx: Context, value: Value) -> Measured:
    leads = ctx.leads()
    if value.at["stat"] == "lead":
        return _level(leads["lead_steps"].astype("float64"), ctx.n_boot)
    return decline_order(list(leads["outcome"]))


@measures("gradient")
def _gradient(ctx: Context, value: Value) -> Measured:
    part = value.at["part"]
    buckets: dict[str, list[float]] = {}
    norms: dict[str, list[float]] = {}
    for k in range(64):
        history = ctx.history(f"grad_norm/bucket_{k}/{part}")
        if history.empty:
            break
        for run, values in history.groupby("run_id")["value"]:
            buckets.setdefault(run, []).append(k)
            norms.setdefault(run, []).append(float(values.mean()))
    return _level(_spearman_per_run(buckets, norms), ctx.n_boot)


@measures("topp")
def _topp(ctx: Context, value: Value) -> Measured:
    runs = ctx.runs
    filtered = runs[runs["config.filter.strategy"] == "top_p"].copy()
    filtered["value"] = filtered["config.filter.value"].astype(float)
    best_range = filtered[filtered["value"].between(*paper.RHO_BEST)]
    if best_range.empty:
        return NONE
    best = best_range.groupby("value")["peak_success"].mean().idxmax()
    against = filtered[filtered["value"] == 1.0] if value.at["against"] == 1.0 else filtered[filtered["value"] <= 0.6]
    if value.at["against"] != 1.0 and not against.empty:
        against = against[against["value"] == against.groupby("value")["peak_success"].mean().idxmax()]
    return _delta(against["peak_success"], best_range[best_range["value"] == best]["peak_success"], ctx.n_boot)


@measures("filters")
def _filters(ctx: Context, value: Value) -> Measured:
    runs = ctx.runs[ctx.runs["task"] == value.at["task"]]
    rho = runs["config.filter.value"].astype(float)
    arm = {name: runs[(runs["config.filter.strategy"] == name) & ((rho - at).abs() < 1e-9)]["peak_success"]
           for name, at in paper.FILTER_ARMS.items()}  # WebShop's top-p 0.95 cells are not its top-p arm
    return _delta(arm[value.at["worse"]], arm[value.at["better"]], ctx.n_boot)


REGULARISERS = {"algorithm.entropy_coeff": "entropy bonus", "algorithm.kl_coef": "KL loss"}


def doses(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run (the index of `runs`), the coefficient each regulariser of `REGULARISERS` is applied with: the
    entropy coefficient, and the KL coefficient only where the KL loss is on (`algorithm.use_kl`; every cell
    carries a `kl_coef`, conf/algorithm/_base.yaml, and the entropy sweep's cells run with the loss off). NaN where
    unknown."""
    import pandas as pd

    use_kl = runs["config.algorithm.use_kl"].map(lambda v: {"true": 1.0, "false": 0.0}.get(str(v).lower()))
    use_kl = use_kl.astype("float64")
    kl = pd.to_numeric(runs["config.algorithm.kl_coef"], errors="coerce").where(use_kl == 1.0, 0.0)
    entropy = pd.to_numeric(runs["config.algorithm.entropy_coeff"], errors="coerce")
    return pd.DataFrame({"algorithm.entropy_coeff": entropy, "algorithm.kl_coef": kl.where(use_kl.notna())},
                        index=runs.index)


def dose_curve(runs: pd.DataFrame, coefficient: str) -> pd.Series:
    """One regulariser's dose-response curve: its coefficient per run, over the runs whose other regularisers are
    off (the entropy sweep for the entropy bonus, the KL sweep for the KL loss; the run with both off is the origin
    of both). Pooling the sweeps would put every KL run at entropy 0 on the entropy curve."""
    dose = doses(runs)
    others = [column for column in dose.columns if column != coefficient]
    return dose.loc[(dose[others] == 0).all(axis=1) & dose[coefficient].notna(), coefficient]


@measures("entropy_kl")
def _entropy_kl(ctx: Context, value: Value) -> Measured:
    from analysis.stats.correlations import correlate

    coefficient = dose_curve(ctx.runs, value.at["coefficient"])
    if coefficient.nunique() < 2:
        return NONE
    final = ctx.runs.loc[coefficient.index, "run_id"].map(ctx.final(value.at["metric"]))
    stats = correlate(coefficient, final, n_boot=0)
    return Measurement(stats["spearman"], *correlation_interval(coefficient, final, "spearman"), int(stats["n"]))


@measures("length")
def _length(ctx: Context, value: Value) -> Measured:
    from analysis.stats.summary import TAIL

    history = ctx.history(names.RESPONSE_LENGTH)
    runs = set(ctx.runs.loc[ctx.runs["task"] == value.at["task"], "run_id"])
    changes = []
    for _, steps in history[history["run_id"].isin(runs)].groupby("run_id"):
        values = steps.sort_values("step")["value"].to_numpy(dtype=np.float64)
        values = values[np.isfinite(values)]
        ends = min(TAIL, values.size // 2)  # the first and last TAIL steps (a short run: its two halves)
        if ends >= 1 and values[:ends].mean() > 0:
            first, last = values[:ends].mean(), values[-ends:].mean()
            changes.append(100.0 * (last - first) / first)
    return _level(changes, ctx.n_boot)


@measures("format")
def _format(ctx: Context, value: Value) -> Measured:
    runs = ctx.runs[ctx.runs["task"] == value.at["task"]]
    return _level(runs["run_id"].map(ctx.final(names.VAL_FORMAT_VALID)), ctx.n_boot)


@measures("slip")
def _slip(ctx: Context, value: Value) -> Measured:
    runs = ctx.runs[np.isclose(ctx.runs["slip"].astype(float), value.at["slip"])]
    return _delta(_filtered(runs, False)["peak_success"], _filtered(runs, True)["peak_success"], ctx.n_boot)


@measures("predictor")
def _predictor(ctx: Context, value: Value) -> Measured:
    predictions = ctx.predictions
    if predictions is None or predictions.empty:
        return NONE
    ratios = predictions.set_index("run_id")["ratio"].reindex(_predictor_runs(ctx, value)["run_id"])
    return _level(ratios, ctx.n_boot)


def _predictor_runs(ctx: Context, value: Value) -> pd.DataFrame:
    """The runs without the filter of the value's task, algorithm and model."""
    runs = ctx.runs[(ctx.runs["task"] == value.at["task"])
                    & (ctx.runs["config.algorithm.name"] == value.at["algorithm"])
                    & (model_of(ctx.runs) == value.at["model"].split("/")[-1])]
    return _filtered(runs, False)


# --- what a section shows beside its comparison ------------------------------------------------------------------

Details = Callable[["Context", "Item", "Section"], None]
DETAILS: dict[str, Details] = {}


def details(key: str) -> Callable[[Details], Details]:
    """Register what a report section shows below its comparison: the measurements the verdicts were taken on."""
    def register(function: Details) -> Details:
        DETAILS[key] = function
        return function
    return register


@details("table5")
def _table5_details(ctx: Context, item: Item, section: Section) -> None:
    import pandas as pd

    rows = []
    for value in item.published:
        at = value.at
        if at["stat"] != "success" or at["filtered"]:
            continue
        runs = _table5_runs(ctx, at["task"], at["samples"])
        for on in (False, True):
            arm = _filtered(runs, on)
            if not arm.empty:
                rows.append({"split": value.where.removeprefix("Table 5, "), "filter": "on" if on else "off",
                             "runs": len(arm), "mean step time (s)": arm["step_time"].mean(),
                             "peak memory (GB)": arm["peak_memory"].mean()})
    if rows:
        section.table(pd.DataFrame(rows), f"What the changes are taken from: per split, the mean step time "
                      f"({names.STEP_TIME}) and the peak memory ({names.PEAK_MEMORY}: the accelerator's peak "
                      "allocation on a GPU, the process's peak resident set on a CPU), mean over runs", digits=3)


@details("early_warning")
def _early_warning_details(ctx: Context, item: Item, section: Section) -> None:
    from analysis.stats.collapse_alert_calibration import decline_rule_line
    from analysis.stats.controls import control_lines
    from analysis.stats.early_warning import DEFAULT_RULE

    leads = ctx.leads()
    if leads.empty:
        return
    counts = leads["outcome"].value_counts()
    section.note(f"Decline: a series at or below {1 - DEFAULT_RULE.drop_fraction:.0%} of its running peak on "
                 f"{DEFAULT_RULE.patience} logged points in a row (the collapse alert's legacy rule applied to one "
                 f"series, recipes.stats.collapse_alert.decline_onset), MI as {names.MI_ZSCORE_EMA}, success as "
                 f"{names.VAL_SUCCESS}. Runs without the filter: " + ", ".join(f"{outcome} {count}" for outcome, count in counts.items()) + ".")
    section.note(decline_rule_line())  # the decline rule's own false-alarm rate, beside the ordering verdict
    tasks = ctx.runs.loc[ctx.runs["run_id"].isin(leads["run_id"]), "task"].dropna().unique()
    for line in control_lines(tasks):  # has MI been seen to move where it is read here? (its measured rates)
        section.note(line)
    shown = ctx.runs[["run_id", "run_name", "task", "variant", "seed"]].merge(leads, on="run_id")
    section.table(shown.drop(columns="run_id"), "Per run without the filter: each series' peak and decline onset "
                  "(steps), the lead, and the step the trainer's collapse alert fired")


@details("entropy_kl")
def _entropy_kl_details(ctx: Context, item: Item, section: Section) -> None:
    import pandas as pd
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    metrics = list(dict.fromkeys(value.at["metric"] for value in item.published))
    rows = []
    for coefficient, regulariser in REGULARISERS.items():
        curve = dose_curve(ctx.runs, coefficient)
        runs = ctx.runs.loc[curve.index, ["run_id"]].assign(coefficient=curve)
        for metric in metrics:
            runs[metric] = runs["run_id"].map(ctx.final(metric))
        for dose, group in runs.groupby("coefficient", sort=True):
            rows.append({"curve": regulariser, "coefficient": dose, "runs": len(group),
                         **{f"final {metric}": group[metric].mean() for metric in metrics}})
    if not rows:
        return
    frame = pd.DataFrame(rows)
    section.table(frame, "The two dose-response curves, each over the runs whose other regulariser is off, "
                  "against its own coefficient (the KL coefficient counts only with the KL loss on); mean over runs",
                  digits=4)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[f"final {metric}" for metric in metrics])
    for column, metric in enumerate(metrics, start=1):
        for regulariser, curve in frame.groupby("curve", sort=False):
            fig.add_trace(go.Scatter(x=curve["coefficient"].map("{:g}".format), y=curve[f"final {metric}"],
                                     mode="lines+markers", name=regulariser, legendgroup=regulariser,
                                     showlegend=column == 1), row=1, col=column)
        fig.update_xaxes(title_text="coefficient", type="category", row=1, col=column)
    fig.update_layout(title=f"{item.ref}: one curve per regulariser", height=420, margin={"t": 60})
    section.figure(fig)


# --- why a section measured nothing, where the runs say why -------------------------------------------------------

UNMEASURABLE: dict[str, Callable[[Context, Item], str | None]] = {}  # section -> the reason, or None


def _predictor_unmeasurable(ctx: Context, item: Item) -> str | None:
    import pandas as pd

    if ctx.predictions is None or ctx.predictions.empty:
        return None
    runs = pd.concat([_predictor_runs(ctx, value) for value in item.published])["run_id"].unique()
    read = ctx.predictions[ctx.predictions["run_id"].isin(runs)]
    if read.empty or not (read["zero_variance_share"] >= 1.0).all():
        return None
    return (f"Not measurable on these runs: the first rollout batch of each of the {len(read)} run(s) without the "
            "filter that this item reads had zero reward variance in every group, so std(RV)/mean(RV) is undefined "
            "(analysis.stats.predictor).")


UNMEASURABLE["predictor"] = _predictor_unmeasurable


# --- the sections ------------------------------------------------------------------------------------------------

def _scopes(ctx: Context, value: Value) -> list[tuple[str, Context]]:
    """Where a value is measured: the whole context, or, for a correlation the paper did not pool over tasks, each
    task's runs on their own (labelled)."""
    if value.kind != CORRELATION or value.pooled or ctx.runs["task"].nunique() <= 1:
        return [("", ctx)]
    return [(f" [{task}]", ctx.task(task)) for task in sorted(ctx.runs["task"].dropna().unique())]


def comparison(ctx: Context, item: Item) -> pd.DataFrame:
    """One row per published value of `item` that some run measures (per task, for a correlation the paper did not
    pool): published, kind, margin and how it was chosen, measured with the interval the verdict was taken on, the
    smallest difference that interval could detect, the verdict and its reason (see the module docstring)."""
    import pandas as pd

    rows = []
    measure = SECTIONS[item.section]
    for value in item.published:
        for label, scope in _scopes(ctx, value):
            measured = measure(scope, value)
            if measured.n == 0 and not measured.counts:
                continue
            verdict, reason, lo, hi = judge(value.value, value.kind, measured, margin=value.band)
            published = (f"{value.value:+g} (sign; figure)" if value.figure_only and value.kind in (DIRECTION, ORDER)
                         else value.printed)
            difference = measured.value - value.value if value.kind in LEVEL_KINDS else math.nan
            rows.append({"where": value.where + label, "quantity": value.quantity, "published": published,
                         "kind": value.kind, "margin": value.margin_text(), "measured": measured.value,
                         "95% interval": f"[{lo:.3g}, {hi:.3g}]" if math.isfinite(lo) else "n/a",
                         "runs": measured.n, "measured - published": difference,
                         "detectable": detectable(lo, hi) if value.kind != ORDER else math.nan,
                         "verdict": verdict, "reason": reason, "_kind": value.kind, "_published": value.value,
                         "_lo": lo, "_hi": hi})
    return pd.DataFrame(rows, columns=[*COLUMNS, "_kind", "_published", "_lo", "_hi"])


LEVEL_KINDS = ("level", CORRELATION)


def rehearsal_problems(frames: dict[str, pd.DataFrame], items: list[Item]) -> list[str]:
    """What the paper rehearsal (tests/analysis/test_rehearsal.py) refuses in `orch report --paper`'s comparison
    frames (`Report.comparisons`): a measured value that is NaN (a row *not measured*), an item with fewer measured
    values than its declared ``coverage``, and a path of the judge (`analysis.stats.verdicts.KINDS`) that no row with a
    finite measurement exercised. One line each."""
    problems, exercised = [], set()
    for item in items:
        frame = frames.get(item.key)
        if frame is None or frame.empty:
            problems.append(f"{item.ref} ({item.key}): no published value measured (declared coverage "
                            f"{item.coverage})")
            continue
        finite = frame["measured"].astype(float).notna()
        for where in frame.loc[~finite, "where"]:
            problems.append(f"{item.ref} ({item.key}): {where}: the measured value is NaN")
        if int(finite.sum()) < item.coverage:
            problems.append(f"{item.ref} ({item.key}): {int(finite.sum())} of {len(item.published)} published values "
                            f"measured, below the declared coverage {item.coverage}")
        exercised |= set(frame.loc[finite, "_kind"])
    problems += [f"the judge's {kind} path: no measured value exercised it" for kind in KINDS if kind not in exercised]
    return problems


def rate_notes(frame: pd.DataFrame, record: dict | None = None) -> list[str]:
    """Beside a section's verdicts: per judge path it used, the path's error rates measured on known truth at the
    section's run count (`analysis.stats.verdicts.rate_line`), and the smallest difference its intervals could detect."""
    record = load_rates() if record is None else record
    lines = []
    for kind in KINDS:
        rows = frame[(frame["_kind"] == kind) & (frame["verdict"] != NOT_MEASURED)]
        if rows.empty:
            continue
        runs = int(rows["runs"].min())
        line = rate_line(kind, runs, record)
        if line:
            lines.append(line)
        seen = rows["detectable"].dropna()
        if not seen.empty:
            most = int(rows["runs"].max())
            lines.append(f"{kind}: with {runs if most == runs else f'{runs}-{most}'} runs the smallest difference "
                         "from the "
                         f"published value these intervals could detect (4 times in 5) is {seen.min():.3g}"
                         + (f" to {seen.max():.3g}" if seen.max() > seen.min() else "") + ".")
    return lines


def verdict_lines(comparisons: dict[str, pd.DataFrame], record: dict | None = None) -> list[str]:
    """For the terminal `orch report --paper`: per item with measured values, its verdict counts, each followed by
    the measured error rates of the judge's paths it used (:func:`rate_notes`) -- the HTML's verdicts in brief, with
    their rates where they are read."""
    record = load_rates() if record is None else record
    lines = []
    for key, frame in comparisons.items():
        if frame is None or frame.empty:
            continue
        counts = frame["verdict"].value_counts()
        lines.append(f"{key}: " + ", ".join(f"{count} {verdict}" for verdict, count in counts.items()))
        lines += [f"  {line}" for line in rate_notes(frame, record)]
    return lines


def figure(item: Item, frame: pd.DataFrame) -> Any:
    """Levels: measured (with its interval) against published, the diagonal where they agree. Directions: the
    measured difference with its interval per value, the published sign as a marker at +1 / 0 / -1 scaled to the
    axis."""
    import plotly.graph_objects as go

    fig = go.Figure()
    levels, directions = frame[frame["_kind"].isin(LEVEL_KINDS)], frame[~frame["_kind"].isin(LEVEL_KINDS)]
    if not levels.empty:
        low = float(np.nanmin([levels["_published"].min(), levels["_lo"].min()]))
        high = float(np.nanmax([levels["_published"].max(), levels["_hi"].max()]))
        fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", name="measured = published",
                                 line={"dash": "dot", "color": "#999"}))
        fig.add_trace(go.Scatter(
            x=levels["_published"], y=levels["measured"], mode="markers", name="levels",
            text=levels["where"] + ": " + levels["quantity"],
            error_y={"type": "data", "symmetric": False, "array": levels["_hi"] - levels["measured"],
                     "arrayminus": levels["measured"] - levels["_lo"]}))
        fig.update_layout(xaxis_title="published", yaxis_title="measured (mean, 95% interval)")
    if not directions.empty:
        labels = directions["where"] + " | " + directions["quantity"]
        fig.add_trace(go.Bar(
            x=labels, y=directions["measured"], name="measured difference",
            error_y={"type": "data", "symmetric": False, "array": directions["_hi"] - directions["measured"],
                     "arrayminus": directions["measured"] - directions["_lo"]}))
        scale = float(np.nanmax(np.abs(directions[["_lo", "_hi"]].to_numpy()))) if directions["_hi"].notna().any() else 1.0
        fig.add_trace(go.Scatter(x=labels, y=np.sign(directions["_published"]) * (scale or 1.0), mode="markers",
                                 name="published sign", marker={"symbol": "diamond", "size": 10}))
        if levels.empty:
            fig.update_layout(yaxis_title="measured difference (95% interval)")
    fig.update_layout(title=f"{item.ref}: published vs measured", height=420, margin={"t": 50})
    return fig


def paper_sections(data: RunData, summary: pd.DataFrame, items: list[Item], *, n_boot: int = 1000,
                   predictions: pd.DataFrame | None = None, frames: dict[str, Any] | None = None) -> list[Any]:
    """One `analysis.reports.sections.Section` per item: banner, claim, settings rule, the comparison table and figure, or
    one line when no finished cell measures it."""
    from analysis.reports.sections import Section

    ctx = build_context(data, summary, n_boot, predictions)
    banner = []
    generated = generated_data(ctx)
    if is_rehearsal(ctx):
        banner.append("REHEARSAL: these runs trained a code-built tiny model, not the paper's checkpoints; levels "
                      "are not comparable with the published numbers and directions are indicative only.")
    if generated:
        banner.append("GENERATED DATA: " + "; ".join(generated))
    sections = []
    for item in items:
        section = Section(f"The paper, {item.ref}: {item.title}")
        for line in banner:
            section.note(line)
        section.note(f"Claim: {item.claim}. Settings: {item.settings}.")
        frame = comparison(ctx, item)
        if frames is not None:
            frames[item.key] = frame
        if frame.empty:
            why = UNMEASURABLE[item.section](ctx, item) if item.section in UNMEASURABLE else None
            section.note(why or f"No finished cell of {', '.join(f'sweeps/{s}.yaml' for s in item.sweeps)} "
                         "measures this item yet.")
            sections.append(section)
            continue
        counts = frame["verdict"].value_counts()
        section.note(", ".join(f"{count} {verdict}" for verdict, count in counts.items())
                     + f" of {len(frame)} published values measured ({len(item.published)} in the paper).")
        section.table(frame[COLUMNS], digits=3)
        for line in rate_notes(frame):
            section.note(line)
        if (frame["verdict"] != INCONCLUSIVE).any() or frame["_lo"].notna().any():
            section.figure(figure(item, frame))
        if item.section in DETAILS:
            DETAILS[item.section](ctx, item, section)
        sections.append(section)
    return sections
