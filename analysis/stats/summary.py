"""One row per run: its experimental setting (task, variant, filter, seed, ...) and its key results.

The setting is read from the run's params (the flattened resolved config), falling back to its tags; the *variant*
is named by the smallest set of varied config keys that tells the runs apart once task, filter and seed are set
aside (keys that merely follow another, such as every ``algorithm.*`` key following ``algorithm.name``, are left
out). :func:`summarize` returns, one row per cell run:

    run_id, run_name, status, task, algorithm, model, seed (Int64), variant (str),
    filter (str label: 'none' or the filter's distinguishing settings), filtered (boolean; <NA> when unknown),
    rho (float: top_p value, 1.0 without a filter, NaN otherwise), prompts, samples (Int64), slip (float),
    peak_success, final_success (percent, 0-100; NaN without validation), peak_step (Int64),
    step_time (mean seconds per step), steps (last step logged, Int64),
    kept_groups, total_groups, kept_samples, kept_ratio (means over training),
    rv_chosen_min, rv_chosen_max (range over training of the kept groups' mean in-group reward std),
    cfg.<key> ... (the value of each config key that names the variant, e.g. cfg.algorithm.name)

Diagnostic values per run (for correlations and the Table 6/7 MI and entropy columns) come from
:func:`metric_summary`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analysis import names

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from analysis.stores.mlflow_store import RunData

MISSING_VALUES = ("", "None", "null")  # how an unset config value (None) arrives as a param string
SUMMARY_HOWS = ("mean", "final", "peak", "last")
TAIL = 3  # "final" of a diagnostic: mean of its last TAIL logged values
VARIANT_PREFIX = "cfg."  # summary columns holding the values of the variant's keys


def cell_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs that are sweep cells (tagged ``cell``); all runs when none is (plain ``orch train`` runs)."""
    column = f"tags.{names.TAG_CELL}"
    if column in runs.columns and runs[column].notna().any():
        return runs[runs[column].notna()].reset_index(drop=True)
    return runs.reset_index(drop=True)


def config_value(runs: pd.DataFrame, key: str, tag: str | None = None) -> pd.Series:
    """A config key per run as strings: ``params.<key>``, else the sweep engine's tag of the same name (it tags
    each cell with its varied keys; a group's option, e.g. ``task``, stands for ``task.name``), else ``tags.<tag>``.
    Unset values are NaN."""
    import numpy as np
    import pandas as pd

    candidates = [f"params.{key}", f"tags.{key}"]
    if key.endswith(".name"):
        candidates.append(f"tags.{key.removesuffix('.name')}")
    if tag:
        candidates.append(f"tags.{tag}")
    value = pd.Series(np.nan, index=runs.index, dtype=object)
    for column in candidates:
        if column in runs.columns:
            value = value.where(value.notna(), runs[column].astype(object))
    return value.where(~value.isin(MISSING_VALUES))


def _number(series: pd.Series, dtype: str = "float64") -> pd.Series:
    import pandas as pd

    numbers = pd.to_numeric(series, errors="coerce")
    return numbers.round().astype("Int64") if dtype == "Int64" else numbers.astype("float64")


def distinguishing_keys(config: pd.DataFrame, given: list[str], candidates: list[str]) -> list[str]:
    """Greedy smallest subset of ``candidates`` that, with the ``given`` columns, tells the rows apart as well as
    all candidates do: a key is kept only if it is not already determined by the keys chosen before it. Unset
    values (NaN, e.g. a cell that never started and logged no params) count as unknown, not as a value."""
    chosen: list[str] = []
    for key in candidates:
        if config[key].nunique() < 2:
            continue
        by = given + chosen
        if by and (config.groupby(by, dropna=False)[key].nunique() <= 1).all():
            continue
        chosen.append(key)
    return chosen


def _ordered(keys: list[str], priority: tuple[str, ...]) -> list[str]:
    return [k for k in priority if k in keys] + sorted(k for k in keys if k not in priority)


