"""The planned config is the config that runs (issue #47): the store keeps each cell's resolved config, its job loads
it (no Hydra composition) with its hosting keys and checks its identity; a queued cell survives an edit of conf/,
`orch resume --replan` resolves the cells again and says which identities changed; a store written before configs
were stored still resumes (its jobs compose with Hydra, as then)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.engine import cell_fields, replan, resume, save_sweep_row
from orchestrator.job import compose_cell_config
from orchestrator.plan import build_plan
from orchestrator.spec import load_sweep
from orchestrator.store import Replacement, Store
from orchlib.errors import OrchError
from recipes.config import compose
from recipes.config.resolve import load_config
from recipes.stats.collapse_alert import LEGACY_RULE
from tests.orchestrator.races import postgres_schema

# Written by orch at e79bc50 (before #47) with the orch-test backend: sweep `legacy`, cell 747c05377e4c3a28
# (task sokoban) finished, cell 096429ab49f177a3 (task frozenlake) pending; page size 1 KiB, vacuumed.
OLD_STORE = Path(__file__).with_name("data") / "store_v1_pre47.db"
SWEEP = """
    name: kept
    backend: orch-test
    base: {trainer: test, trainer.total_steps: 2}
    grid:
      task: [sokoban, frozenlake]
    seeds: [1]
"""


@pytest.fixture
def planned(sweep_file, test_backend, tracking):
    """Sweep `kept` planned and stored (2 pending cells, nothing submitted): (plan, store)."""
    plan = build_plan(load_sweep(sweep_file(SWEEP, "kept.yaml")))
    store = Store.open()
    sweep = save_sweep_row(store, plan.definition, "debug", plan.varied, tracking)
    assert store.add_cells(sweep.id, cell_fields(plan)) == 2
    return plan, store


@pytest.fixture
def edited_conf(tmp_path, monkeypatch):
    """conf/ with an edit that changes every cell's identity (trainer=test validates on 3 problems, not 2)."""
    conf = tmp_path / "conf-edited"
    shutil.copytree(compose.CONF_DIR, conf)
    path = conf / "trainer" / "test.yaml"
    path.write_text(path.read_text().replace("val_size: 2", "val_size: 3"))
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    return conf


def no_hydra(monkeypatch) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("composed with Hydra")

    monkeypatch.setattr(compose, "_compose", refuse)


def test_the_job_runs_the_stored_config_without_hydra(planned, sweep_file, monkeypatch) -> None:
    plan, store = planned
    sweep = store.require_sweep("kept")
    rows = store.cell_rows(sweep.id)
    cell = plan.cells[0]
    context = store.job_context(rows[0].id)  # written with the cell, as planned:
    assert {**json.loads(context.config_json), **json.loads(context.cell_json)} == cell.resolved.config.to_tree()
    assert json.loads(context.cell_json) == {"seed": 1}
    no_hydra(monkeypatch)
    cfg = compose_cell_config(context)
    assert cfg.digest() == rows[0].digest == cell.digest
    assert cfg.infra.checkpoint_dir == f"{sweep.run_dir}/checkpoints/{cell.digest}"
    assert (cfg.infra.mlflow.experiment_name, cfg.infra.progress) == ("kept", False)
    assert cfg.infra.mlflow.tracking_uri == sweep.tracking_uri
    more = build_plan(load_sweep(sweep_file(SWEEP.replace("kept", "more").replace("[1]", "[1, 2, 3]"), "more.yaml")))
    store.add_cells(save_sweep_row(store, more.definition, "debug", more.varied).id, cell_fields(more))
    with sqlite3.connect(".orch/orch.db") as db:  # one config row per shape (per task here), whatever the seeds
        assert db.execute("SELECT count(*), min(written_by) FROM configs").fetchone() == (2, "orch 0.1.0")
        assert db.execute("SELECT count(*) FROM cell_configs").fetchone() == (2 + 6,)


