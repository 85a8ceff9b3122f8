"""`orch tune`: an Optuna study whose trials are cells of the sweep engine.

The tuner is the only process that opens the Optuna storage (Optuna's RDB storage, in orch's own database: the
store URL). Each poll it

1. reconciles the sweep with the cluster (lost jobs);
2. looks at every running trial: when its cells have finished it tells Optuna the objective(s) read from their
   MLflow runs; a failed cell fails the trial; while they run it reports the pruner's intermediate value (the
   mean over the trial's cells of the metric at each step MLflow has) and, when Optuna says so, prunes the trial:
   its cells become `pruned` and their jobs are asked to stop (they checkpoint and end, as on `orch cancel`);
3. asks Optuna for new trials while fewer than `parallel` run and fewer than `trials` exist. A trial's cells are
   planned like any sweep cell (`orchestrator.study.trial_definition` + `build_plan`): a config that has already
   run is not run again (its result is told at once), others are stored and submitted with the sweep's executor.

Jobs never touch the Optuna storage: they log to MLflow and report to the store as in any sweep. Killing the tuner
loses nothing: `orch tune FILE` again loads the same study, keeps its finished trials and adopts the running ones.
One tuner per study at a time (a lock file in the sweep's folder).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.engine import _ensure_runs, reconcile, save_sweep_row, stop_cells, submit_cells
from orchestrator.states import ACTIVE, DONE, MISSING, State
from orchestrator.study import StudySpec, objective_value, probe_points, trial_definition
from orchlib.errors import OrchError, error_line
from orchlib.shutdown import before_exit

if TYPE_CHECKING:
    from orchestrator.plan import Plan
    from orchestrator.spec import SweepDefinition
    from orchestrator.store import Store
    from orchestrator.store_schema import CellRow, SweepRow

log = logging.getLogger("orch.tune")
CELLS_ATTR = "orch_cells"  # Optuna user attribute of a trial: its cells' digests
REUSED_ATTR = "orch_reused"
RUNNER_LOG = "tuner.log"
LOCK_FILE = "tuner.lock"


@dataclass
class StudyPlan:
    """A validated study: the sweep file and the planning of one trial's cells."""

    definition: SweepDefinition
    resolver: Any = None

    @property
    def spec(self) -> StudySpec:
        return self.definition.spec.study

    @property
    def name(self) -> str:
        return self.definition.spec.name

    def varied(self) -> list[str]:
        return ["trial", *self.spec.space]

    def trial_plan(self, params: dict[str, Any]) -> Plan:
        """The trial's cells (one per seed), planned like any sweep's."""
        from orchestrator.plan import build_plan

        return build_plan(trial_definition(self.definition, params), self.resolver)

    def cell_fields(self, number: int, params: dict[str, Any], plan: Plan) -> list[dict[str, Any]]:
        """Store columns of the trial's cells: positions after the earlier trials', the trial's values as the
        varied keys."""
        from orchestrator.engine import cell_fields

        rows = cell_fields(plan)
        for index, row in enumerate(rows):
            row["position"] = number * self.spec.seeds_per_trial + index
            row["varied_json"] = json.dumps({"trial": number, **params})
        return rows


def plan_study(definition: SweepDefinition) -> StudyPlan:
    """Validate the study: every range end and every choice composes to a valid config (so a bad key or value is
    refused before anything is written, naming the study's key). Raises `OrchError` with file, line and key."""
    from recipes.config.resolve import ConfigResolver

    if definition.spec.study is None:
        raise definition.source.error((), "this sweep file has no `study:` section: run it with `orch sweep FILE`")
    study = StudyPlan(definition, ConfigResolver())
    for point in probe_points(study.spec):
        try:
            plan = study.trial_plan(point)
        except OrchError as err:
            culprit = next((key for key in point if key in str(err)), next(iter(point)))
            raise definition.source.error(("study", "space", culprit),
                                          f"{point[culprit]!r} for {culprit}: {_after_colon(err)}") from None
        plan.check_submittable()
    study.resolver.flush()
    return study


def _after_colon(err: Exception) -> str:
    text = str(err)
    return text.split(": ", 1)[1] if ": " in text else text


def trial_refusal(plan: Plan) -> str | None:
    """Why a trial's verl GPU cells cannot start as planned (`orchestrator.preflight.fit_gate`: memory, vLLM,
    veRL's validation, model and data paths), in one line; None when they can or the trial has none."""
    from orchestrator.preflight import fit_gate

    _, refusal = fit_gate(plan)
    if refusal is None:
        return None
    lines = [line.strip() for line in refusal.splitlines()[1:] if line.strip() and not line.startswith("needs from")]
    return "; ".join(lines) or refusal