def _label(config: pd.DataFrame, keys: list[str], fallback: str) -> pd.Series:
    import pandas as pd

    if not keys:
        return pd.Series(fallback, index=config.index, dtype=object)
    return config[keys].fillna("-").astype(str).agg(", ".join, axis=1)


def _filter_columns(runs: pd.DataFrame) -> pd.DataFrame:
    """filter (label), filtered (boolean), rho (float) per run."""
    import numpy as np
    import pandas as pd

    strategy = config_value(runs, names.PARAM_FILTER_STRATEGY)
    option = config_value(runs, names.PARAM_FILTER_NAME)
    strategy = strategy.where(strategy.notna(), option.where(option == "none"))  # conf/filter/none.yaml
    value = _number(config_value(runs, names.PARAM_FILTER_VALUE))
    from recipes.stats.filtering import FilterConfig

    off = pd.Series([isinstance(name, str) and FilterConfig.model_construct(strategy=name, value=rho).is_off
                     for name, rho in zip(strategy, value, strict=True)], index=runs.index)
    filtered = pd.Series((~off).to_numpy(), index=runs.index, dtype="boolean").mask(strategy.isna())
    rho = pd.Series(np.where(strategy == "top_p", value, np.where(off, 1.0, np.nan)), index=runs.index)

    keys = [c.removeprefix("params.") for c in runs.columns if c.startswith(f"params.{names.FILTER_PREFIX}")]
    config = pd.DataFrame({k: config_value(runs, k) for k in keys}, index=runs.index)
    on = filtered.fillna(False).to_numpy(dtype=bool)
    ordered = _ordered([k for k in keys if k != names.PARAM_FILTER_NAME], (names.PARAM_FILTER_VALUE,))
    given = [names.PARAM_FILTER_NAME] if names.PARAM_FILTER_NAME in config else []
    chosen = distinguishing_keys(config[on], given, ordered)

    def describe(index: int) -> str:
        if pd.isna(filtered[index]):
            return "unknown" if pd.isna(option[index]) else str(option[index])
        if not filtered[index]:
            return "none"
        parts = [] if pd.isna(option[index]) else [str(option[index])]
        parts += [f"{k.removeprefix(names.FILTER_PREFIX)}={config.at[index, k]}" for k in chosen
                  if pd.notna(config.at[index, k])]
        return " ".join(parts) or "filter"

    label = pd.Series([describe(i) for i in runs.index], index=runs.index, dtype=object)
    return pd.DataFrame({"filter": label, "filtered": filtered, "rho": rho})


def _model(runs: pd.DataFrame) -> pd.Series:
    path = config_value(runs, names.PARAM_MODEL_PATH).map(
        lambda p: p.rstrip("/").rsplit("/", 1)[-1] if isinstance(p, str) else p
    )
    return path.where(path.notna(), config_value(runs, names.PARAM_MODEL, names.TAG_MODEL))


def settings(runs: pd.DataFrame) -> pd.DataFrame:
    """The setting columns of :func:`summarize` (run_id ... slip) for the cell runs of ``runs``."""
    import pandas as pd

    runs = cell_runs(runs)
    frame = pd.DataFrame(
        {
            "run_id": runs["run_id"],
            "run_name": runs["run_name"],
            "status": runs["status"],
            "task": config_value(runs, names.PARAM_TASK, names.TAG_TASK),
            "algorithm": config_value(runs, names.PARAM_ALGORITHM, names.TAG_ALGORITHM),
            "model": _model(runs),
            "seed": _number(config_value(runs, names.PARAM_SEED, names.TAG_SEED), "Int64"),
        }
    )
    frame["cell"] = runs[f"tags.{names.TAG_CELL}"] if f"tags.{names.TAG_CELL}" in runs.columns else None
    frame = pd.concat([frame, _filter_columns(runs)], axis=1)
    frame["prompts"] = _number(config_value(runs, names.PARAM_PROMPTS), "Int64")
    frame["samples"] = _number(config_value(runs, names.PARAM_SAMPLES), "Int64")
    frame["slip"] = _number(config_value(runs, names.PARAM_SLIP))

    keys = [c.removeprefix("params.") for c in runs.columns if c.startswith("params.")]
    skip = (names.PARAM_TASK, names.PARAM_SEED)
    candidates = [
        k for k in keys
        if k not in skip and not k.startswith(names.FILTER_PREFIX) and not names.is_infra_key(k)
    ]
    config = pd.DataFrame({k: config_value(runs, k) for k in [names.PARAM_TASK, *candidates]}, index=runs.index)
    chosen = distinguishing_keys(config, [names.PARAM_TASK], _ordered(candidates, names.VARIANT_KEY_PRIORITY))
    variant_config = config[chosen].copy()
    if names.PARAM_MODEL_PATH in chosen:
        variant_config[names.PARAM_MODEL_PATH] = frame["model"]
    frame["variant"] = _label(variant_config, chosen, "base")
    for key in chosen:
        frame[f"{VARIANT_PREFIX}{key}"] = variant_config[key]
    return frame


