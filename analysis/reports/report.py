"""`orch report SWEEP`: every analysis of a sweep as one self-contained, offline HTML file.

:func:`build_report` loads the sweep's runs (bulk reader), runs the analyses -- run summaries, the paper's tables,
correlations, early-warning leads, the predictor on the dumped rollout batches -- and collects them as
:class:`Section` s of HTML tables and plotly figures. :func:`render_html` writes one page with plotly.js embedded
(no network access needed to view it); a script at the top lists any JavaScript error in a red banner, so a broken
figure never fails silently. :func:`export_figures` writes the figures as PNG or PDF files through kaleido.

Parts that need data the sweep lacks (no filtered runs, a single ρ, no rollout batches, no MI diagnostics) are left
out with a note saying why; failed, unfinished and result-less cells are listed at the top.
"""

from __future__ import annotations

import html
import importlib.util
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis import names
from analysis.reports.sections import Section, html_table  # noqa: F401  (html_table: part of this module's interface)
from analysis.stores.archive import READER as ARCHIVE_READER
from analysis.stores.archive import read_archives, write_archive
from analysis.stores.mlflow_store import Progress
from orchlib.errors import OrchError

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    import pandas as pd
    import plotly.graph_objects as go

    from analysis.stats.science import Readings, Science
    from analysis.stores.mlflow_store import RunData

FORMATS = ("html", "png", "pdf")
SCATTER_DIAGNOSTICS = (names.MI_ZSCORE_EMA, names.ENTROPY)  # the paper's MI-vs-entropy comparison


@dataclass
class Report:
    """A built report: what was read, the notes on missing data, and the sections."""

    sweep: str
    tracking_uri: str
    generated: str
    notes: list[str]
    sections: list[Section]
    science: Science | None = None  # the tiny-scale reproduction's verdicts (reason set when not testable)
    gaps: list[str] = field(default_factory=list)  # `orch report --paper`: metrics a map item needs, missing in a run
    comparisons: dict[str, Any] = field(default_factory=dict)  # `orch report --paper`: item key -> comparison frame
    held: str = ""  # what was read: how many of the sweep's cells the store or archives hold, by status
    headlines: list[tuple[str, list[str]]] = field(default_factory=list)  # the answers' questions and headline lines

    def figures(self) -> list[go.Figure]:
        return [block for section in self.sections for block in section.blocks if not isinstance(block, str)]


def _mean_std(frame: pd.DataFrame, prefix: str) -> pd.Series:
    """'mean ± std' strings from ``<prefix>_mean`` / ``<prefix>_std`` columns."""
    from analysis.reports.tables import format_mean_std

    return frame.apply(lambda row: format_mean_std(row[f"{prefix}_mean"], row[f"{prefix}_std"]), axis=1)


def cell_notes(summary: pd.DataFrame, store: pd.DataFrame | None = None) -> list[str]:
    """One line per cell that failed, has not finished, or finished without validation results.

    With the orch store's cells (``store``: :func:`analysis.stores.sweep_state.store_cells`), cells that are not done
    are described by the store (state and reason, including cells without an MLflow run) and the MLflow runs of
    those cells are not described again.
    """
    import pandas as pd

    from analysis.stores.sweep_state import store_notes

    notes = []
    if store is not None:
        notes = store_notes(store)
        undone = store.loc[~store["done"].astype(bool), "mlflow_run_id"].dropna()
        summary = summary[~summary["run_id"].isin(undone)]
    for _, row in summary.iterrows():
        where = f"{row['run_name']} ({row['task']}, {row['variant']}, filter {row['filter']}, seed {row['seed']})"
        if row["status"] in ("FAILED", "KILLED"):
            notes.append(f"{where}: {row['status'].lower()}")
        elif row["status"] in ("RUNNING", "SCHEDULED"):
            notes.append(f"{where}: {row['status'].lower()}, not finished")
        elif pd.isna(row["peak_success"]):
            notes.append(f"{where}: finished without validation results ({names.VAL_SUCCESS})")
    return notes


