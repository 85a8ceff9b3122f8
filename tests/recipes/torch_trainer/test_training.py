"""End-to-end runs of the torch backend on CPU (micro model, 2 prompts x 2 samples): every algorithm, filtering,
empty batches, checkpoint/resume equivalence, pre-emption, MLflow bookkeeping and the rollout-batch artifacts."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

import recipes.diagnostics.monitor
import recipes.stats.filtering
from orchlib.errors import OrchError
from recipes.config.schema import compose_train_config
from recipes.diagnostics import hooks, registry
from recipes.run.tracking import PEAK_MEMORY_METRIC
from recipes.run.training import run_training
from recipes.runtime.checkpoint import latest_checkpoint
from recipes.stats.rollouts import load_rollout_batch
from recipes.torch_trainer import trainer as torch_trainer


def client(overrides: list[str]) -> MlflowClient:
    uri = next(o.split("=", 1)[1] for o in overrides if o.startswith("mlflow.tracking_uri="))
    return MlflowClient(uri)


def history(mlflow: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric's (step, value) list; measurements of the machine (wall time, the process's peak memory: in
    this pytest process it is whatever the earlier tests left, so two runs differ by chance) and resume
    bookkeeping excluded."""
    keys = mlflow.get_run(run_id).data.metrics
    return {
        key: sorted((m.step, m.value) for m in mlflow.get_metric_history(run_id, key))
        for key in keys if not key.startswith(("timing_s/", "resume/")) and key != PEAK_MEMORY_METRIC
    }


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm=ppo", "task=sokoban"],
        ["algorithm=grpo", "task=frozenlake", "algorithm.use_kl=true"],
        ["algorithm=dapo", "task=countdown"],
        ["algorithm=dapo_dynamic", "task=countdown"],
        ["algorithm=drgrpo", "task=metamathqa"],
    ],
    ids=["ppo", "grpo-kl", "dapo", "dapo_dynamic", "drgrpo"],
)
def test_two_steps_of_every_algorithm(train_overrides, extra) -> None:
    overrides = [*train_overrides, "filter=none", *extra]
    result = run_training(compose_train_config(overrides))
    assert (result.status, result.steps_done) == ("finished", 2), result.reason
    mlflow = client(overrides)
    run = mlflow.get_run(result.mlflow_run_id)
    metrics = history(mlflow, result.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert [step for step, _ in metrics["actor/pg_loss"]] == [1, 2]
    assert [step for step, _ in metrics["val/success_rate"]] == [0, 1, 2]
    assert all(math.isfinite(value) for values in metrics.values() for _, value in values)
    name = extra[0].split("=")[1]
    assert ("critic/vf_loss" in metrics) == (name in ("ppo", "dapo"))  # RAGEN-2's DAPO is PPO with clip-higher
    assert ("rollout/dynamic_sampling_groups" in metrics) == (name == "dapo_dynamic")
    assert ("actor/kl_loss" in metrics) == ("algorithm.use_kl=true" in extra)
    for key in ("rollout/kept_ratio", "actor/entropy", "actor/grad_norm", "response_length/mean", "timing_s/gen"):
        assert key in run.data.metrics
    assert {run.data.tags[k] for k in ("task", "algorithm", "model", "backend")} >= {"torch", "micro"} - {"micro"}
    assert run.data.params["algorithm.name"] == extra[0].split("=")[1]
    artifacts = [a.path for a in mlflow.list_artifacts(result.mlflow_run_id, "rollouts")]
    assert artifacts == ["rollouts/step_0001.parquet", "rollouts/step_0002.parquet"]
    frame = load_rollout_batch(mlflow.download_artifacts(result.mlflow_run_id, artifacts[0], str(Path.cwd())))
    assert len(frame) == 4 and set(frame["step"]) == {1}
    assert {"prompt_id", "reward", "sample", "response_length", "prompt", "response", "turns", "success"} <= set(frame)
    assert sorted(frame.groupby("prompt_id")["sample"].apply(list).sum()) == [0, 0, 1, 1]


def test_dynamic_sampling_runs_the_shared_rule(monkeypatch) -> None:
    """`collect_rollouts` with dynamic sampling is `recipes.stats.dynamic_sampling.gather_groups` on the step's
    generation batches (the seeds of `train_prompt_seeds`, batch by batch): the shared scenario's groups and
    metrics (tests/recipes/stats/test_dynamic_sampling.py), the batches it needs generated and no more."""
    from types import SimpleNamespace

    from recipes.runtime.seeds import train_prompt_seeds
    from tests.recipes.stats import test_dynamic_sampling as shared

    cfg = SimpleNamespace(seed=3, trainer=SimpleNamespace(prompts_per_step=shared.PROMPTS, samples_per_prompt=2),
                          algorithm=SimpleNamespace(dynamic_sampling=True, max_extra_gen_batches=shared.MAX_EXTRA))
    step, played = 5, []
    batch_of = {tuple(train_prompt_seeds(cfg.seed, step, shared.PROMPTS, extra)): extra
                for extra in range(shared.MAX_EXTRA + 1)}

    def play(cfg_, sampler, seeds, samples):
        extra = batch_of[tuple(seeds)]
        played.append(extra)
        groups = list(shared.SCENARIO[extra].items())
        return [SimpleNamespace(seed=seed, name=name, episode_return=value)
                for seed, (name, values) in zip(seeds, groups, strict=True) for value in values]

    monkeypatch.setattr(torch_trainer, "play", play)
    kept, metrics = torch_trainer.collect_rollouts(cfg, None, step)
    assert list(dict.fromkeys(t.name for t in kept)) == shared.UPDATE_GROUPS and played == [0, 1, 2]
    assert [t.episode_return for t in kept] == shared.UPDATE_RETURNS and metrics == shared.METRICS


class Counting(hooks.StepHook):
    """A stateful hook: counts its calls, sees the step's metrics and the latest validation."""

    restored: list[dict] = []

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.calls = 0

    def on_rollout(self, ctx: hooks.StepContext) -> dict[str, float]:
        assert "rollout/reward_mean" in ctx.metrics and "val/success_rate" in ctx.validation
        assert len(ctx.trajectories) == len(ctx.group_ids) == 4 and ctx.batch is None
        self.calls += 1
        return {"hook/calls": float(self.calls)}

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        Counting.restored.append(state)
        self.calls = state["calls"]


def test_hook_metrics_and_state_travel_through_checkpoints(train_overrides, monkeypatch) -> None:
    monkeypatch.setattr(registry.HOOKS, "entries", {**registry.HOOKS.entries, "counting": Counting})
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "hooks=[counting]"]
    first = run_training(compose_train_config([*overrides, "trainer.total_steps=1"]))
    second = run_training(compose_train_config([*overrides, "trainer.total_steps=2"]))
    assert Counting.restored == [{"calls": 1}]
    history = client(overrides).get_metric_history(second.mlflow_run_id, "hook/calls")
    assert first.mlflow_run_id == second.mlflow_run_id and [(m.step, m.value) for m in history] == [(1, 1), (2, 2)]