def fit_refusal(study: StudyPlan) -> str | None:
    """Before a study writes anything: when the trials at every end of the space (`probe_points`) are all refused by
    the fit check, the study cannot run one trial as planned -> the refusal (file, first point, why); else None (a
    refused trial later fails alone and the study goes on)."""
    points = probe_points(study.spec)
    first = None
    for point in points:
        reason = trial_refusal(study.trial_plan(point))
        if reason is None:
            return None
        first = first or (point, reason)
    point, reason = first
    return (f"{study.definition.path}: no trial of the study can start as planned (all {len(points)} corners of its "
            f"space are refused by the fit check, e.g. {point}: {reason}); nothing written (orch sweep FILE "
            "--preflight on a sweep of one trial: the full report; --submit-anyway: tune all the same)")


def first_trials(study: StudyPlan, count: int) -> list[tuple[dict[str, Any], list[str]]]:
    """What the sampler would try first (an in-memory study with the same sampler and seed): each trial's values
    and its cells' digests. Nothing is written."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    memory = optuna.create_study(directions=study.spec.directions(), sampler=study.spec.make_sampler())
    out = []
    for _ in range(min(count, study.spec.trials)):
        trial = memory.ask()
        params = study.spec.suggest(trial)
        out.append((params, [cell.digest for cell in study.trial_plan(params).cells]))
        memory.tell(trial, [0.0] * len(study.spec.objectives))
    return out


@dataclass
class TuneReport:
    """Where a study stands."""

    study: str
    trials: int = 0
    states: dict[str, int] = field(default_factory=dict)  # Optuna trial state -> count
    best: list[dict[str, Any]] = field(default_factory=list)  # best trials: number, values, params
    events: list[str] = field(default_factory=list)  # what this poll did, one line each


class Tuner:
    """Runs one study (see the module docstring)."""

    def __init__(self, store: Store, study: StudyPlan, executor: str, *, tracking_uri: str | None = None,
                 sets: tuple[str, ...] | list[str] = (), trials: int | None = None,
                 submit_anyway: bool = False) -> None:
        import optuna

        from orchestrator.executors import get_executor

        get_executor(executor).check_available()
        self.store, self.study_plan, self.executor = store, study, executor
        self.submit_anyway = submit_anyway
        self.total = trials or study.spec.trials
        if study.spec.sampler.name == "grid":  # every point once
            self.total = min(self.total, math.prod(len(p.values()) for p in study.spec.space.values()))
        self.sweep: SweepRow = save_sweep_row(store, study.definition, executor, study.varied(), tracking_uri, sets)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            self.study = optuna.create_study(
                study_name=study.name, storage=self._storage(), directions=study.spec.directions(),
                sampler=study.spec.make_sampler(), pruner=study.spec.make_pruner(), load_if_exists=True)
        except ValueError as err:  # e.g. the stored study has other directions
            raise OrchError(f"study {study.name}: {err}") from None

    def _tell(self, trial: Any, values: Any = None, state: Any = None) -> None:
        """`study.tell`; the grid sampler asks the study to stop when its grid is exhausted, which Optuna allows
        only inside `optimize` (the trial's state is stored before that request: nothing is lost by ignoring it)."""
        try:
            self.study.tell(trial, values, state=state)
        except RuntimeError as err:
            if "Study.stop" not in str(err):
                raise

    def _storage(self) -> Any:
        import optuna

        return optuna.storages.RDBStorage(self.store.url, skip_compatibility_check=False)

    # -- one poll ------------------------------------------------------------------------------------------------

    def poll(self) -> TuneReport:
        """Reconcile, settle or prune the running trials, start new ones; returns where the study stands."""
        from optuna.trial import TrialState

        report = TuneReport(self.study_plan.name)
        reconcile(self.store, self.sweep)
        rows = {row.digest: row for row in self.store.cell_rows(self.sweep.id)}
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for trial in running:
            self._follow(trial, rows, report)
        rows = {row.digest: row for row in self.store.cell_rows(self.sweep.id)}
        while True:
            trials = self.study.get_trials(deepcopy=False)
            active = sum(trial.state == TrialState.RUNNING for trial in trials)
            if len(trials) >= self.total or active >= self.study_plan.spec.parallel:
                break
            self._start(rows, report)
            rows = {row.digest: row for row in self.store.cell_rows(self.sweep.id)}
        return self._standing(report)

    def done(self, report: TuneReport) -> bool:
        return report.trials >= self.total and not report.states.get("RUNNING")

    def _start(self, rows: dict[str, CellRow], report: TuneReport) -> None:
        """Ask Optuna for a trial, plan its cells, reuse finished ones, submit the others."""
        trial = self.study.ask()
        params = self.study_plan.spec.suggest(trial)
        try:
            plan = self.study_plan.trial_plan(params)
        except OrchError as err:  # conf/ refuses this value: the trial fails, the study goes on
            self._tell(trial, state=_state("FAIL"))
            report.events.append(f"trial {trial.number} {params}: failed to plan: {err}")
            return
        refusal = trial_refusal(plan)
        if refusal and not self.submit_anyway:  # its GPU cells cannot start as planned: the trial fails, nothing runs
            self._tell(trial, state=_state("FAIL"))
            report.events.append(f"trial {trial.number} {params}: refused by the fit check: {refusal}")
            return
        if refusal:
            report.events.append(f"trial {trial.number} {params}: warning (--submit-anyway): {refusal}")
        digests = [cell.digest for cell in plan.cells]
        trial.set_user_attr(CELLS_ATTR, digests)
        cells = [rows.get(digest) for digest in digests]
        if all(cell is not None and cell.state in DONE for cell in cells):
            trial.set_user_attr(REUSED_ATTR, True)
            report.events.append(f"trial {trial.number} {params}: the same config already ran; reusing its cells")
            self._settle(trial, cells, report)
            return
        self.store.add_cells(self.sweep.id, self.study_plan.cell_fields(trial.number, params, plan))
        fresh = self.store.cell_rows(self.sweep.id, digests=digests)
        submit_cells(self.store, self.sweep, [row for row in fresh if row.state in MISSING], self.executor, MISSING)
        report.events.append(f"trial {trial.number} {params}: submitted {len(digests)} cell(s) "
                             f"({', '.join(digest[:12] for digest in digests)})")

    def _follow(self, frozen: Any, rows: dict[str, CellRow], report: TuneReport) -> None:
        """A running trial: settle it when its cells have ended, else report its intermediate values."""
        cells = [rows.get(digest) for digest in frozen.user_attrs.get(CELLS_ATTR, [])]
        if not cells or any(cell is None for cell in cells):
            self._tell(frozen.number, state=_state("FAIL"))
            report.events.append(f"trial {frozen.number}: its cells are not in the store; failed")
            return
        states = {cell.state for cell in cells}
        if states <= DONE or states & {State.FAILED, State.PRUNED, State.CANCELLED}:
            self._settle(frozen.number, cells, report)
            return
        lost = [cell for cell in cells if cell.state in MISSING]  # lost (or pending): run them again
        if lost:
            submit_cells(self.store, self.sweep, lost, self.executor, MISSING)
            report.events.append(f"trial {frozen.number}: resubmitted {len(lost)} lost cell(s)")
        if self.study_plan.spec.pruner.name != "none":
            self._maybe_prune(frozen, cells, report)

    def _settle(self, trial: Any, cells: list[CellRow], report: TuneReport) -> None:
        """Tell Optuna how the trial ended: its objectives, or failed / pruned."""
        number = trial if isinstance(trial, int) else trial.number
        states = {cell.state for cell in cells}
        if State.PRUNED in states:
            self._tell(trial, state=_state("PRUNED"))
            report.events.append(f"trial {number}: pruned")
            return
        if states - DONE:
            self._tell(trial, state=_state("FAIL"))
            report.events.append(f"trial {number}: failed ({', '.join(sorted(states - DONE))} cells)")
            return
        values = []
        for objective in self.study_plan.spec.objectives:
            value = objective_value([self._history(cell, objective.metric) for cell in cells], objective)
            if value is None:
                self._tell(trial, state=_state("FAIL"))
                report.events.append(f"trial {number}: failed: a run never logged {objective.metric}")
                return
            values.append(value)
        self._tell(trial, values)
        report.events.append(f"trial {number}: {', '.join(f'{o.metric} {v:.4g}' for o, v in zip(self.study_plan.spec.objectives, values, strict=True))}")

    def _maybe_prune(self, frozen: Any, cells: list[CellRow], report: TuneReport) -> None:
        """Report each step's mean intermediate value over the trial's cells (steps every cell has logged, not
        yet reported); prune when Optuna says so."""
        import optuna

        spec = self.study_plan.spec
        histories = [dict(self._history(cell, spec.pruner_metric())) for cell in cells]
        steps = sorted(set.intersection(*(set(history) for history in histories)) - set(frozen.intermediate_values))
        if not steps:
            return
        trial = optuna.trial.Trial(self.study, frozen._trial_id)
        for step in steps:
            trial.report(spec.pruner_sign() * sum(history[step] for history in histories) / len(histories), step)
        if trial.should_prune():
            stop_cells(self.store, self.sweep, [cell.id for cell in cells], State.PRUNED,
                       f"pruned by `orch tune` at step {steps[-1]} ({spec.pruner_metric()})", ACTIVE)
            self._tell(frozen.number, state=_state("PRUNED"))
            report.events.append(f"trial {frozen.number}: pruned at step {steps[-1]}")

    def _history(self, cell: CellRow, metric: str) -> list[tuple[int, float]]:
        if not cell.mlflow_run_id:
            return []
        from orchestrator.tracking import _client

        return [(m.step, m.value) for m in _client(self.sweep.tracking_uri).get_metric_history(cell.mlflow_run_id,
                                                                                               metric)]

    def _standing(self, report: TuneReport) -> TuneReport:
        trials = self.study.get_trials(deepcopy=False)
        report.trials = len(trials)
        for trial in trials:
            report.states[trial.state.name] = report.states.get(trial.state.name, 0) + 1
        try:  # one best trial (the first of a tie) for one objective; the Pareto front for several
            best = [self.study.best_trial] if len(self.study.directions) == 1 else self.study.best_trials
        except ValueError:  # no completed trial yet
            best = []
        report.best = [{"number": t.number, "values": t.values, "params": t.params} for t in best]
        return report

    # -- the loop ------------------------------------------------------------------------------------------------

    def run(self, poll_s: float = 2.0, on_poll: Callable[[TuneReport], None] | None = None) -> TuneReport:
        """Poll until the study has all its trials and none runs (one tuner per study: a lock file)."""
        from orchlib.locks import file_lock

        folder = Path(self.sweep.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with file_lock(folder / LOCK_FILE, wait=False):
                _ensure_runs(self.store, self.sweep, [])
                while True:
                    report = self.poll()
                    if on_poll is not None:
                        on_poll(report)
                    if self.done(report):
                        return report
                    time.sleep(poll_s)
        except BlockingIOError:
            raise OrchError(f"study {self.study_plan.name}: another `orch tune` runs it (lock {folder / LOCK_FILE}); "
                            "follow it with `orch status`") from None


def _state(name: str) -> Any:
    from optuna.trial import TrialState

    return TrialState[name]


def best_settings(report: TuneReport) -> str | None:
    """The best trial's values as a ready `--set` line (single objective), e.g. `--set filter.value=0.9`."""
    if len(report.best) != 1:
        return None
    return " ".join(f"--set {key}={value}" for key, value in report.best[0]["params"].items())


def start_detached(store_url: str, spec_path: Path, profile: str | None, sets: list[str], executor: str,
                   tracking_uri: str | None, trials: int | None, run_dir: Path,
                   submit_anyway: bool = False) -> tuple[int, Path]:
    """Run the tuner in the background (`python -m orchestrator.tune ...`, its own session); returns its pid and
    log file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / RUNNER_LOG
    command = [sys.executable, "-m", "orchestrator.tune", "--store", store_url, "--cluster", executor,
               str(spec_path)]
    command += ["--profile", profile] if profile else []
    for item in sets:
        command += ["--set", item]
    command += ["--tracking-uri", tracking_uri] if tracking_uri else []
    command += ["--trials", str(trials)] if trials else []
    command += ["--submit-anyway"] if submit_anyway else []
    with open(log_path, "a") as handle:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True, close_fds=True, env=os.environ.copy())
    return process.pid, log_path


def main(argv: list[str] | None = None) -> int:
    """The detached tuner: `python -m orchestrator.tune --store URL --cluster NAME FILE [...]`."""
    import argparse

    from orchestrator.spec import load_sweep
    from orchestrator.store import Store
    from recipes.run.progress import setup_logging

    parser = argparse.ArgumentParser(prog="orchestrator.tune")
    parser.add_argument("file")
    parser.add_argument("--store", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--profile")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--tracking-uri")
    parser.add_argument("--trials", type=int)
    parser.add_argument("--submit-anyway", action="store_true")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        definition = load_sweep(args.file, profile=args.profile, sets=args.set)
        tuner = Tuner(Store.open(args.store), plan_study(definition), args.cluster, tracking_uri=args.tracking_uri,
                      sets=args.set, trials=args.trials, submit_anyway=args.submit_anyway)

        def show(report: TuneReport) -> None:
            for event in report.events:
                log.info("%s", event)

        report = tuner.run(on_poll=show)
    except OrchError as err:
        print(error_line(err), file=sys.stderr)
        return 2
    log.info("study %s: %d trials %s; best %s", report.study, report.trials, report.states, report.best)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    finally:
        before_exit()  # the tuner's process ends here: skip the shutdown collections over MLflow's objects
    sys.exit(code)