def _overview(data: RunData, summary: pd.DataFrame, store: pd.DataFrame | None, notes: list[str]) -> Section:
    import pandas as pd

    section = Section("Sweep overview")
    now = pd.Timestamp.now(tz="UTC")
    cells = data.runs[data.runs["run_id"].isin(summary["run_id"])]
    wall = ((cells["end_time"].fillna(now) - cells["start_time"]).dt.total_seconds().clip(lower=0)).sum() / 3600
    counts = summary["status"].value_counts().rename_axis("status").reset_index(name="cells")
    step_time = summary["step_time"].mean()
    facts = pd.DataFrame(
        {
            "": ["cells", "cells with validation results", "tasks", "variants", "filter settings",
                 "run wall-clock hours (sum)", "training steps logged (sum)", "mean step time (s)"],
            "value": [
                str(len(summary)), str(int(summary["peak_success"].notna().sum())), str(summary["task"].nunique()),
                str(summary["variant"].nunique()), str(summary["filter"].nunique()), f"{wall:.2f}",
                str(int(summary["steps"].fillna(0).sum())), "–" if pd.isna(step_time) else f"{step_time:.3f}",
            ],
        }
    )
    section.table(facts, digits=3)
    section.table(counts, caption="cells by MLflow run status")
    if store is not None:
        states = store["state"].value_counts().rename_axis("state").reset_index(name="cells")
        section.table(states, caption=f"cells by orch state (state store: {len(store)} cells)")
    else:
        section.note("no orch state store knows this sweep here: cell states come from MLflow alone")
    if notes:
        section.blocks.append(
            '<div class="missing"><h4>Missing or incomplete</h4><ul>'
            + "".join(f"<li>{html.escape(n)}</li>" for n in notes)
            + "</ul></div>"
        )
    return section


def _cells(summary: pd.DataFrame) -> Section:
    section = Section("Cells")
    columns = ["run_name", "task", "variant", "filter", "seed", "status", "steps", "peak_success", "peak_step",
               "final_success", "step_time", "kept_ratio"]
    if "peak_source" in summary and (summary["peak_source"] != "validation").any():  # some were re-evaluated
        columns[8:8] = ["peak_source", "validation_peak"]
    section.table(summary[columns].sort_values(["task", "variant", "filter", "seed"]), digits=2)
    return section


def _paper_tables(summary: pd.DataFrame, finals: pd.DataFrame, notes: list[str]) -> tuple[Section, pd.DataFrame]:
    """Tables 4-7 and the ρ / slip curves, where the sweep has the runs for them (``finals``: end-of-training
    MI and entropy per run, for Tables 6 and 7)."""
    from analysis.reports import figures, tables

    section = Section("The paper's tables")
    has_pairs = summary["filtered"].eq(True).any() and summary["filtered"].eq(False).any()
    t4 = tables.table4(summary)
    if has_pairs:
        section.table(tables.format_table4(t4), "Table 4 — peak validation success %, baseline mean ± std over seeds "
                      "(filter delta)", index=True)
        notes.extend(tables.missing_pairs(t4))
    else:
        section.note("Table 4 and Table 5 need runs both without and with the filter; this sweep has only one kind.")
    budgets = summary[["prompts", "samples"]].dropna().drop_duplicates()
    if has_pairs and len(budgets) > 1:
        t5 = tables.table5(summary)
        shown = t5[["task", "variant", "budget", "filter"]].assign(
            success_no_filter=_mean_std(t5, "base"), success_filter=_mean_std(t5, "filt"),
            step_time_no_filter=t5["time_base"], step_time_filter=t5["time_filt"], time_change_pct=t5["time_change_pct"],
        )
        section.table(shown, "Table 5 — fixed rollout budget: success % and mean step time (s)")
    if summary["filter"].nunique() > 2:
        with_finals = summary.merge(finals, on="run_id", how="left")
        t6 = tables.table6(with_finals)
        section.table(t6, "Table 6 view — per filter setting: kept groups' RV range, success %, final MI and entropy")
        t7 = tables.table7(with_finals)
        section.table(t7, "Table 7 view — per filter setting: prompts kept / all, trajectories per update, success %, "
                      "final MI")
    rho = tables.rho_curve(summary)
    if summary.loc[summary["filtered"].eq(True).fillna(False), "rho"].nunique() > 1:
        section.table(rho, "ρ sweep — success % per ρ (ρ = 1: no filter)")
        section.figure(figures.rho_figure(rho))
    if summary["slip"].nunique() > 1:
        slip = tables.slip_curve(summary)
        section.table(slip, "slip sweep — success % without / with the filter")
        section.figure(figures.slip_figure(slip))
    return section, t4


def _curves(data: RunData, summary: pd.DataFrame) -> Section:
    from analysis.reports import figures

    section = Section("Training curves")
    logged = set(data.metrics["key"].unique())
    for key in names.CURVES:
        if key in logged:
            section.figure(figures.training_curves(data, summary, key))
    missing = [key for key in names.CURVES if key not in logged]
    if missing:
        section.note(f"not logged by any run: {', '.join(missing)}")
    return section