def test_filter_shrinks_the_update_to_exactly_the_kept_groups(train_overrides, recorder, monkeypatch) -> None:
    """4 groups; the real filter runs on synthetic rewards in which only the first group has real spread."""
    real_filter = recipes.stats.filtering.filter_groups

    def synthetic(rewards, group_ids, config):
        first = group_ids == group_ids[0]
        spread = np.where(first, np.arange(len(rewards)) * 10.0, 0.0)
        return real_filter(np.asarray(rewards) * 0 + spread + 0.01 * (~first) * np.arange(len(rewards)), group_ids,
                           config)

    monkeypatch.setattr(recipes.stats.filtering, "filter_groups", synthetic)
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=top_p", "trainer.total_steps=1",
                 "trainer.prompts_per_step=4", "trainer.val_every=0", "hooks=[recorder]"]
    result = run_training(compose_train_config(overrides))
    metrics = client(overrides).get_run(result.mlflow_run_id).data.metrics
    (seen,) = recorder.seen
    groups, updated = [g for g, _ in seen["all"]], [g for g, _ in seen["update"]]
    assert len(groups) == 8 and updated == [groups[0]] * 2  # exactly the kept group's 2 samples
    assert metrics["rollout/kept_groups"] == 1 and metrics["rollout/kept_ratio"] == 0.25
    assert metrics["rollout/update_trajectories"] == 2
    assert metrics["actor/optimizer_steps"] == 1  # mini-batches of 2: 1 instead of 4 without filtering


