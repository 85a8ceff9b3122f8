"""The paper's tables (RAGEN-2 (arXiv 2604.06268)) from per-run summaries, seeds aggregated as mean ± std.

Every builder takes the frame of :func:`analysis.stats.summary.summarize` (or any frame with the columns it names) and
returns a long frame; :func:`format_table4` turns Table 4 into the paper's layout. Aggregates over seeds use the
sample standard deviation (NaN with one seed). Success values are percentages, as in the paper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis import names
from analysis.stats.summary import variant_without

if TYPE_CHECKING:
    import pandas as pd

AVERAGE = "avg"


def _agg(frame: pd.DataFrame, by: list[str], value: str, prefix: str) -> pd.DataFrame:
    """mean, std, n of ``value`` per group, columns ``<prefix>_mean``, ``<prefix>_std``, ``<prefix>_n``."""
    grouped = frame.groupby(by, dropna=False, sort=True)[value]
    out = grouped.agg(["mean", "std", "count"])
    out.columns = [f"{prefix}_mean", f"{prefix}_std", f"{prefix}_n"]
    return out


def _pair(summary: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Baseline (filtered == False) and filtered aggregates of ``value`` side by side.

    Groups are ``by`` + filter setting; each filter setting used within a ``by[:-1]`` group is paired with the
    baseline of every ``by`` group under it. Columns ``by``, filter, base_mean, base_std, base_n, filt_mean,
    filt_std, filt_n, delta (filt_mean - base_mean); a side without runs has n = 0 and NaN statistics.
    """
    import pandas as pd

    known = summary[summary["filtered"].notna()]
    is_on = known["filtered"].astype(bool)
    base = _agg(known[~is_on], by, value, "base").reset_index()
    filt = _agg(known[is_on], [*by, "filter"], value, "filt").reset_index()
    outer = by[:-1]
    used = filt[[*outer, "filter"]].drop_duplicates()
    if used.empty:
        base = base.assign(filter=pd.Series([None] * len(base), index=base.index, dtype=object))
    else:
        base = base.merge(used, on=outer, how="left") if outer else base.merge(used, how="cross")
    paired = base.merge(filt, on=[*by, "filter"], how="outer")
    paired[["base_n", "filt_n"]] = paired[["base_n", "filt_n"]].fillna(0).astype(int)
    paired["delta"] = paired["filt_mean"] - paired["base_mean"]
    columns = [*by, "filter", "base_mean", "base_std", "base_n", "filt_mean", "filt_std", "filt_n", "delta"]
    return pd.DataFrame(paired, columns=columns).sort_values([*by, "filter"], kind="stable").reset_index(drop=True)


def table4(summary: pd.DataFrame, value: str = "peak_success") -> pd.DataFrame:
    """Table 4: baseline success and filter delta per variant x task, with per-variant averages.

    Needs columns variant, task, filter, filtered, and ``value``. Returns columns variant, filter, task (a task name
    or ``avg``), base_mean, base_std, base_n, filt_mean, filt_std, filt_n, delta. A variant with no filtered run has
    filter NaN and no delta. The ``avg`` row averages the per-task means over the tasks that have them (base_mean
    over tasks with a baseline, filt_mean and delta over tasks with a filtered run), as the paper's avg column.
    """
    import pandas as pd

    long = _pair(summary, ["variant", "task"], value)
    averages = (
        long.groupby(["variant", "filter"], dropna=False, sort=True)
        .agg(base_mean=("base_mean", "mean"), filt_mean=("filt_mean", "mean"), delta=("delta", "mean"))
        .reset_index()
        .assign(task=AVERAGE)
    )
    out = pd.concat([long, averages], ignore_index=True)
    out["_avg"] = out["task"] == AVERAGE
    out = out.sort_values(["variant", "filter", "_avg", "task"], kind="stable").drop(columns="_avg")
    return out[list(long.columns)].astype({"base_n": "Int64", "filt_n": "Int64"}).reset_index(drop=True)