def _correlations(data: RunData, summary: pd.DataFrame, n_boot: int) -> Section:
    from analysis.reports import figures
    from analysis.stats import correlations
    from analysis.stats.summary import metric_summary

    section = Section("Diagnostics vs task performance")
    diagnostics = metric_summary(data, list(names.DIAGNOSTIC_FAMILIES), "mean")
    if diagnostics.empty:
        section.note("no run logged any diagnostic (MI proxies, entropy, reward, response length)")
        return section
    table = correlations.diagnostic_correlations(diagnostics, summary, n_boot=n_boot)
    section.table(table, f"Correlation across runs of each diagnostic (mean over training) with success; 95% "
                  f"bootstrap CIs ({n_boot} resamples)", digits=3)
    joined = summary.merge(diagnostics.reset_index(), on="run_id")
    for diagnostic in SCATTER_DIAGNOSTICS:
        if diagnostic in diagnostics.columns:
            row = table[(table["diagnostic"] == diagnostic) & (table["target"] == "peak_success")]
            stats = row.iloc[0].to_dict() if len(row) else None
            section.figure(figures.diagnostic_scatter(joined, diagnostic, "peak_success", stats))
    proxies = correlations.rv_proxy_correlations(data, n_boot=n_boot)
    if not proxies.empty:
        section.table(proxies, f"Reward variance ({names.RV_STD_MEAN}) vs candidate proxies over (run, step); CIs "
                      "resample runs", digits=3)
    return section


def _early_warning(data: RunData, summary: pd.DataFrame) -> Section:
    from analysis.stats import collapse_alert_calibration
    from analysis.stats.controls import control_lines
    from analysis.stats.early_warning import early_warning

    section = Section("Early warning: did MI fall before success?")
    for line in control_lines(summary["task"].dropna().unique()):  # has the instrument been seen to move here?
        section.note(line)
    for line in collapse_alert_calibration.alert_lines(collapse_alert_calibration.rules_used(data)):  # the alert's error rates
        section.note(line)
    cells = collapse_alert_calibration.cells_from(data, "")
    if any(cell.planted for cell in cells):  # planted controls: the alert's ROC over this sweep's own runs
        section.table(collapse_alert_calibration.roc_frame(cells),
                      "The collapse alert's ROC on this sweep's runs (analysis.stats.collapse_alert_calibration): candidate rules no "
                      "other beats on both false alarms (honest runs without an MI-independent collapse) and "
                      f"detections (planted runs, fired within {collapse_alert_calibration.DETECTION_WINDOW} steps of the plant)")
    leads = early_warning(data)
    if leads.empty:
        section.note(f"no run logged {names.MI_ZSCORE_EMA} or {names.VAL_SUCCESS}")
        return section
    leads = summary[["run_id", "run_name", "task", "variant", "filter", "seed"]].merge(leads, on="run_id")
    counts = leads["outcome"].value_counts()
    lead = leads["lead_steps"].dropna()
    text = ", ".join(f"{outcome}: {count}" for outcome, count in counts.items())
    if len(lead):
        text += f"; median lead {float(lead.median()):.0f} steps over {len(lead)} runs where both declined"
    section.note(text)
    section.table(leads.drop(columns="run_id"))
    return section


def _artifact_uris(data: RunData) -> dict[str, str]:
    """run_id -> its artifact URI, as the runs frame read it (none from an archive)."""
    if "artifact_uri" not in data.runs:
        return {}
    return {run: uri for run, uri in zip(data.runs["run_id"], data.runs["artifact_uri"], strict=True)
            if isinstance(uri, str)}


def _first_batches(
    data: RunData, summary: pd.DataFrame, progress: Progress | None, which: str = "first"
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame, list[str]]:
    """The first dumped rollout batch (``which``: or e.g. ``first:3``, the first three) of every baseline run with
    results (lowest seed first), the predictor on each (:func:`analysis.stats.predictor.predictions`) and the
    notes on batches it refused."""
    from analysis.stats.predictor import predictions as predict_batches
    from analysis.stores import rollout_artifacts

    with_results = summary[summary["peak_success"].notna()]
    baseline = with_results[with_results["filtered"].eq(False).fillna(False)].sort_values(["task", "variant", "seed"])
    first = rollout_artifacts.load_batches(data.tracking_uri, list(baseline["run_id"]), which=which,
                                           progress=progress, artifact_uris=_artifact_uris(data))
    predictions, notes = predict_batches(first)
    return first, predictions, notes