def test_empty_batches_skip_the_update_and_stop_the_run(train_overrides) -> None:
    """A random policy earns the same (format-penalty) return on every sample: no group has reward variance."""
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=top_p", "trainer.total_steps=5",
                 "trainer.max_empty_steps=2", "trainer.val_every=0"]
    result = run_training(compose_train_config(overrides))
    assert (result.status, result.steps_done) == ("stopped", 2)
    assert "trainer.max_empty_steps" in result.reason
    metrics = client(overrides).get_run(result.mlflow_run_id).data.metrics
    assert metrics["rollout/kept_groups"] == 0 and metrics["rollout/empty_steps"] == 2
    assert "actor/pg_loss" not in metrics


def test_resume_equals_an_uninterrupted_run(train_overrides, tmp_path) -> None:
    base = [*train_overrides, "algorithm=ppo", "task=countdown", "filter=none", "trainer.val_every=2",
            "trainer.save_every=0"]
    straight = run_training(compose_train_config(
        [*base, "trainer.total_steps=4", f"trainer.checkpoint_dir={tmp_path / 'straight'}"]))
    split = [*base, f"trainer.checkpoint_dir={tmp_path / 'split'}"]
    first = run_training(compose_train_config([*split, "trainer.total_steps=2"]))
    second = run_training(compose_train_config([*split, "trainer.total_steps=4"]))
    assert (first.status, second.status, second.steps_done) == ("finished", "finished", 4)
    assert first.mlflow_run_id == second.mlflow_run_id  # the resumed run continues the same MLflow run
    mlflow = client(base)
    replayed = mlflow.get_metric_history(second.mlflow_run_id, "resume/replayed_steps")
    assert [(m.step, m.value) for m in replayed] == [(2, 0.0)]  # resumed from the last step it logged
    expected, got = history(mlflow, straight.mlflow_run_id), history(mlflow, second.mlflow_run_id)
    assert got.keys() == expected.keys()
    for key in expected:
        assert [s for s, _ in got[key]] == [s for s, _ in expected[key]], key  # no duplicated, no missing steps
        assert np.allclose([v for _, v in got[key]], [v for _, v in expected[key]], rtol=1e-5, atol=1e-6), key