def format_mean_std(mean: float, std: float, digits: int = 1) -> str:
    """``mean ± std`` (just the mean when std is undefined; an en dash when there is no mean)."""
    if pd_isna(mean):
        return "–"
    return f"{mean:.{digits}f}" if pd_isna(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def pd_isna(value: object) -> bool:
    """NaN / None / NA test for scalars."""
    import pandas as pd

    return bool(pd.isna(value))


def format_table4(long: pd.DataFrame) -> pd.DataFrame:
    """The paper's layout: one row per variant (and filter setting when several), one column per task then avg,
    cells ``baseline mean ± std (filter delta)``."""

    def cell(row: pd.Series) -> str:
        text = format_mean_std(row["base_mean"], row["base_std"])
        return text if pd_isna(row["delta"]) else f"{text} ({row['delta']:+.1f})"

    shown = long.assign(cell=long.apply(cell, axis=1))
    several = long["filter"].dropna().nunique() > 1
    shown["row"] = shown["variant"] + (" [" + shown["filter"].fillna("no filter run") + "]" if several else "")
    tasks = [t for t in dict.fromkeys(long["task"]) if t != AVERAGE] + [AVERAGE]
    wide = shown.pivot(index="row", columns="task", values="cell").reindex(columns=tasks).fillna("–")
    order = list(dict.fromkeys(shown["row"]))
    return wide.reindex(order).rename_axis(index="variant", columns=None)


def table5(summary: pd.DataFrame, value: str = "peak_success") -> pd.DataFrame:
    """Table 5: success and mean step time without / with the filter per rollout budget (prompts x samples).

    Columns task, variant (other varied keys), prompts, samples, budget ("64×2"), filter, base_mean, base_std,
    base_n, filt_mean, filt_std, filt_n, delta (success), time_base, time_filt (mean s/step), time_change_pct.
    """
    frame = summary.dropna(subset=["prompts", "samples"])
    frame = frame.assign(variant=variant_without(frame, (names.PARAM_PROMPTS, names.PARAM_SAMPLES)))
    by = ["task", "variant", "prompts", "samples"]
    success = _pair(frame, by, value)
    time = _pair(frame, by, "step_time")[[*by, "filter", "base_mean", "filt_mean"]]
    time = time.rename(columns={"base_mean": "time_base", "filt_mean": "time_filt"})
    out = success.merge(time, on=[*by, "filter"], how="left")
    out["time_change_pct"] = (out["time_filt"] / out["time_base"] - 1.0) * 100.0
    out.insert(4, "budget", out["prompts"].astype(str) + "×" + out["samples"].astype(str))
    return out


def per_setting(summary: pd.DataFrame, values: list[str]) -> pd.DataFrame:
    """Mean, std and n (runs with a value) of each column of ``values`` per (task, variant, filter) setting:
    columns task, variant, filter, then ``<value>_mean``, ``<value>_std``, ``<value>_n``. Missing columns are
    skipped."""
    import pandas as pd

    by = ["task", "variant", "filter"]
    present = [v for v in values if v in summary.columns]
    if not present:
        return pd.DataFrame(columns=by)
    return pd.concat([_agg(summary, by, v, v) for v in present], axis=1).reset_index()


def table6(summary: pd.DataFrame, mi: str = names.MI_EST, entropy: str = names.ENTROPY) -> pd.DataFrame:
    """Table 6 (train on one RV quartile): per setting, the kept groups' RV range over training, peak success and
    the end-of-training MI and entropy (``mi`` / ``entropy`` columns joined onto the summary beforehand)."""
    return per_setting(summary, ["rv_chosen_min", "rv_chosen_max", "peak_success", mi, entropy])


def table7(summary: pd.DataFrame, mi: str = names.MI_EST) -> pd.DataFrame:
    """Table 7 (prompt- vs trajectory-level filtering): per setting, prompts kept of all per update, trajectories
    per update, peak success and end-of-training MI."""
    return per_setting(summary, ["kept_groups", "total_groups", "kept_samples", "peak_success", mi])


def rho_curve(summary: pd.DataFrame, value: str = "peak_success") -> pd.DataFrame:
    """Success against the top-p ρ (no filter counts as ρ = 1.0): columns task, variant, rho, mean, std, n."""
    frame = summary[summary["rho"].notna()]
    out = _agg(frame, ["task", "variant", "rho"], value, "s").reset_index()
    return out.rename(columns={"s_mean": "mean", "s_std": "std", "s_n": "n"})


def slip_curve(summary: pd.DataFrame, value: str = "peak_success") -> pd.DataFrame:
    """Success without / with the filter against the FrozenLake slip rate: columns task, variant (other varied
    keys), slip, filter, base_mean, base_std, base_n, filt_mean, filt_std, filt_n, delta."""
    frame = summary[summary["slip"].notna()]
    frame = frame.assign(variant=variant_without(frame, (names.PARAM_SLIP,)))
    return _pair(frame, ["task", "variant", "slip"], value)


def missing_pairs(table: pd.DataFrame) -> list[str]:
    """Human-readable notes for table rows that lack a baseline or a filtered run (from a Table 4/5 frame)."""
    notes = []
    rows = table[table["task"] != AVERAGE] if "task" in table.columns else table
    for _, row in rows.iterrows():
        where = ", ".join(str(row[c]) for c in ("variant", "task", "budget") if c in row and not pd_isna(row[c]))
        if row["base_n"] == 0:
            notes.append(f"{where}: no baseline (no-filter) run with results")
        if row["filt_n"] == 0:
            notes.append(f"{where}: no filtered run with results" + ("" if pd_isna(row["filter"]) else f" ({row['filter']})"))
    return notes


def task_verdicts(summary: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """The Std(RV)/Mean(RV) predictor per variant x task: its ratio on each baseline run's earliest dumped rollout
    batch, aggregated over those runs, and the verdict of the mean ratio at the default thresholds (the one
    verdict Table 8, the report's first screen and the predictor's hit rate read).

    ``predictions``: :func:`analysis.stats.predictor.predictions`. Returns columns variant, task, ratio_mean,
    ratio_std, ratio_n (runs with a defined ratio), batches (baseline runs with a batch), verdict.
    """
    from analysis.stats.predictor import PredictorThresholds, verdict_for

    earliest = predictions.sort_values("step").drop_duplicates("run_id")
    baseline = summary[summary["filtered"].eq(False).fillna(False)][["run_id", "variant", "task"]]
    first = baseline.merge(earliest, on="run_id")
    ratios = _agg(first, ["variant", "task"], "ratio", "ratio")
    ratios["batches"] = first.groupby(["variant", "task"], dropna=False, sort=True).size()
    ratios = ratios.reset_index()
    thresholds = PredictorThresholds()
    ratios["verdict"] = [
        verdict_for(None if pd_isna(r) else float(r), thresholds)[0] for r in ratios["ratio_mean"]
    ]
    return ratios


def table8(summary: pd.DataFrame, predictions: pd.DataFrame, table4_long: pd.DataFrame) -> pd.DataFrame:
    """Table 8: the Std(RV)/Mean(RV) predictor on the baseline runs' earliest dumped rollout batch
    (:func:`task_verdicts`), beside the realised filter gain (the Table 4 delta of the same variant and task).

    ``predictions``: :func:`analysis.stats.predictor.predictions`. Returns columns variant, task, filter,
    ratio_mean, ratio_std, ratio_n, verdict (of the mean ratio, default thresholds), gain, agrees (True when
    'likely helps' meets gain > 0 or 'unlikely to help' meets gain <= 0; NA when uncertain or unknown).
    """
    import pandas as pd

    from analysis.stats.predictor import VERDICT_HELPS, VERDICT_UNCERTAIN

    ratios = task_verdicts(summary, predictions)
    gains = table4_long[table4_long["task"] != AVERAGE][["variant", "task", "filter", "delta"]]
    out = ratios.merge(gains.rename(columns={"delta": "gain"}), on=["variant", "task"], how="left")

    def agrees(row: pd.Series) -> object:
        if pd_isna(row["gain"]) or row["verdict"] == VERDICT_UNCERTAIN:
            return pd.NA
        return (row["verdict"] == VERDICT_HELPS) == (row["gain"] > 0)

    out["agrees"] = pd.array([agrees(row) for _, row in out.iterrows()], dtype="boolean")
    columns = ["variant", "task", "filter", "ratio_mean", "ratio_std", "ratio_n", "verdict", "gain", "agrees"]
    return out[columns]