def variant_without(summary: pd.DataFrame, keys: tuple[str, ...]) -> pd.Series:
    """The variant label with some variant keys left out (e.g. the x-axis of a curve: ``task.env.slip``)."""
    kept = [c for c in summary.columns if c.startswith(VARIANT_PREFIX) and c.removeprefix(VARIANT_PREFIX) not in keys]
    return _label(summary[kept], kept, "base")


def metric_stats(data: RunData, key: str) -> pd.DataFrame:
    """Per run (index run_id): ``peak`` (max), ``peak_step``, ``last`` (value at the last step), ``final`` (mean
    of the last :data:`TAIL` values), ``mean``, ``min`` and ``n`` (logged steps) of metric ``key``."""
    import pandas as pd

    history = data.history(key).sort_values(["run_id", "step"], kind="stable")
    columns = ["peak", "peak_step", "last", "final", "mean", "min", "n"]
    if history.empty:
        return pd.DataFrame(columns=columns, index=pd.Index([], name="run_id"), dtype="float64")
    grouped = history.groupby("run_id", sort=False)["value"]
    peak_rows = history.loc[history["value"].fillna(-float("inf")).groupby(history["run_id"], sort=False).idxmax()]
    peak = grouped.max()
    stats = pd.DataFrame(
        {
            "peak": peak,
            "last": grouped.last(),
            "final": pd.Series(_tail_means(history), index=peak.index),  # the runs in the same order
            "mean": grouped.mean(),
            "min": grouped.min(),
            "n": grouped.count(),
        }
    )
    stats["peak_step"] = peak_rows.set_index("run_id")["step"].astype("Int64")
    return stats[columns]


def _tail_means(history: pd.DataFrame) -> np.ndarray:
    """Per run (``history`` sorted by run_id then step), the mean of its last :data:`TAIL` values, NaN left out:
    what ``Series.tail(TAIL).mean()`` of each run's values gives, the same sum in the same order (from 0.0, NaN as
    0) over the count, for every run at once (a report asks for it 36 times over 264 runs: seconds, issue 60)."""
    import numpy as np

    values = history["value"].to_numpy(dtype=np.float64)
    runs = history["run_id"].to_numpy(dtype=object)
    ends = np.r_[np.flatnonzero(runs[1:] != runs[:-1]) + 1, runs.size]  # each run's rows are contiguous
    starts = np.r_[0, ends[:-1]]
    total, count = np.zeros(ends.size), np.zeros(ends.size)
    for back in range(min(TAIL, runs.size), 0, -1):  # the tail's oldest value first, as the sum reads it
        at = ends - back
        value = values[np.maximum(at, 0)]
        used = (at >= starts) & ~np.isnan(value)
        total += np.where(used, value, 0.0)
        count += used
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def metric_summary(data: RunData, keys: list[str] | tuple[str, ...], how: str = "mean") -> pd.DataFrame:
    """A run x metric frame (index run_id): each metric's ``how`` (mean | final | peak | last) per run; metrics that
    no run logged are left out."""
    import pandas as pd

    from orchlib.errors import choices_error

    if how not in SUMMARY_HOWS:
        raise choices_error("summary statistic", how, SUMMARY_HOWS)
    columns = {key: metric_stats(data, key)[how] for key in keys}
    columns = {key: values for key, values in columns.items() if not values.empty}
    return pd.DataFrame(columns).rename_axis("run_id")


