"""Evaluation cells of a trained sweep (`orch eval --sweep S --best`): re-evaluate each finished cell's best (or
latest) checkpoint on more validation episodes, as the cells of a sweep of their own, `S.eval`.

An evaluation cell is its training cell's config plus `evaluation.*` (`recipes.config.schema.EvalSection`: the source
checkpoint folder, which checkpoint, episodes, samples, temperature, pass@k, seed): the config the store keeps for the
training cell (what its job ran), not its settings resolved again against today's `conf/`, so an edit of `conf/`
since changes no evaluation (a cell of a store written before configs were stored is resolved against `conf/` and
refused if that changed its identity). It has an identity of its
own (the digest includes the evaluation section; a training cell's leaves it out) and goes through the same store,
executors, `orch status`, `orch resume` and `orch cancel` as any cell. Its MLflow runs go to experiment `S.eval`:
the report and tables of `S` never count them as training runs, and `orch report` reads them as the re-evaluated
peak of their source cells (tag `orch.eval.source_cell`).

    plan = plan_evaluation(store, "table4", EvalRequest(episodes=512))
    submit_plan(plan, store, "slurm")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.job import checkpoint_dir_of
from orchestrator.plan import Plan, PlannedCell, varied_keys
from orchestrator.resources import Resources
from orchestrator.spec import load_sweep
from orchestrator.states import DONE
from orchestrator.store import Store
from orchlib.errors import OrchError
from recipes.config.resolve import ConfigResolver, ResolvedConfig, load_config, resolve_stored
from recipes.trained.evaluate import EVAL_SUFFIX, eval_sweep_name, kept_checkpoint


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate of each finished cell, and how (the `evaluation.*` keys of its evaluation cell)."""

    checkpoint: str = "best"
    episodes: int = 512
    samples: int = 1
    temperature: float | None = None
    pass_k: int = 1
    seed: int = 0

    def settings(self) -> dict[str, Any]:
        found = {"evaluation.checkpoint": self.checkpoint, "evaluation.episodes": self.episodes,
                 "evaluation.samples": self.samples, "evaluation.pass_k": self.pass_k, "evaluation.seed": self.seed}
        if self.temperature is not None:
            found["evaluation.temperature"] = self.temperature
        return found


def _has_checkpoint(source: Path, which: str) -> bool:
    """Whether a cell's checkpoint folder holds a complete checkpoint of the kind asked for (`best` or `latest`)."""
    try:
        kept_checkpoint(source, which)
    except OrchError:
        return False
    return True


def plan_evaluation(store: Store, name: str, request: EvalRequest, resolver: ConfigResolver | None = None) -> Plan:
    """The evaluation sweep of every finished (or stopped) cell of stored sweep `name` that kept the checkpoint asked
    for (both trainers keep a best one when they validate: torch `best/step_N`, veRL `best/global_step_N/actor`).
    `OrchError` (one line) when the sweep is unknown, is itself an evaluation sweep, its file is gone, `conf/`
    changed its cells since, or no cell can be evaluated yet."""
    if name.endswith(EVAL_SUFFIX):
        raise OrchError(f"sweep {name} is an evaluation sweep: give the training sweep, {name[:-len(EVAL_SUFFIX)]}")
    sweep = store.require_sweep(name)
    definition = load_sweep(sweep.spec_path, profile=sweep.profile, sets=json.loads(sweep.sets_json or "[]"))
    definition.spec = definition.spec.model_copy(update={"name": eval_sweep_name(name)})
    rows = store.cell_rows(sweep.id)
    done = [row for row in rows if row.state in DONE]
    if not done:
        counts = ", ".join(f"{state} {count}" for state, count in sorted(store.counts(sweep.id).items()))
        raise OrchError(f"sweep {name}: no finished cell to evaluate yet ({counts or 'no cells'})")
    sources = {row.digest: checkpoint_dir_of(sweep.run_dir, row.digest) for row in done}
    kept = [row for row in done if _has_checkpoint(sources[row.digest], request.checkpoint)]
    if not kept:
        raise OrchError(f"sweep {name}: none of its {len(done)} finished cell(s) kept a {request.checkpoint} "
                        f"checkpoint (in {sweep.run_dir}/checkpoints/<cell>); the trainers keep a best one when they "
                        "validate (trainer.val_every > 0)")
    resolver = resolver or ConfigResolver()
    stored = store.stored_configs([row.id for row in kept])
    cells: list[PlannedCell] = []
    for row in kept:
        evaluation = {"evaluation.source": str(sources[row.digest]), **request.settings()}
        if row.id in stored:
            resolved = _from_stored(name, row, *stored[row.id], evaluation)
        else:  # a store from before configs were stored: resolved against conf/, refused if that moved it
            resolved = resolver.resolve({**json.loads(row.settings_json), **evaluation})
            trained = resolved.config.training_digest()
            if trained != row.digest:
                raise OrchError(f"sweep {name}: cell {row.digest} now resolves to {trained} (conf/ changed since "
                                "it was planned, and the store keeps no config for it); evaluate it with `orch eval "
                                "SOURCE` instead")
        cells.append(PlannedCell(index=len(cells), digest=resolved.digest, axis=row.axis, settings=resolved.settings,
                                 overrides=resolved.overrides,
                                 resources=Resources.model_validate_json(row.resources_json), resolved=resolved))
    resolver.flush()
    plan = Plan(definition=definition, cells=cells, varied=varied_keys(cells))
    if len(kept) < len(done):
        plan.notes.append(f"{len(done) - len(kept)} finished cell(s) left out: they kept no {request.checkpoint} "
                          "checkpoint (trainer.val_every=0, or trained before their backend kept one)")
    if len(done) < len(rows):
        plan.notes.append(f"{len(rows) - len(done)} cell(s) of {name} have not finished: run this again once they "
                          "have (only the missing evaluations are submitted)")
    return plan


def _from_stored(name: str, row: Any, shared: str, own: str, evaluation: dict[str, Any]) -> ResolvedConfig:
    """The evaluation cell of training cell `row` from the config the store keeps for it (what its job ran) plus the
    `evaluation` keys; its settings and overrides are the cell's plus those keys (what a person reads). `OrchError`
    when the stored config no longer loads (a schema change) or no longer hashes to the cell."""
    try:
        trained = load_config(shared, own)
        resolved = resolve_stored(shared, own, evaluation)
    except OrchError as err:
        raise OrchError(f"sweep {name}: cell {row.digest}: its stored config does not fit this orch's config schema: "
                        f"{err}; evaluate it with `orch eval SOURCE` instead") from None
    if trained.digest() != row.digest or resolved.config.training_digest() != row.digest:
        raise OrchError(f"sweep {name}: cell {row.digest}: its stored config hashes to {trained.digest()} under this "
                        "orch (an identity rule changed); evaluate it with `orch eval SOURCE` instead")
    settings = {**json.loads(row.settings_json), **resolved.settings}
    return ResolvedConfig(resolved.config, resolved.digest, settings,
                          [*json.loads(row.overrides_json), *resolved.overrides])
