"""Sweep operations: submit what is missing, reconcile with the cluster, cancel, resume, wait.

`submit_plan` is idempotent: cells are identified by their config hash, so running the same sweep again submits
only cells that are pending, cancelled or lost (and failed ones with `retry_failed`); finished cells are skipped,
active ones left alone, and a changed sweep file adds only its new cells.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.executors import get_executor
from orchestrator.executors.base import CellTask, SubmitError, SweepContext
from orchestrator.states import ACTIVE, DONE, MISSING, State
from orchestrator.store import DEFAULT_DIR, Attempt, Store
from orchestrator.store_schema import CellRow, SweepRow
from orchlib.errors import OrchError

if TYPE_CHECKING:
    from orchestrator.plan import Plan
    from orchestrator.resources import Resources
    from orchestrator.spec import SweepDefinition


@dataclass
class SubmitReport:
    """What `orch sweep` / `orch resume` did."""

    sweep: str
    executor: str
    cells: int
    new: int = 0
    submitted: int = 0
    not_submitted: dict[str, int] = field(default_factory=dict)  # state -> cells left as they are
    lost: int = 0


def run_dir_for(name: str, workdir: Path | None = None) -> Path:
    """Where a sweep's job files, logs and checkpoints live: `.orch/sweeps/<name>` in the working directory."""
    return (workdir or Path.cwd()).resolve() / DEFAULT_DIR / "sweeps" / name


def submit_plan(plan: Plan, store: Store, executor: str, *, tracking_uri: str | None = None,
                retry_failed: bool = False, sets: Sequence[str] = ()) -> SubmitReport:
    """Record the plan's sweep and cells, then submit the cells that are missing. Nothing is written if the
    plan cannot be submitted (a planned backend) or the executor is unavailable."""
    plan.check_submittable()
    get_executor(executor).check_available()
    sweep = save_sweep_row(store, plan.definition, executor, plan.varied, tracking_uri, sets)
    report = SubmitReport(sweep=plan.name, executor=executor, cells=len(plan.cells))
    report.new = store.add_cells(sweep.id, cell_fields(plan))
    report.lost = reconcile(store, sweep)
    rows = store.cell_rows(sweep.id, digests=[cell.digest for cell in plan.cells])
    wanted = MISSING | ({State.FAILED} if retry_failed else frozenset())
    _submit(report, store, sweep, rows, executor, wanted)
    return report


def save_sweep_row(store: Store, definition: SweepDefinition, executor: str, varied: Sequence[str],
                   tracking_uri: str | None = None, sets: Sequence[str] = ()) -> SweepRow:
    """Record (or update) the sweep of `definition` in the store: its file, profile, `--set` overrides, executor,
    cluster settings, varied keys, folder and tracking URI (kept from an earlier submission unless given)."""
    from recipes.run.tracking import default_tracking_uri

    existing = store.sweep(definition.spec.name)
    return store.save_sweep({
        "name": definition.spec.name,
        "spec_path": str(definition.path.resolve()),
        "spec_text": definition.path.read_text(),
        "profile": definition.profile,
        "sets_json": json.dumps(list(sets)),
        "executor": executor,
        "cluster_json": definition.spec.cluster.model_dump_json(),
        "varied_json": json.dumps(list(varied)),
        "run_dir": existing.run_dir if existing else str(run_dir_for(definition.spec.name)),
        "tracking_uri": tracking_uri or (existing.tracking_uri if existing else None) or default_tracking_uri(),
    })


def _submit(report: SubmitReport, store: Store, sweep: SweepRow, rows: list[CellRow], executor: str,
            wanted: frozenset[str]) -> None:
    """Submit the `rows` in a `wanted` state; count in `report` those submitted and those left as they are (in
    another state, or claimed first by another process: counted in the state they have now)."""
    todo = [row for row in rows if row.state in wanted]
    claimed = submit_cells(store, sweep, todo, executor, wanted)
    report.submitted = len(claimed)
    left = Counter(row.state for row in rows if row.state not in wanted)
    left.update(store.cell_states([row.id for row in todo if row.id not in claimed]).values())
    report.not_submitted = dict(left)