def _predictor(
    data: RunData, summary: pd.DataFrame, t4: pd.DataFrame, first: Collection[str], predictions: pd.DataFrame,
    progress: Progress | None,
) -> Section:
    """Table 8 from the baseline runs' first dumped batch (``first``: the runs that have one); RV histograms from
    every dumped batch of one baseline run per task (the runs with results, lowest seed first)."""
    from analysis.reports import figures, tables
    from analysis.stats.predictor_record import hit_rate_line
    from analysis.stores import rollout_artifacts

    section = Section("Will filtering help? The Std(RV)/Mean(RV) predictor")
    if not first:
        section.note(f"no baseline run has rollout batches ({names.ROLLOUT_DIR}/step_NNNN.parquet artifacts)")
        return section
    if not predictions.empty:
        t8 = tables.table8(summary, predictions, t4)
        section.table(t8, "Table 8 — predictor on each baseline run's first dumped batch vs realised filter gain")
        section.note(hit_rate_line())  # how often the verdict has been right on orch's own runs
        if t8["gain"].notna().any():
            section.figure(figures.predictor_figure(t8))
        from analysis.stats.predictor_record import load_record

        if (record := load_record()).get("rows"):  # the calibration over every archived sweep, held out
            section.figure(figures.calibration_figure(record))
    if data.reader == ARCHIVE_READER:
        section.note("RV histograms need the runs' rollout batches, which an archive does not keep "
                     "(report from the tracking store for them)")
        return section
    baseline = summary[summary["run_id"].isin(first)].sort_values(["task", "variant", "seed"])
    picked = baseline.drop_duplicates("task")
    every = rollout_artifacts.load_batches(data.tracking_uri, list(picked["run_id"]), which="all", progress=progress,
                                           artifact_uris=_artifact_uris(data))
    rv = rollout_artifacts.prompt_rv(every)
    if not rv.empty:
        labels = {row.run_id: f"{row.task} · {row.variant} · {row.filter} · seed {row.seed}" for row in picked.itertuples()}
        section.figure(figures.rv_histograms(rv, labels))
    return section


def held_line(sweep: str, summary: pd.DataFrame, store: pd.DataFrame | None, archives: Sequence[Path] = (),
              tracking_uri: str = "") -> str:
    """How many of the sweep's cells were read, and from where, by MLflow status; with the orch store's cells, how
    many it knows and in which states: `repro_long: 19 cells read from 1 archive (DIR): 19 finished`."""
    from orchlib.errors import hide_password

    def counted(counts: pd.Series) -> str:
        return ", ".join(f"{count} {str(name).lower()}" for name, count in counts.items())

    where = (f"{len(archives)} archive{'s' if len(archives) != 1 else ''} ({', '.join(map(str, archives))})"
             if archives else f"the tracking store {hide_password(tracking_uri)}")
    line = f"{sweep}: {len(summary)} cell{'s' if len(summary) != 1 else ''} read from {where}"
    line += f": {counted(summary['status'].value_counts())}" if len(summary) else ""
    if store is not None:
        line += f"; the orch store knows {len(store)} cells: {counted(store['state'].value_counts())}"
    elif not archives:
        line += "; no orch store knows this sweep here (--store)"
    return line


def _answers(data: RunData, summary: pd.DataFrame, effects: pd.DataFrame, predictions: pd.DataFrame | None,
             trends: Readings | None = None) -> tuple[Section, list[Any]]:
    """The first screen: the user's three questions (analysis/reports/answers.py), each in words with one figure
    (``trends``: the post-hoc trend readings when the findings already computed them for every scope); and the
    answers themselves."""
    from analysis.reports.answers import answers

    section = Section("The answers: did filtering help, did MI collapse, what did the predictor say?")
    said = answers(data, summary, effects, predictions, trends)
    for answer in said:
        section.blocks.append(
            f"<h3>{html.escape(answer.question)}</h3>"
            + "".join(f'<p class="answer">{html.escape(line)}</p>' for line in answer.words)
        )
        if answer.figure is not None:
            section.figure(answer.figure)
    return section, said