def test_a_stored_config_meets_a_changed_schema_with_one_line(planned) -> None:
    """A key the config schema gained since takes its default; a key it lost (or renamed) is refused, naming it."""
    _, store = planned
    context = store.job_context(store.cell_rows(store.require_sweep("kept").id)[0].id)
    tree = json.loads(context.config_json)
    del tree["mlflow"]["outage_s"]  # as if planned before the key existed
    assert load_config(json.dumps(tree), context.cell_json).infra.mlflow.outage_s == 1800.0
    tree["trainer"]["warmup"] = 3  # as if the schema had dropped (or renamed) trainer.warmup since
    with pytest.raises(OrchError) as refused:
        compose_cell_config(dataclasses.replace(context, config_json=json.dumps(tree)))
    line = str(refused.value)
    assert "\n" not in line and "trainer.warmup" in line and "does not fit this orch's config schema" in line
    assert "orch resume kept --replan" in line
    tree = json.loads(context.config_json)
    del tree["trainer"]["val_size"]  # a required key: no default to take
    with pytest.raises(OrchError, match=r"config key trainer.val_size: required"):
        load_config(json.dumps(tree), context.cell_json)
    with pytest.raises(OrchError, match=f"cell {context.digest} of sweep kept: its planned config hashes to"):
        compose_cell_config(dataclasses.replace(context, cell_json='{"seed": 99}'))  # no longer its cell