def cell_fields(plan: Plan) -> list[dict]:
    """The store columns of every planned cell, and its planned config (`config_json` and `cell_json`:
    `recipes.config.resolve.stored_form`, what its job runs)."""
    resources_json: dict[Resources, str] = {}
    rows = []
    for cell in plan.cells:
        if cell.resources not in resources_json:
            resources_json[cell.resources] = cell.resources.model_dump_json()
        shared, own = cell.resolved.stored() if cell.resolved is not None else (None, None)
        rows.append({
            "digest": cell.digest,
            "position": cell.index,
            "axis": cell.axis,
            "seed": cell.seed,
            "backend": cell.backend,
            "settings_json": json.dumps(cell.settings),
            "overrides_json": json.dumps(cell.overrides),
            "varied_json": json.dumps(plan.varied_values(cell)),
            "resources_json": resources_json[cell.resources],
            "config_json": shared,
            "cell_json": own,
        })
    return rows


def submit_cells(store: Store, sweep: SweepRow, rows: list[CellRow], executor: str,
                 wanted: Iterable[str] = MISSING) -> set[int]:
    """Claim the cells (those still in one of the `wanted` states: another `orch sweep` or `orch resume` of the
    sweep may have claimed some since `rows` were read), create their missing MLflow runs, hand them to the
    executor. Returns the ids of the cells claimed and submitted."""
    if not rows:
        return set()
    from orchestrator.resources import Resources

    runner = get_executor(executor)(_context(store, sweep))
    attempt_ids = store.record_submissions(executor, [row.id for row in rows], runner.upfront_job_id(),
                                           only_states=wanted)
    rows = [row for row in rows if row.id in attempt_ids]
    if not rows:
        return set()
    tasks = [CellTask(row.id, attempt_ids[row.id], row.digest, Resources.model_validate_json(row.resources_json))
             for row in rows]
    try:
        _ensure_runs(store, sweep, rows)
        submissions = runner.submit(tasks)
    except SubmitError as err:
        store.assign_jobs(err.submitted)
        done = {item.cell_id for item in err.submitted}
        store.end_attempts([attempt_ids[row.id] for row in rows if row.id not in done], State.PENDING, str(err))
        raise
    except BaseException as err:  # back to pending: only this claim's attempts, never a cell claimed again since
        store.end_attempts([attempt_ids[row.id] for row in rows], State.PENDING, f"submission failed: {err}")
        raise
    store.assign_jobs(submissions)
    return set(attempt_ids)


def _ensure_runs(store: Store, sweep: SweepRow, rows: list[CellRow]) -> None:
    """The sweep's MLflow experiment and parent run, and a child run for each cell that has none."""
    from orchestrator.tracking import ChildRun, create_child_runs, discard_run, ensure_sweep_runs

    params = {"spec_path": sweep.spec_path, "profile": sweep.profile or "", "sets": sweep.sets_json,
              "varied": sweep.varied_json}
    experiment_id, parent_run_id = ensure_sweep_runs(sweep.tracking_uri, sweep.name, sweep.parent_run_id, params)
    if (experiment_id, parent_run_id) != (sweep.experiment_id, sweep.parent_run_id):
        recorded = store.claim_parent_run(sweep.id, sweep.parent_run_id, experiment_id, parent_run_id)
        if recorded != parent_run_id:  # another orch sweep/resume recorded its parent run first: use it
            discard_run(sweep.tracking_uri, parent_run_id)
            parent_run_id = recorded
        sweep.experiment_id, sweep.parent_run_id = experiment_id, parent_run_id
    children = [ChildRun(row.id, row.digest, row.seed, row.axis, json.loads(row.varied_json))
                for row in rows if not row.mlflow_run_id]
    run_ids = create_child_runs(sweep.tracking_uri, sweep.name, experiment_id, parent_run_id, children)
    store.set_run_ids(run_ids)
    for row in rows:
        row.mlflow_run_id = row.mlflow_run_id or run_ids.get(row.id)


def _context(store: Store, sweep: SweepRow) -> SweepContext:
    return SweepContext(name=sweep.name, sweep_id=sweep.id, store_url=store.url, run_dir=Path(sweep.run_dir),
                        cluster_json=sweep.cluster_json)