class StopAt:
    """A `should_stop` that turns true once step `step` has entered `phase` (a timed phase name, or "logging" after
    the step), read from the trainer's progress reports: the stop lands inside the phase by events, not by time.
    `polls_after` counts the polls after it turned true."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, step: int, phase: str) -> None:
        self.target, self.step, self.fired, self.polls_after = (step, phase), 0, False, 0
        real = torch_trainer.report

        def spy(**fields) -> None:
            self.step = fields.get("step", self.step)
            if fields.get("phase") is not None and (self.step, fields["phase"]) == self.target:
                self.fired = True
            real(**fields)

        monkeypatch.setattr(torch_trainer, "report", spy)

    def __call__(self) -> bool:
        self.polls_after += self.fired
        return self.fired


def test_stop_request_checkpoints_and_resume_finishes(train_overrides, tmp_path, monkeypatch) -> None:
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "trainer.total_steps=3",
                 "trainer.save_every=0", "trainer.val_every=0"]
    preempted = run_training(compose_train_config(overrides), should_stop=StopAt(monkeypatch, 1, "logging"))
    assert (preempted.status, preempted.steps_done) == ("preempted", 1)
    assert preempted.reason == "stop requested; checkpoint at step 1"
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_000001"
    mlflow = client(overrides)
    assert mlflow.get_run(preempted.mlflow_run_id).info.status == "KILLED"
    resumed = run_training(compose_train_config(overrides))
    assert (resumed.status, resumed.steps_done, resumed.mlflow_run_id) == ("finished", 3, preempted.mlflow_run_id)
    steps = [m.step for m in mlflow.get_metric_history(resumed.mlflow_run_id, "actor/pg_loss")]
    assert steps == [1, 2, 3]


STRAIGHT: dict[str, str] = {}


# (phase the stop lands in, at step 2 of 3) -> (steps kept, the reason's phase): a stop before the validation drops
# the step (the model is still step 1's, or, in the update, put back as step 1 left it: the critic's update, done
# before the actor's, undone too); a stop in the validation keeps the step.
@pytest.mark.parametrize(("phase", "kept", "said"), [
    ("gen", 1, "the rollout"), ("diagnostics", 1, "the diagnostics"), ("old_log_prob", 1, "the scoring"),
    ("update_critic", 1, "the update"), ("update_actor", 1, "the update"), ("val", 2, "the validation"),
])
def test_a_stop_inside_a_phase_ends_it_and_the_resume_equals_an_uninterrupted_run(
        train_overrides, tmp_path, monkeypatch, phase, kept, said) -> None:
    monkeypatch.setattr(recipes.diagnostics.monitor, "raw_reasoning", lambda response: response or None)  # a micro model's
    base = [*train_overrides, "algorithm=ppo", "task=countdown", "filter=none", "trainer.val_every=1",  # replies
            "trainer.save_every=0", "trainer.total_steps=3", "hooks=[collapse]", "diagnostics.num_samples=4",
            "diagnostics.batch_size=4", "diagnostics.mi_every=1"]
    if "straight" not in STRAIGHT:  # one uninterrupted run for every phase (the MLflow store is the session's)
        STRAIGHT["straight"] = run_training(compose_train_config(
            [*base, f"trainer.checkpoint_dir={tmp_path / 'straight'}"])).mlflow_run_id
    split = [*base, f"trainer.checkpoint_dir={tmp_path / 'split'}"]
    stop = StopAt(monkeypatch, 2, phase)
    stopped = run_training(compose_train_config(split), should_stop=stop)
    assert (stopped.status, stopped.steps_done) == ("preempted", kept)
    assert stopped.reason.startswith(f"stop requested during {said} of step 2; checkpoint at step {kept}")
    assert stop.polls_after == 1  # the first poll inside the phase ended it (the loop polls between steps too)
    assert latest_checkpoint(tmp_path / "split").name == f"step_{kept:06d}"
    resumed = run_training(compose_train_config(split))
    assert (resumed.status, resumed.steps_done, resumed.mlflow_run_id) == ("finished", 3, stopped.mlflow_run_id)
    mlflow = client(base)
    expected, got = history(mlflow, STRAIGHT["straight"]), history(mlflow, resumed.mlflow_run_id)
    assert got.keys() == expected.keys()
    for key in expected:  # no step lost or logged twice, the dropped step redone exactly (hook states rewound)
        assert [s for s, _ in got[key]] == [s for s, _ in expected[key]], key
        assert np.allclose([v for _, v in got[key]], [v for _, v in expected[key]], rtol=1e-5, atol=1e-6), key


def test_a_non_finite_loss_fails_the_run_without_a_checkpoint(train_overrides, tmp_path, monkeypatch) -> None:
    real_update = torch_trainer.update_actor
    monkeypatch.setattr(torch_trainer, "update_actor", lambda *a, **k: {**real_update(*a, **k), "actor/pg_loss": math.nan})
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "trainer.val_every=0"]
    result = run_training(compose_train_config(overrides))
    assert (result.status, result.steps_done) == ("failed", 1) and "non-finite" in result.reason
    assert client(overrides).get_run(result.mlflow_run_id).info.status == "FAILED"
    assert latest_checkpoint(tmp_path / "checkpoints") is None


def test_attaches_to_a_precreated_run(train_overrides) -> None:
    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "trainer.total_steps=1",
                 "trainer.val_every=0"]
    mlflow = client(overrides)
    experiment = mlflow.get_experiment_by_name("sweep-x") or mlflow.get_experiment(mlflow.create_experiment("sweep-x"))
    run_id = mlflow.create_run(experiment.experiment_id, run_name="cell").info.run_id
    result = run_training(compose_train_config([*overrides, f"mlflow.run_id={run_id}"]))
    assert result.mlflow_run_id == run_id and mlflow.get_run(run_id).info.status == "FINISHED"


def test_a_local_hugging_face_checkpoint_is_a_model(train_overrides, micro_folder, tmp_path) -> None:
    """model=hf with a folder: its own tokenizer and chat template (here one that injects a default system prompt
    when there is none, as Qwen2.5's does)."""
    import shutil

    from recipes.policy.models import load_tokenizer

    folder = tmp_path / "checkpoint"
    shutil.copytree(micro_folder, folder, ignore=shutil.ignore_patterns("inputs.json"))
    tokenizer = load_tokenizer(folder)
    tokenizer.chat_template = (
        "{%- if messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nBe helpful.<|im_end|>\\n' }}{%- endif %}"
        + tokenizer.chat_template
    )
    tokenizer.save_pretrained(folder)
    overrides = [*train_overrides, "model=hf", f"model.path={folder}", "algorithm=grpo", "task=countdown",
                 "filter=none", "trainer.total_steps=1", "trainer.val_every=0"]
    result = run_training(compose_train_config(overrides))
    assert result.status == "finished"
    assert client(overrides).get_run(result.mlflow_run_id).data.tags["model"] == "hf"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["algorithm.name=reinforce"], "unknown algorithm 'reinforce'; valid choices: dapo, dapo_dynamic, drgrpo, grpo, ppo"),
        (["task.env.max_turns=0"], "env sokoban: max_turns: Input should be greater than or equal to 1"),
        (["hooks=[nosuch]"], "unknown step hook 'nosuch'"),
        (["mlflow.run_id=doesnotexist"], "config key mlflow.run_id: no run 'doesnotexist'"),
    ],
)
def test_bad_config_fails_before_any_work(train_overrides, tmp_path, extra, message) -> None:
    overrides = [*train_overrides, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'fresh.db'}", *extra]
    with pytest.raises(OrchError, match=message):
        run_training(compose_train_config(overrides))
    assert not (tmp_path / "checkpoints").exists()