def test_a_queued_cell_survives_a_conf_edit_and_replan_takes_the_edit(planned, edited_conf, monkeypatch) -> None:
    plan, store = planned
    sweep = store.require_sweep("kept")
    planned_digests = {cell.digest for cell in plan.cells}
    first = store.cell_rows(sweep.id)[0]
    cfg = compose_cell_config(store.job_context(first.id))  # conf/ edited after planning: the plan still runs
    assert cfg.digest() == first.digest and cfg.trainer.val_size == 2

    store.record_submissions("slurm", [first.id])  # queued (no job id yet: never found vanished); replan refuses
    with pytest.raises(OrchError, match=f"cell {first.digest} of sweep kept is queued: it runs the config it was "
                                        "planned with"):
        replan(store, "kept")
    assert {row.digest for row in store.cell_rows(sweep.id)} == planned_digests  # nothing written
    store.mark([first.id], "cancelled", "test")

    result = CliRunner().invoke(app, ["resume", "kept", "--replan", "--cluster", "debug"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("sweep kept: 2 cell(s) that may still run resolved again against conf/: 0 same identity "
                        "(config stored again), 2 changed identity (replaced):")
    rows = store.cell_rows(sweep.id)
    assert {row.digest for row in rows}.isdisjoint(planned_digests) and len(rows) == 2
    states = {cell.digest: state for cell, state in zip(plan.cells, ("cancelled", "pending"), strict=True)}
    for row in rows:
        (old,) = [line for line in lines if line.endswith(f"-> cell {row.digest}: new, pending")]
        assert old.split()[1] in planned_digests and old.split()[2] == f"({states[old.split()[1]]})"
        assert row.state == "finished"  # the new identities ran (debug: in this process)
        assert compose_cell_config(store.job_context(row.id)).trainer.val_size == 3
    assert "submitted 2 with --cluster debug" in result.output


def test_replan_keeps_unchanged_cells_and_refuses_settings_that_no_longer_resolve(planned, tmp_path,
                                                                                   monkeypatch) -> None:
    plan, store = planned
    report = replan(store, "kept")
    assert (report.resolved, report.unchanged, report.changed) == (2, 2, [])
    assert [row.digest for row in store.cell_rows(store.require_sweep("kept").id)] == [c.digest for c in plan.cells]
    conf = tmp_path / "conf-without-frozenlake"
    shutil.copytree(compose.CONF_DIR, conf)
    (conf / "task" / "frozenlake.yaml").unlink()
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    with pytest.raises(OrchError, match="its settings no longer resolve against conf/: unknown task option 'frozenlake'"):
        replan(store, "kept")


def old_store(workdir: Path, tracking: str) -> Store:
    """The store file written before #47, copied here, its paths pointed at this working directory."""
    path = workdir / ".orch" / "orch.db"
    path.parent.mkdir(parents=True)
    shutil.copy(OLD_STORE, path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE sweeps SET spec_path = ?, run_dir = ?, tracking_uri = ?",
                   (str(workdir / "legacy.yaml"), str(workdir / ".orch" / "sweeps" / "legacy"), tracking))
    return Store.open(f"sqlite:///{path}", create=False)  # as `orch resume` opens it


@pytest.fixture
def conf_before_the_rule_choice(tmp_path, monkeypatch) -> Path:
    """conf/ as when the old store was written: the collapse alert's rule defaults before #46 chose a new one (LEGACY_RULE)."""
    conf = tmp_path / "conf-legacy-rule"
    shutil.copytree(compose.CONF_DIR, conf)
    path = conf / "train.yaml"
    text_ = path.read_text()
    for key, value in LEGACY_RULE.model_dump().items():  # whatever the rule's defaults are today
        line = re.compile(rf"^(    {key}: )\S+", re.M)
        assert line.search(text_), key
        text_ = line.sub(lambda m, v=value: m.group(1) + str(v), text_, count=1)
    path.write_text(text_)
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    return conf


def test_a_store_from_before_stored_configs_still_resumes(workdir, test_backend, tracking,
                                                          conf_before_the_rule_choice) -> None:
    store = old_store(workdir, tracking)
    context = store.job_context(2)
    assert context.config_json is None and context.digest == "096429ab49f177a3"  # no cell_configs table at all
    report = resume(store, "legacy", executor="debug")  # its job composes the overrides with Hydra, as then
    assert report.submitted == 1
    assert store.counts(store.require_sweep("legacy").id) == {"finished": 2}


def test_replan_gives_an_old_stores_cells_their_configs_under_the_same_identities(workdir, test_backend, tracking,
                                                                                 conf_before_the_rule_choice,
                                                                                 monkeypatch) -> None:
    store = old_store(workdir, tracking)
    report = replan(store, "legacy")  # conf/ as then: every identity as it was
    assert (report.resolved, report.unchanged, report.changed) == (1, 1, [])
    context = store.job_context(2)
    assert context.config_json is not None and context.digest == "096429ab49f177a3"
    no_hydra(monkeypatch)
    assert resume(store, "legacy", executor="debug").submitted == 1
    assert store.counts(store.require_sweep("legacy").id) == {"finished": 2}


def test_an_old_store_meets_todays_conf_with_one_line_and_replan_names_the_new_identity(workdir, test_backend,
                                                                                         tracking) -> None:
    """Today's conf/ chose a new rule for the collapse alert (#46, CHANGELOG): the old pending cell no longer hashes to its identity
    when composed; its job says so in one line, and replan replaces it, naming both identities."""
    store = old_store(workdir, tracking)
    context = store.job_context(2)
    with pytest.raises(OrchError) as refused:
        compose_cell_config(context)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("cell 096429ab49f177a3 of sweep legacy: conf/ changed since the sweep "
                                                "was planned") and "orch resume legacy --replan" in line
    report = replan(store, "legacy")
    assert (report.resolved, report.unchanged) == (1, 0)
    now = line.split("the config now hashes to ")[1].split(")")[0]
    assert report.changed == [("096429ab49f177a3", "pending", now, "new, pending")]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new store: an SQLite file, or a new schema of the PostgreSQL test database (ORCH_TEST_POSTGRES_URL)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'orch.db'}"
        return
    url = os.environ.get("ORCH_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("no PostgreSQL: set ORCH_TEST_POSTGRES_URL (bash scripts/setup_postgres.sh starts one and prints it)")
    with postgres_schema(url) as fresh:
        yield fresh


def fake_cells(digests: str, shared: str) -> list[dict]:
    return [{"digest": digest * 16, "position": index, "axis": None, "seed": index, "backend": "torch",
             "settings_json": "{}", "overrides_json": "[]", "varied_json": "{}", "resources_json": "{}",
             "config_json": shared, "cell_json": json.dumps({"seed": index})} for index, digest in enumerate(digests)]


def test_the_store_keeps_a_shapes_config_once_and_replans_in_one_transaction(store_url: str) -> None:
    store = Store.open(store_url)
    first, second = (store.save_sweep({"name": name, "spec_path": "s.yaml", "spec_text": "name: s",
                                       "executor": "local", "run_dir": "/tmp/s"}).id for name in ("s1", "s2"))
    with store.engine.begin() as connection:  # a store written before configs were kept: no tables for them
        connection.execute(text("DROP TABLE cell_configs"))
        connection.execute(text("DROP TABLE configs"))
    store = Store.open(store_url, create=False)  # as `orch resume` and the jobs open it
    assert store.add_cells(first, fake_cells("z", None)) == 1  # a cell planned then: no config
    assert store.job_context(store.cell_rows(first)[0].id).config_json is None
    assert store.add_cells(first, [*fake_cells("ab", '{"shape": 1}'), *fake_cells("c", '{"shape": 2}')]) == 3
    assert store.add_cells(second, fake_cells("ab", '{"shape": 1}')) == 2  # tables added on the first write
    with store.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM configs")).scalar() == 2  # one per shape, any sweep
        assert connection.execute(text("SELECT count(*) FROM cell_configs")).scalar() == 5
    rows = {row.digest[0]: row for row in store.cell_rows(first)}
    context = store.job_context(rows["b"].id)
    assert (context.config_json, json.loads(context.cell_json)) == ('{"shape": 1}', {"seed": 1})

    store.record_submissions("slurm", [rows["c"].id])
    same = {rows["a"].id: {**fake_cells("a", '{"shape": 3}')[0]}}
    replaced = [Replacement(rows["b"].id, fake_cells("d", '{"shape": 1}')[0]),
                Replacement(rows["c"].id, fake_cells("e", '{"shape": 2}')[0])]
    with pytest.raises(OrchError, match=f"cell {rows['c'].digest} is queued now"):
        store.replan(first, same, replaced, active=["queued"])
    assert {row.digest[0] for row in store.cell_rows(first)} == {"z", "a", "b", "c"}  # nothing written
    assert store.job_context(rows["a"].id).config_json == '{"shape": 1}'
    store.mark([rows["c"].id], "cancelled", "test")
    assert store.replan(first, same, replaced, active=["queued"]) == {rows["b"].id: "d" * 16, rows["c"].id: "e" * 16}
    after = {row.digest[0]: row for row in store.cell_rows(first)}
    assert set(after) == {"z", "a", "d", "e"} and after["a"].id == rows["a"].id and after["d"].state == "pending"
    assert store.job_context(after["a"].id).config_json == '{"shape": 3}'
    assert store.job_context(after["e"].id).config_json == '{"shape": 2}'
    assert store.attempts(rows["c"].id) == []  # the replaced cell's attempts left with it


def test_a_planned_cell_keeps_its_verl_trainer_when_the_default_changes(planned, tmp_path) -> None:
    """Issue 50 item 3: `verl.trainer` is hosting, so the default's change to v1 must not switch a planned cell. A
    cell planned today stores its trainer (v1) with its config; one planned while legacy was the default stored
    legacy and keeps it; one stored before the key existed ran the legacy trainer and keeps it; and a resume whose
    trainer is not the one that wrote the cell's checkpoints stops in one line (recipes.verl.backend.keep_trainer)."""
    from recipes.config.schema import TrainConfig, VerlHosting
    from recipes.verl.backend import keep_trainer

    assert VerlHosting().trainer == "v1"  # the default did change (conf/train.yaml's is checked below)
    _, store = planned
    context = store.job_context(store.cell_rows(store.require_sweep("kept").id)[0].id)
    tree = json.loads(context.config_json)
    assert tree["verl"]["trainer"] == "v1"  # planned under today's default: stored with the cell
    assert compose_cell_config(context).infra.verl.trainer == "v1"
    tree["verl"]["trainer"] = "legacy"  # planned while legacy was the default
    then = dataclasses.replace(context, config_json=json.dumps(tree))
    assert compose_cell_config(then).infra.verl.trainer == "legacy"
    del tree["verl"]["trainer"]  # stored before the key existed
    assert TrainConfig.from_tree({**tree, "seed": 1}).infra.verl.trainer == "v1"  # a fresh tree takes the default
    before = dataclasses.replace(context, config_json=json.dumps(tree))
    assert compose_cell_config(before).infra.verl.trainer == "legacy"
    folder = tmp_path / "verl"
    keep_trainer(folder, "legacy", None)  # the legacy cell's first attempt records its trainer
    keep_trainer(folder, compose_cell_config(then).infra.verl.trainer, 2)  # its resume: the same
    with pytest.raises(OrchError, match=r"^config key verl.trainer: v1, but this cell's checkpoints .* legacy") as err:
        keep_trainer(folder, "v1", 2)
    assert "\n" not in str(err.value)


def test_an_old_stores_cell_keeps_the_legacy_trainer_when_the_default_changes(workdir, tracking,
                                                                               conf_before_the_rule_choice) -> None:
    """A cell of a store from before stored configs is composed with Hydra on today's conf/, whose default trainer
    is v1: it ran the legacy trainer (the only one then) and keeps it."""
    train_yaml = conf_before_the_rule_choice / "train.yaml"
    assert "  trainer: v1 " in train_yaml.read_text()
    context = old_store(workdir, tracking).job_context(2)
    assert context.config_json is None and compose_cell_config(context).infra.verl.trainer == "legacy"


def test_eval_sweep_evaluates_the_stored_configs_not_todays_conf(planned, tmp_path, monkeypatch) -> None:
    """Issue 60: `orch eval --sweep S --best` resolved each finished cell's settings again against today's conf/ and
    refused a cell conf/ had moved since. It evaluates the config the store keeps for the cell, whatever conf/ holds:
    the evaluation cell is that config plus `evaluation.*`, and unchanged conf/ gives the same evaluation identities
    as before."""
    from orchestrator import evaluation
    from orchestrator.evaluation import EvalRequest, plan_evaluation

    plan, store = planned
    sweep = store.require_sweep("kept")
    with sqlite3.connect(".orch/orch.db") as db:  # both cells ran to their end (each kept a best checkpoint: below)
        db.execute("UPDATE cells SET state = 'finished'")
    monkeypatch.setattr(evaluation, "_has_checkpoint", lambda source, which: True)
    request = EvalRequest(episodes=8)
    before = {cell.resolved.config.training_digest(): cell.digest
              for cell in plan_evaluation(store, "kept", request).cells}
    from recipes.config.resolve import ConfigResolver

    resolver = ConfigResolver()  # what the evaluation cells were before: conf/ resolved again
    for row in store.cell_rows(sweep.id):
        settings = {**json.loads(row.settings_json), **request.settings(),
                    "evaluation.source": f"{sweep.run_dir}/checkpoints/{row.digest}"}
        assert resolver.resolve(settings).digest == before[row.digest]  # the same identities as then

    conf = tmp_path / "conf-edited-after"
    shutil.copytree(compose.CONF_DIR, conf)
    path = conf / "trainer" / "test.yaml"
    path.write_text(path.read_text().replace("val_size: 2", "val_size: 3"))  # a default changed after planning
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    with monkeypatch.context() as patch:
        no_hydra(patch)  # the stored configs: conf/ is not composed at all
        cells = plan_evaluation(store, "kept", request).cells
    assert {cell.resolved.config.training_digest(): cell.digest for cell in cells} == before
    for cell in cells:
        assert cell.resolved.config.trainer.val_size == 2  # the stored config's, not today's 3
        assert cell.resolved.config.evaluation.episodes == 8 and cell.settings["evaluation.episodes"] == 8
        assert "evaluation.episodes=8" in cell.overrides and "task=" + cell.settings["task"] in cell.overrides
    with sqlite3.connect(".orch/orch.db") as db:  # a store from before stored configs: resolved, refused if moved
        db.execute("DELETE FROM cell_configs")
    with pytest.raises(OrchError, match=r"now resolves to .* \(conf/ changed since it was planned, and the store "
                                        r"keeps no config for it\)"):
        plan_evaluation(store, "kept", request)


def test_replan_dry_run_lists_each_changed_identity_and_what_changed_writing_nothing(planned, edited_conf) -> None:
    """Issue 60: `orch resume --replan --dry-run`: one line per identity that would change (old -> new cell, the keys
    that changed with their old and new values), a queued cell's as refused, and nothing written to the store."""
    plan, store = planned
    sweep = store.require_sweep("kept")
    first, second = store.cell_rows(sweep.id)
    store.record_submissions("slurm", [first.id])  # queued: its change would be refused

    def snapshot():
        with sqlite3.connect(".orch/orch.db") as db:
            return [db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                    for table in ("cells", "attempts", "configs", "cell_configs")]

    before = snapshot()
    result = CliRunner().invoke(app, ["resume", "kept", "--replan", "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == ("sweep kept (dry run: nothing written): 2 cell(s) that may still run resolved again against "
                        "conf/: 0 would keep their identity (config stored again), 2 changed identity (would be "
                        "replaced):")
    (moved,) = [line for line in lines if line.startswith(f"  cell {second.digest} (pending) -> cell ")]
    assert moved.endswith(": new, pending; changed: trainer.val_size 2 -> 3"), moved
    (refused,) = [line for line in lines if line.startswith("  refused: ")]
    assert f"cell {first.digest} of sweep kept is queued" in refused
    assert refused.endswith("changed: trainer.val_size 2 -> 3")
    assert lines[-1] == "fit check: passed (or no verl GPU cell)"
    assert snapshot() == before  # nothing written