def reconcile(store: Store, sweep: SweepRow) -> int:
    """Mark `lost` the active cells whose job vanished without reporting, and end stalled ones under the sweep's
    `cluster.stall` rule. Returns how many were ended.

    Where the cluster cannot be asked from here (no `squeue` on this machine), nothing is changed.
    """
    attempts = store.active_attempts(sweep.id)
    by_executor: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        by_executor.setdefault(attempt.executor, []).append(attempt)
    lost = 0
    for name, group in by_executor.items():
        try:
            gone = get_executor(name)(_context(store, sweep)).vanished(group)
        except OrchError:
            continue
        for attempt_id, reason in gone.items():
            lost += store.end_attempts([attempt_id], State.LOST, reason)
    return lost + _end_stalled(store, sweep, attempts)


def _end_stalled(store: Store, sweep: SweepRow, attempts: list[Attempt]) -> int:
    """Under `cluster.stall: {action: fail | requeue}`, kill the jobs of running cells whose heartbeat is older
    than `after_s` and end their cells failed (fail) or lost (requeue: the next `orch resume` runs them again)."""
    from orchestrator.spec import ClusterSettings

    rule = ClusterSettings.model_validate_json(sweep.cluster_json).stall
    now = time.time()
    stalled = [attempt for attempt in attempts if rule.stalled(attempt.state, attempt.heartbeat_at, now)]
    if rule.action == "flag" or not stalled:
        return 0
    state = State.FAILED if rule.action == "fail" else State.LOST
    ended = 0
    for attempt in stalled:
        reason = (f"stalled: no heartbeat for {now - attempt.heartbeat_at:.0f} s (cluster.stall.after_s="
                  f"{rule.after_s:g}, action {rule.action}); its job was killed")
        if store.end_attempts([attempt.id], state, reason):
            ended += 1
            get_executor(attempt.executor)(_context(store, sweep)).kill([attempt])
    return ended


def resume(store: Store, name: str, executor: str | None = None, retry_failed: bool = False) -> SubmitReport:
    """Submit again the cells of a stored sweep that are pending, cancelled or lost (and failed ones with
    `retry_failed`), with the sweep's last executor unless `executor` is given."""
    sweep = store.require_sweep(name)
    executor = executor or sweep.executor
    cells = store.cell_rows(sweep.id)
    get_executor(executor).check_available()
    report = SubmitReport(sweep=name, executor=executor, cells=len(cells))
    report.lost = reconcile(store, sweep)
    rows = store.cell_rows(sweep.id)
    wanted = MISSING | ({State.FAILED} if retry_failed else frozenset())
    if executor != sweep.executor:
        store.update_sweep(sweep.id, executor=executor)
    _submit(report, store, sweep, rows, executor, wanted)
    return report


@dataclass
class ReplanReport:
    """What `orch resume --replan` found: the cells resolved again against `conf/`, and the identities that
    changed: (old digest, its state, new digest, what became of it); `what` says, per old digest, which keys of its
    config changed; `blocked`, the queued or running cells whose identity changed (refused: they run their planned
    config); `plan`, the cells that would run afterwards (the unchanged ones with their new configs, the new
    identities), for the fit check."""

    sweep: str
    resolved: int = 0
    unchanged: int = 0
    changed: list[tuple[str, str, str, str]] = field(default_factory=list)
    what: dict[str, str] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)
    plan: Plan | None = field(default=None, repr=False)
    sweep_id: int = field(default=0, repr=False)
    same: dict[int, dict] = field(default_factory=dict, repr=False)
    replaced: list = field(default_factory=list, repr=False)  # `orchestrator.store.Replacement`s