def summarize(data: RunData) -> pd.DataFrame:
    """The per-run frame of the module docstring, for the cell runs of ``data``."""
    frame = settings(data.runs).set_index("run_id")
    success = metric_stats(data, names.VAL_SUCCESS)
    frame["peak_success"] = success["peak"] * 100.0
    frame["final_success"] = success["last"] * 100.0
    frame["peak_step"] = success["peak_step"].astype("Int64")
    frame["step_time"] = metric_stats(data, names.STEP_TIME)["mean"]
    steps = data.metrics.groupby("run_id")["step"].max()
    frame["steps"] = steps.reindex(frame.index).astype("Int64")
    for column, key in (
        ("kept_groups", names.KEPT_GROUPS),
        ("total_groups", names.TOTAL_GROUPS),
        ("kept_samples", names.KEPT_SAMPLES),
        ("kept_ratio", names.KEPT_RATIO),
    ):
        frame[column] = metric_stats(data, key)["mean"]
    chosen = metric_stats(data, names.RV_CHOSEN_STD_MEAN)
    frame["rv_chosen_min"], frame["rv_chosen_max"] = chosen["min"], chosen["peak"]
    return frame.reset_index()


def use_reevaluation(summary: pd.DataFrame, evaluations: RunData | None) -> tuple[pd.DataFrame, str | None]:
    """``summary`` with the peak success of every run whose best checkpoint was re-evaluated (`orch eval --sweep S
    --best`: the finished runs of sweep ``S.eval``, each tagged with the cell it evaluates) replaced by that
    evaluation's success, ``peak_step`` by the checkpoint's step and ``peak_source`` saying which; and a note for
    the report (None when nothing was re-evaluated). The training-time maximum stays as ``validation_peak``."""
    import pandas as pd

    summary = summary.copy()
    summary["validation_peak"] = summary["peak_success"]
    summary["peak_source"] = "validation"
    column = f"tags.{names.TAG_EVAL_SOURCE_CELL}"
    if evaluations is None or evaluations.runs.empty or column not in evaluations.runs.columns:
        return summary, None
    runs = evaluations.runs[evaluations.runs["status"] == "FINISHED"].set_index("run_id")
    success = metric_stats(evaluations, names.EVAL_SUCCESS)["last"].reindex(runs.index)
    episodes = config_value(runs.reset_index(), names.PARAM_EVAL_EPISODES).to_numpy()
    found = pd.DataFrame({"cell": runs[column], "success": success * 100.0, "step": runs.get(f"tags.{names.TAG_EVAL_STEP}"),
                          "episodes": episodes}, index=runs.index).dropna(subset=["cell", "success"])
    found = found.drop_duplicates("cell", keep="last").set_index("cell")
    hit = summary["cell"].isin(found.index)
    if not hit.any():
        return summary, None
    cells = summary.loc[hit, "cell"]
    summary.loc[hit, "peak_success"] = cells.map(found["success"]).to_numpy()
    summary.loc[hit, "peak_step"] = pd.array(pd.to_numeric(cells.map(found["step"])).to_numpy(), dtype="Int64")
    summary.loc[hit, "peak_source"] = [f"best checkpoint (step {found.at[c, 'step']}) re-evaluated on "
                                       f"{found.at[c, 'episodes']} episodes" for c in cells]
    episodes = ", ".join(sorted({str(e) for e in found.loc[cells, "episodes"]}))
    note = (f"Peak success of {int(hit.sum())} of {len(summary)} runs is the re-evaluation of each run's best "
            f"checkpoint on {episodes} validation episodes (`orch eval --sweep ... --best`; step per run in the "
            "runs table), not the maximum of its training-time validation.")
    return summary, note