def _science(result: Science) -> Section:
    """The tiny-scale reproduction (analysis/stats/science.py): every finding's verdict by its pre-declared rule."""
    from analysis.reports import figures
    from analysis.stats import science

    section = Section("Does the paper's story hold here? Findings over seeds")
    section.note(
        f"Verdicts follow rules declared before the runs (docs/science.md): 95% bootstrap intervals over seeds "
        f"({science.N_BOOT} resamples), at least {science.MIN_SEEDS} seeds where a rule needs them; a finding that "
        "does not reproduce is a result."
    )
    counts = result.frame()["verdict"].value_counts()
    section.note(", ".join(f"{verdict}: {counts.get(verdict, 0)}" for verdict in
                           (science.REPRODUCED, science.NOT_REPRODUCED, science.INCONCLUSIVE)))
    section.table(result.frame())
    for gap in result.untested:
        section.note(f"Not tested yet: {gap}.")
    for line in science.trend_lines(result.trends):  # the post-hoc reading beside the verdicts, labelled so
        section.note(line)
    if result.effects is not None and not result.effects.dropna(subset=["delta"]).empty:
        section.figure(figures.effect_intervals(result.effects))
    return section


def _study(study: Any) -> Section:
    """`orch tune`'s study of the sweep (an `optuna.Study`): Optuna's own plotly figures (optimisation history,
    parameter importances, parallel coordinates, slice), the trials, and the best trial as a ready `--set` line."""
    import optuna.visualization as vis
    import pandas as pd

    section = Section("Study (orch tune)")
    trials = study.get_trials(deepcopy=False)
    states = pd.Series([trial.state.name.lower() for trial in trials]).value_counts()
    section.note(f"{len(trials)} trials: " + ", ".join(f"{count} {state}" for state, count in states.items()))
    rows = [{"trial": t.number, "state": t.state.name.lower(), **t.params,
             **{f"objective {i}": value for i, value in enumerate(t.values or [])}} for t in trials]
    section.table(pd.DataFrame(rows), "Every trial: its values and objective(s) (the mean over its seeds).", 4)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    if len(study.directions) == 1 and complete:
        best = study.best_trial
        line = " ".join(f"--set {key}={value}" for key, value in best.params.items())
        section.note(f"Best trial {best.number}: {best.values[0]:.4g} with {best.params}. Use it: {line}")
    names = [objective for objective in range(len(study.directions))]
    for index in names:
        target = None if len(study.directions) == 1 else (lambda t, i=index: t.values[i])
        for plot in (vis.plot_optimization_history, vis.plot_param_importances, vis.plot_parallel_coordinate,
                     vis.plot_slice):
            try:
                figure = plot(study, target=target) if target else plot(study)
            except (ValueError, RuntimeError, ZeroDivisionError) as err:  # too few trials for this figure
                section.note(f"{plot.__name__.removeprefix('plot_').replace('_', ' ')}: not drawn ({err})")
                continue
            section.figure(figure)
    return section


def build_report(
    sweep: str,
    tracking_uri: str | None = None,
    *,
    cells: Sequence[Any] | None = None,
    study: Any = None,
    n_boot: int = 1000,
    rollouts: bool = True,
    progress: Progress | None = None,
    archives: Sequence[Path] = (),
) -> Report:
    """Load the sweep's runs and build every section (see the module docstring). What the orch store knows of the
    sweep, the CLI reads (`orchestrator.api`) and hands in: ``cells``, its cells (`sweep_cells`; None when there is no
    store or it does not know the sweep) and ``study``, the Optuna study `orch tune` ran for it (`sweep_study`, or
    None). ``archives``: read the runs from these archive folders (:mod:`analysis.stores.archive`) instead; the tracking
    store, the orch store's cells and study and any re-evaluation are then not used."""
    from analysis.stats.science import filter_effect, science
    from analysis.stats.summary import metric_summary, summarize, use_reevaluation
    from analysis.stores.mlflow_store import RunQuery, load_runs
    from analysis.stores.sweep_state import store_cells

    if archives:
        data, archived = read_archives(list(archives), sweep)
    else:
        data = load_runs(RunQuery(sweep=sweep), tracking_uri, progress=progress)
    summary = summarize(data)
    if summary.empty:
        raise OrchError(f"sweep {sweep!r} has no cell runs in {data.tracking_uri}")
    store, reevaluated = None, None
    if not archives:
        summary, reevaluated = use_reevaluation(summary, reevaluations([sweep], tracking_uri))
        store = store_cells(cells)
    finals = metric_summary(data, [names.MI_EST, names.ENTROPY], "final").reset_index()
    notes = cell_notes(summary, store) + ([reevaluated] if reevaluated else [])
    tables_section, t4 = _paper_tables(summary, finals, notes)
    sections = [_cells(summary), tables_section, _curves(data, summary), _correlations(data, summary, n_boot),
                _early_warning(data, summary)]
    predictions = None
    if rollouts:
        if archives:
            first, predictions, predictor_notes = set(archived["run_id"]), archived, []
        else:
            batches, predictions, predictor_notes = _first_batches(data, summary, progress)
            first = set(batches)
        sections.append(_predictor(data, summary, t4, first, predictions, progress))
        notes.extend(predictor_notes)
    found = science(data, summary, predictions)
    if not found.reason:
        sections.insert(0, _science(found))
    study_section = None if archives or study is None else _study(study)
    if study_section is not None:
        sections.append(study_section)
    from analysis.paper import items_of_sweep
    from analysis.reports.paper_report import paper_sections

    for position, section in enumerate(paper_sections(data, summary, items_of_sweep(sweep), n_boot=n_boot,
                                                      predictions=predictions)):
        sections.insert(position, section)
    sections.insert(0, _overview(data, summary, store, notes))
    effects = found.effects if found.effects is not None else filter_effect(summary)
    complete = not found.reason and not found.untested  # then the findings read every scope's trends
    first, said = _answers(data, summary, effects, predictions, found.trends if complete else None)
    sections.insert(0, first)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Report(sweep=sweep, tracking_uri=data.tracking_uri, generated=generated, notes=notes, sections=sections,
                  science=found, held=held_line(sweep, summary, store, archives, data.tracking_uri),
                  headlines=[(answer.question, answer.headline()) for answer in said])