def plan_replan(store: Store, name: str, reconciled: bool = True) -> ReplanReport:
    """What `replan` would do, nothing written to the store: every cell of sweep `name` that may still run (not
    finished, stopped or pruned) resolved again from its stored settings against the current `conf/`. `reconciled`:
    mark lost the cells whose job vanished first (a write; `orch resume --replan --dry-run` does not, so such a cell
    shows as still active). Refused, with one line, for a study's sweep and for settings that no longer resolve; a
    queued or running cell whose identity changed is listed in `blocked`."""
    from orchestrator.store import Replacement
    from recipes.config.resolve import ConfigResolver

    sweep = store.require_sweep(name)
    if _is_study(sweep):
        raise OrchError(f"sweep {name} is an `orch tune` study: its trials name their cells, which --replan would "
                        f"replace; run `orch tune {sweep.spec_path}` to go on with it")
    if reconciled:
        reconcile(store, sweep)  # a cell whose job vanished is not running any more
    all_rows = store.cell_rows(sweep.id)
    rows = [row for row in all_rows if row.state not in DONE | {State.PRUNED}]
    stored = store.stored_configs([row.id for row in rows])
    resolver = ConfigResolver()
    report = ReplanReport(sweep=name, resolved=len(rows), sweep_id=sweep.id)
    running: list[tuple] = []  # (row, resolved) of every cell that would run afterwards
    for row in rows:
        try:
            resolved = resolver.resolve(json.loads(row.settings_json))
        except OrchError as err:
            raise OrchError(f"cell {row.digest} of sweep {name}: its settings no longer resolve against conf/: "
                            f"{err}; nothing replanned") from None
        fields = {"digest": resolved.digest, "position": row.position, "axis": row.axis, "seed": row.seed,
                  "backend": row.backend, "settings_json": json.dumps(resolved.settings),
                  "overrides_json": json.dumps(resolved.overrides), "varied_json": row.varied_json,
                  "resources_json": row.resources_json}
        fields["config_json"], fields["cell_json"] = resolved.stored()
        if resolved.digest == row.digest:
            report.same[row.id] = fields
            running.append((row, resolved))
            continue
        report.what[row.digest] = _what_changed(stored.get(row.id), resolved.config.to_tree())
        if row.state in ACTIVE:
            report.blocked.append(f"cell {row.digest} of sweep {name} is {row.state}: it runs the config it was "
                                  f"planned with, but its settings now resolve to cell {resolved.digest}; let it end, "
                                  f"or `orch cancel {name} --cell {row.digest}`, then replan; nothing replanned")
            continue
        report.replaced.append(Replacement(row.id, fields))
        running.append((row, resolved))
    resolver.flush()
    replaced_ids = {item.cell_id for item in report.replaced}
    kept = {row.digest: row.state for row in all_rows if row.id not in replaced_ids}
    created: set[str] = set()
    by_id = {row.id: row for row in rows}
    for item in report.replaced:
        old, new = by_id[item.cell_id], item.fields["digest"]
        if new in kept:
            outcome = f"the sweep has it already ({kept[new]})"
        elif new in created:
            outcome = "the same config as another replaced cell"
        else:
            outcome = "new, pending"
            created.add(new)
        report.changed.append((old.digest, old.state, new, outcome))
    report.unchanged = len(report.same)
    report.plan = _stored_plan(sweep, [(row, resolved) for row, resolved in running
                                       if resolved.digest == row.digest or resolved.digest not in kept])
    return report


def replan(store: Store, name: str) -> ReplanReport:
    """Resolve every cell of sweep `name` that may still run (not finished, stopped or pruned) again from its stored
    settings against the current `conf/`, and store what it resolves to: a cell whose identity is unchanged keeps its
    row and takes the new config (a cell of an older store gets its first); a cell whose identity changed is
    replaced by a pending cell of the new identity (unless the sweep has that digest already), its attempts leaving
    the store (its MLflow run and checkpoints stay, under the old digest). Lost jobs are reconciled first. Refused,
    with one line and nothing
    written, for a study's sweep (its trials name their cells), for settings that no longer resolve, and for a
    queued or running cell whose identity changed (it runs its planned config: let it end, or cancel it, first)."""
    report = plan_replan(store, name)
    if report.blocked:
        raise OrchError(report.blocked[0] if len(report.blocked) == 1 else
                        f"{report.blocked[0]} (and {len(report.blocked) - 1} more such cell(s): --dry-run lists them)")
    store.replan(report.sweep_id, report.same, report.replaced, active=ACTIVE)
    return report


def _what_changed(stored: tuple[str, str] | None, now: dict) -> str:
    """The keys whose value differs between a cell's stored config and `now` (its `conf/` tree resolved today), in
    words: `trainer.val_size 2 -> 3`; a few, then how many more."""
    if stored is None:
        return "no stored config to compare (planned before configs were stored)"
    before: dict = {}
    for text in stored:
        before.update(json.loads(text))
    old, new = _leaves(before), _leaves(now)
    keys = [key for key in sorted(old.keys() | new.keys()) if old.get(key, _UNSET) != new.get(key, _UNSET)]
    shown = [f"{key} {_value(old.get(key, _UNSET))} -> {_value(new.get(key, _UNSET))}" for key in keys[:6]]
    more = f", and {len(keys) - 6} more key(s)" if len(keys) > 6 else ""
    return ", ".join(shown) + more if shown else "no key differs (an identity rule changed)"