def test_each_timed_phase_is_a_profiler_range() -> None:
    """`timed` adds the block's wall time to its metric and, under torch's profiler, marks the block as the range
    `phase/<name>` that benchmarks/bench_step_limits.py --floor attributes kernels to (the innermost one wins)."""
    import torch
    from torch.profiler import profile

    metrics: dict[str, float] = {}
    a = torch.randn(64, 64)
    with profile() as prof, torch_trainer.timed(metrics, "outer"), torch_trainer.timed(metrics, "inner"):
        a @ a
    ranges = {event.name: event for event in prof.events() if event.name.startswith("phase/")}
    assert set(ranges) == {"phase/outer", "phase/inner"}
    assert set(metrics) == {"timing_s/outer", "timing_s/inner"} and metrics["timing_s/outer"] >= metrics["timing_s/inner"]
    matmul = next(event for event in prof.events() if event.name == "aten::mm")
    inner = ranges["phase/inner"].time_range
    assert inner.start <= matmul.time_range.start and matmul.time_range.end <= inner.end


def test_the_old_log_probs_are_the_samplers_and_a_blinded_row_is_scored(train_overrides, monkeypatch) -> None:
    """A float32 policy's old log-probs come from its sampler (no scoring pass over those rows) and equal that
    pass's to float tolerance; under the blind control the blinded rows' replies were drawn from another context,
    so not every row is read from the sampler (and the rows that are not are scored: the result still equals the
    pass)."""
    import torch

    from recipes.run.tracking import RunTracker

    checked = []
    own = torch_trainer.sampled_or_scored

    def compared(log_probs, policy, batch, micro):
        result = own(log_probs, policy, batch, micro)
        scored = torch_trainer.batched_forward(log_probs, policy, batch, micro)
        assert torch.allclose(result, scored, rtol=1e-4, atol=1e-4)
        checked.append(batch.sampled_rows.copy())
        return result

    monkeypatch.setattr(torch_trainer, "sampled_or_scored", compared)
    for extra, blinded in ((["filter=none"], False), (["filter=none", "control.blind_from_step=1"], True)):
        cfg = compose_train_config([*train_overrides, *extra, "trainer.total_steps=1"])
        tracker = RunTracker(cfg.infra.mlflow.tracking_uri, "test", run_id=None, run_name="sampled")
        run, _ = torch_trainer.setup(cfg, tracker, Path.cwd() / "checkpoints" / extra[-1])
        torch_trainer.rollout_and_score(run, 1, {})
        assert bool(checked[-1].all()) is not blinded  # blinded: some rows' replies were not drawn from their own chat
    assert len(checked) == 2