def archive_sweep(sweep: str, out: Path, tracking_uri: str | None = None, *, rollouts: bool = True,
                  progress: Progress | None = None) -> tuple[Path, int, list[str]]:
    """`orch archive`: write the sweep's finished runs, their metric histories and the predictor on its baseline
    runs' first rollout batch (``rollouts``) as the archive folder ``out`` (:mod:`analysis.stores.archive`); returns the
    folder, the number of runs and notes (runs left out, batches the predictor refused)."""
    import pandas as pd

    from analysis.stats.summary import summarize
    from analysis.stores.mlflow_store import RunData, RunQuery, load_runs
    from analysis.stores.rollout_artifacts import PREDICTION_COLUMNS

    data = load_runs(RunQuery(sweep=sweep), tracking_uri, progress=progress)
    role = data.runs.get("tags.orch.role", pd.Series(None, index=data.runs.index))
    ended = (data.runs["status"] == "FINISHED") | (role == "sweep")  # the sweep's parent run is kept as it is
    notes = []
    if not ended.all():
        notes.append(f"left out {int((~ended).sum())} run(s) not finished (their cells rerun from the start "
                     "elsewhere would be a second run of one cell)")
        data = RunData(runs=data.runs[ended].reset_index(drop=True),
                       metrics=data.metrics[data.metrics["run_id"].isin(data.runs.loc[ended, "run_id"])]
                       .reset_index(drop=True), tracking_uri=data.tracking_uri, reader=data.reader)
    if data.runs.empty:
        raise OrchError(f"sweep {sweep!r} has no finished runs in {data.tracking_uri}")
    predictions = pd.DataFrame(columns=list(PREDICTION_COLUMNS))
    if rollouts:
        # the predictor's hit rate reads the first k batches too
        from analysis.stats.predictor_record import EARLY_BATCHES, early_columns

        _, predictions, refused = _first_batches(data, summarize(data), progress, which=f"first:{EARLY_BATCHES}")
        predictions = early_columns(predictions)  # one row per run: the first batch, the first k's mean ratios
        notes += refused
    return write_archive(data, predictions, sweep, out), len(data.runs), notes


def reevaluations(sweeps, tracking_uri: str | None):
    """The runs of the evaluation sweeps of `sweeps` (`orch eval --sweep S --best`: sweep S.eval), or None when
    none has any."""

    from analysis.stores.mlflow_store import RunQuery, load_runs
    from recipes.trained.evaluate import eval_sweep_name

    parts = []
    for sweep in sweeps:
        try:
            data = load_runs(RunQuery(sweep=eval_sweep_name(sweep)), tracking_uri)
        except OrchError:  # no such experiment: nothing was re-evaluated
            continue
        if not data.runs.empty:
            parts.append(data)
    if not parts:
        return None
    return joined(parts)


def joined(parts):
    """Several sweeps' `RunData` as one (the first one's tracking URI and reader)."""
    import pandas as pd

    from analysis.stores.mlflow_store import RunData

    if len(parts) == 1:
        return parts[0]
    return RunData(runs=pd.concat([part.runs for part in parts], ignore_index=True),
                   metrics=pd.concat([part.metrics for part in parts], ignore_index=True),
                   tracking_uri=parts[0].tracking_uri, reader=parts[0].reader)