_UNSET = object()


def _leaves(tree: dict, prefix: str = "") -> dict:
    out: dict = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _value(value: object) -> str:
    return "unset" if value is _UNSET else json.dumps(value)


def _stored_plan(sweep: SweepRow, cells: list[tuple]) -> Plan:
    """A `Plan` of a stored sweep's cells ((row, resolved config) each) as they would run: what the fit check before
    a submission reads (`orchestrator.preflight.fit_gate`); the sweep's name and file, not its definition."""
    from orchestrator.plan import Plan, PlannedCell, varied_keys
    from orchestrator.resources import Resources
    from orchestrator.spec import SweepDefinition, SweepSpec
    from orchestrator.yamlsource import YamlSource

    planned = [PlannedCell(index=row.position, digest=resolved.digest, axis=row.axis, settings=resolved.settings,
                           overrides=resolved.overrides, resources=Resources.model_validate_json(row.resources_json),
                           resolved=resolved) for row, resolved in cells]
    definition = SweepDefinition(spec=SweepSpec(name=sweep.name), source=YamlSource(path=Path(sweep.spec_path), data={}))
    return Plan(definition=definition, cells=planned, varied=varied_keys(planned))


def _is_study(sweep: SweepRow) -> bool:
    """Whether the sweep is an `orch tune` study (its file has a `study:` section)."""
    import yaml

    try:
        spec = yaml.safe_load(sweep.spec_text)
    except yaml.YAMLError:
        return False
    return isinstance(spec, dict) and spec.get("study") is not None


def cancel(store: Store, name: str, cells: Sequence[str] = ()) -> int:
    """Cancel the active and pending cells of a sweep (or only `cells`, digest prefixes). Returns how many."""
    sweep = store.require_sweep(name)
    rows = store.find_cells(sweep.id, cells) if cells else store.cell_rows(sweep.id)
    count = stop_cells(store, sweep, {row.id for row in rows}, State.CANCELLED, "cancelled by `orch cancel`",
                       ACTIVE | {State.PENDING})
    never_started = [row.mlflow_run_id for row in rows
                     if row.mlflow_run_id and row.state in (State.QUEUED, State.PENDING)]
    counts = store.counts(sweep.id)
    if not any(counts.get(state) for state in ACTIVE) and sweep.parent_run_id:
        never_started.append(sweep.parent_run_id)  # no job is left to end the sweep's parent run
    if never_started and sweep.tracking_uri:
        from orchestrator.tracking import end_runs

        end_runs(sweep.tracking_uri, never_started, "KILLED")
    return count


def stop_cells(store: Store, sweep: SweepRow, ids: Iterable[int], state: str, reason: str,
               only_states: Iterable[str]) -> int:
    """Move the cells `ids` that are in `only_states` to `state` (cancelled, pruned), then ask their running jobs
    to stop (they checkpoint and end; their late reports keep the state). Returns how many cells moved."""
    ids = set(ids)
    attempts = [attempt for attempt in store.active_attempts(sweep.id) if attempt.cell_id in ids]
    count = store.mark(list(ids), state, reason, only_states=only_states)
    moved = {cell_id for cell_id, now in store.cell_states(list(ids)).items() if now == state}
    by_executor: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        if attempt.cell_id in moved:
            by_executor.setdefault(attempt.executor, []).append(attempt)
    for executor, group in by_executor.items():
        get_executor(executor)(_context(store, sweep)).cancel(group)
    return count


def wait(store: Store, name: str, poll_s: float = 2.0, timeout_s: float | None = None,
         on_poll: Callable[[dict[str, int]], None] | None = None) -> dict[str, int]:
    """Block until no cell of the sweep is active; returns the final counts per state."""
    sweep = store.require_sweep(name)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        reconcile(store, sweep)
        counts = store.counts(sweep.id)
        if on_poll is not None:
            on_poll(counts)
        if not any(counts.get(state, 0) for state in ACTIVE):
            return counts
        if deadline is not None and time.monotonic() > deadline:
            raise OrchError(f"sweep {name}: still active after {timeout_s:g} s: {counts}")
        time.sleep(poll_s)