def paper_archives(entries: list[str]) -> dict[str, list[Path]]:
    """`orch report --paper --archive ENTRY...`: paper sweep -> its archive folders. An entry is a folder (read as
    the sweep its archive.json names) or SWEEP=FOLDER (read as that paper sweep's, e.g. another sweep's runs of the
    same cells); OrchError naming the entry and the valid sweeps otherwise. Nothing is read but archive.json."""
    from analysis.paper import paper_sweeps
    from analysis.stores.archive import check_archive

    valid = paper_sweeps()
    out: dict[str, list[Path]] = {}
    for entry in entries:
        name, _, folder = str(entry).rpartition("=") if "=" in str(entry) else ("", "", str(entry))
        meta = check_archive(Path(folder))
        sweep = name or str(meta.get("sweep"))
        if sweep not in valid:
            raise OrchError(f"{entry}: an archive of sweep {sweep!r}, not a paper sweep; valid: {', '.join(valid)} "
                            "(SWEEP=DIR reads a folder as that sweep's)")
        out.setdefault(sweep, []).append(Path(folder))
    return out


def build_paper_report(tracking_uri: str | None = None, *, n_boot: int = 1000, rollouts: bool = True,
                       progress: Progress | None = None, archives: dict[str, list[Path]] | None = None) -> Report:
    """`orch report --paper`: every item of the paper map (`analysis.paper`), each from the runs of its sweeps in
    the tracking store, or in ``archives`` (paper sweep -> archive folders, :func:`paper_archives`) when given
    (several sweeps' runs together, e.g. the entropy and KL sweeps); an item none of whose sweeps has run says so in
    one line. ``Report.comparisons`` keeps each item's comparison frame (what the rehearsal checks)."""

    from analysis.paper import ITEMS, paper_sweeps
    from analysis.reports.paper_report import metric_gaps, paper_sections
    from analysis.stats.summary import summarize, use_reevaluation
    from analysis.stores.mlflow_store import RunQuery, load_runs

    loaded: dict[str, RunData] = {}
    archived: dict[str, Any] = {}
    uri = ""
    for sweep in paper_sweeps():
        if archives is not None:
            if sweep not in archives:
                continue
            data, archived[sweep] = read_archives(archives[sweep])
        else:
            try:
                data = load_runs(RunQuery(sweep=sweep), tracking_uri, progress=progress)
            except OrchError:
                continue
        uri = data.tracking_uri
        if not data.runs.empty:
            loaded[sweep] = data
    if not loaded:
        raise OrchError("no paper sweep has runs in the tracking store: run one (e.g. `orch sweep sweeps/table4.yaml "
                        "--profile cpu --wait`) first")
    sections, notes, gaps = [], [], []
    comparisons: dict[str, Any] = {}
    for item in ITEMS:
        parts = [loaded[sweep] for sweep in item.sweeps if sweep in loaded]
        if not parts:
            section = Section(f"The paper, {item.ref}: {item.title}")
            section.note(f"No cell of {', '.join(f'sweeps/{s}.yaml' for s in item.sweeps)} has run yet.")
            sections.append(section)
            continue
        data = joined(parts)
        summary = summarize(data)
        if archives is None:
            summary, reevaluated = use_reevaluation(summary, reevaluations(item.sweeps, uri))
            if reevaluated and reevaluated not in notes:
                notes.append(reevaluated)
        predictions = None
        if item.key == "predictor" and archives is not None:  # the archive keeps the predictor's rows
            import pandas as pd

            found = [archived[sweep] for sweep in item.sweeps if sweep in archived]
            predictions = pd.concat(found, ignore_index=True) if found else None
        elif rollouts and item.key == "predictor":
            _, predictions, predictor_notes = _first_batches(data, summary, progress)
            notes.extend(predictor_notes)
        item_sections = paper_sections(data, summary, [item], n_boot=n_boot, predictions=predictions,
                                       frames=comparisons)
        if item.key == "predictor":
            from analysis.stats.predictor_record import hit_rate_line

            for section in item_sections:  # beside the published ratios: the verdict's own record on orch's runs
                section.note(hit_rate_line())
        if item.key == "early_warning":
            from analysis.stats.collapse_alert_calibration import alert_lines, rules_used
            from recipes.stats.collapse_alert import CollapseRule

            for section in item_sections:  # beside MI's lead: the alert's own measured error rates
                for line in alert_lines(rules_used(data) or [CollapseRule()]):
                    section.note(line)
        sections.extend(item_sections)
        gaps.extend(metric_gaps(item, data))
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Report(sweep="the paper (RAGEN-2, arXiv 2604.06268)", tracking_uri=uri, generated=generated, notes=notes,
                  sections=sections, gaps=gaps, comparisons=comparisons)


STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 2rem 3rem; color: #222; }
h1 { margin-bottom: 0.2rem; } .meta { color: #666; margin-top: 0; }
nav a { margin-right: 1rem; } section { margin-top: 2rem; border-top: 1px solid #ddd; }
table.data { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0 1rem; }
table.data th, table.data td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #eee; text-align: right; }
table.data th { background: #f6f6f6; } .scroll { overflow-x: auto; }
.note { color: #555; font-style: italic; } .answer { font-size: 1.05rem; max-width: 60rem; } .missing { background: #fff6e5; padding: 0.3rem 1rem; }
#orch-errors { display: none; background: #fde8e8; color: #a00; padding: 0.5rem 1rem; white-space: pre-wrap; }
"""
# Collects JavaScript errors into a visible banner (and for the headless-browser test).
# Collects JavaScript errors (and rejected promises) into a visible banner, also read by the headless-browser test.
ERROR_HOOK = """
window.orchErrors = [];
function orchShowErrors() {
  var box = document.getElementById('orch-errors');
  if (!box || !window.orchErrors.length) { return; }
  box.style.display = 'block';
  box.textContent = window.orchErrors.map(function (m) { return 'script error: ' + m; }).join('\\n');
}
window.addEventListener('error', function (event) { window.orchErrors.push(String(event.message)); orchShowErrors(); });
window.addEventListener('unhandledrejection', function (event) {
  window.orchErrors.push('unhandled rejection: ' + String(event.reason)); orchShowErrors();
});
document.addEventListener('DOMContentLoaded', orchShowErrors);
"""


def render_html(report: Report) -> str:
    """The report as one HTML document with plotly.js inlined."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    body, nav = [], []
    figure_number = 0
    for number, section in enumerate(report.sections, start=1):
        anchor = f"s{number}"
        nav.append(f'<a href="#{anchor}">{html.escape(section.title)}</a>')
        parts = [f'<section id="{anchor}"><h2>{html.escape(section.title)}</h2>']
        for block in section.blocks:
            if isinstance(block, str):
                parts.append(block)
            else:
                figure_number += 1
                parts.append(
                    pio.to_html(block, full_html=False, include_plotlyjs=False, div_id=f"figure-{figure_number}",
                                config={"displaylogo": False, "responsive": True})
                )
        parts.append("</section>")
        body.append("\n".join(parts))
    title = f"orch report: {report.sweep}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f"<script>{ERROR_HOOK}</script><script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>"
        '<div id="orch-errors"></div>'
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="meta">tracking store {html.escape(report.tracking_uri)} · generated {report.generated} · '
        f'<span id="figure-count">{figure_number}</span> figures</p>'
        f"<nav>{''.join(nav)}</nav>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def kaleido_available() -> bool:
    """Whether plotly can export static images here (the kaleido package is importable)."""
    return importlib.util.find_spec("kaleido") is not None


def export_figures(report: Report, out: Path, fmt: str) -> list[Path]:
    """Write every figure as ``<out stem>_figures/NN.<fmt>`` (png | pdf) through kaleido; returns the files."""
    if fmt not in ("png", "pdf"):
        raise OrchError(f"unknown static format {fmt!r}; valid choices: pdf, png")
    if not kaleido_available():
        raise OrchError(
            f"--format {fmt} needs the kaleido package (pip install kaleido) and a Chrome/Chromium it can drive; "
            f"the HTML report was written to {out}"
        )
    import plotly.io as pio

    folder = out.with_name(f"{out.stem}_figures")
    folder.mkdir(parents=True, exist_ok=True)
    figures = report.figures()
    paths = [folder / f"{number:02d}.{fmt}" for number in range(1, len(figures) + 1)]
    try:
        pio.write_images(figures, paths, format=fmt)  # one browser session for all figures
    except Exception as err:  # kaleido failing to start its browser, mostly
        raise OrchError(f"static export to {folder} failed: {str(err).strip().splitlines()[0]}") from None
    return paths


def write_report(report: Report, out: Path, fmt: str = "html") -> list[Path]:
    """Write the HTML report to ``out`` and, for png/pdf, the figures beside it; returns every file written."""
    if fmt not in FORMATS:
        raise OrchError(f"unknown --format {fmt!r}; valid choices: {', '.join(FORMATS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report), encoding="utf-8")
    return [out] + (export_figures(report, out, fmt) if fmt != "html" else [])
