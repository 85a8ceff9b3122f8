"""`orch export SOURCE --hf DIR` (issue 28 item 3): a short torch-backend run exported from its MLflow run id loads
with transformers, tokenises the chat prompt as orch does, and gives orch's policy's logits and greedy reply."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

from orchestrator.cli import app
from recipes.config.schema import compose_train_config
from recipes.run.training import run_training
from recipes.runtime.checkpoint import latest_checkpoint, load_checkpoint


def trained(train_overrides: list[str], *extra: str):
    """A short GRPO Countdown run: (its config, its result, its tracking URI)."""
    cfg = compose_train_config([*train_overrides, "algorithm=grpo", "task=countdown", "trainer.val_every=0", *extra])
    return cfg, run_training(cfg), cfg.infra.mlflow.tracking_uri


def test_a_trained_run_exports_as_a_hugging_face_folder(train_overrides, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envs.episode import Episode
    from envs.registry import build_config, env_class
    from recipes.policy.chat import ChatEncoder
    from recipes.policy.models import load_policy, load_tokenizer
    from recipes.torch_trainer.warmstart import model_folder

    overrides = [*train_overrides, "algorithm=grpo", "task=countdown", "filter=none", "trainer.total_steps=2",
                 "trainer.val_every=0"]
    cfg = compose_train_config(overrides)
    result = run_training(cfg)
    assert result.status == "finished"
    uri = cfg.infra.mlflow.tracking_uri
    out = tmp_path / "exported"
    runner = CliRunner()
    done = runner.invoke(app, ["export", result.mlflow_run_id, "--hf", str(out), "--tracking-uri", uri])
    assert done.exit_code == 0, done.output
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"} <= {
        p.name for p in out.iterdir()}
    card = (out / "README.md").read_text()
    assert "algorithm: grpo" in card and result.mlflow_run_id in card and "## Last logged metrics" in card

    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    base, _ = model_folder(cfg)
    ours = load_policy(base, "float32", "cpu").eval()
    ours.load_state_dict(load_checkpoint(latest_checkpoint(Path(cfg.infra.checkpoint_dir)))["policy"])
    messages = Episode(env_class("countdown")(build_config("countdown", cfg.task.env)), 7).messages
    ids = ChatEncoder(load_tokenizer(base)).encode(messages, add_generation_prompt=True).input_ids
    theirs = AutoTokenizer.from_pretrained(out).apply_chat_template(messages, add_generation_prompt=True,
                                                                     tokenize=True, return_dict=False)
    assert list(theirs) == list(ids)  # the same chat prompt, token for token
    prompt = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(exported(prompt).logits, ours(prompt).logits)
        greedy = dict(max_new_tokens=8, do_sample=False, pad_token_id=exported.generation_config.pad_token_id)
        assert torch.equal(exported.generate(prompt, **greedy), ours.generate(prompt, **greedy))
    assert MlflowClient(uri).get_run(result.mlflow_run_id).info.status == "FINISHED"


def test_bad_sources_and_targets_exit_2_and_write_nothing(tmp_path) -> None:
    runner = CliRunner()
    cases = [
        (["export", str(tmp_path / "nope"), "--hf", str(tmp_path / "o")], "no such checkpoint folder or MLflow run"),
        (["export", str(tmp_path), "--hf", str(tmp_path / "o")], "no complete checkpoint in it"),
    ]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "ckpt" / "step_000001").mkdir(parents=True)
    torch.save({"policy": {}}, tmp_path / "ckpt" / "step_000001" / "state.pt")
    cases.append((["export", str(tmp_path / "ckpt" / "step_000001"), "--hf", str(tmp_path / "full")],
                  "exists and is not an empty folder"))
    cases.append((["export", str(tmp_path / "ckpt" / "step_000001"), "--hf", str(tmp_path / "o")],
                  "not a torch-backend checkpoint"))
    before = sorted(p.name for p in tmp_path.iterdir())
    for argv, expected in cases:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and expected in result.stderr, (argv, result.output)
        assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_orch_rollouts_writes_every_trajectory_with_its_turns_and_round_trips(train_overrides, tmp_path) -> None:
    """`orch rollouts RUN` (issue 28 item 4): one JSON record per trajectory of every dumped step, each turn with
    what it saw, its text, actions and reward; the JSONL reads back as the same rollout batch."""
    import json

    import pandas as pd

    from recipes.stats.rollouts import load_rollout_batch

    cfg, result, uri = trained(train_overrides, "trainer.total_steps=2", "trainer.dump_every=1")
    runner = CliRunner()
    printed = runner.invoke(app, ["rollouts", result.mlflow_run_id, "--tracking-uri", uri])
    assert printed.exit_code == 0, printed.output
    records = [json.loads(line) for line in printed.stdout.splitlines()]
    trajectories = cfg.trainer.prompts_per_step * cfg.trainer.samples_per_prompt
    assert len(records) == 2 * trajectories and {r["step"] for r in records} == {1, 2}
    for record in records:
        assert isinstance(record["kept"], bool) and len(record["turn_log"]) == record["turns"]
        assert sum(turn["reward"] for turn in record["turn_log"]) == pytest.approx(record["reward"])
        assert "\n".join(turn["response"] for turn in record["turn_log"]) == record["response"]
        assert record["turn_log"][0]["observation"] == record["prompt"]
    out = tmp_path / "r.jsonl"
    assert runner.invoke(app, ["rollouts", result.mlflow_run_id, "--step", "2", "--out", str(out),
                               "--tracking-uri", uri]).exit_code == 0
    back = load_rollout_batch(out)
    assert back.to_dict(orient="records") == [r for r in records if r["step"] == 2]
    parquet = tmp_path / "r.parquet"
    assert runner.invoke(app, ["rollouts", result.mlflow_run_id, "--format", "parquet", "--out", str(parquet),
                               "--tracking-uri", uri]).exit_code == 0
    assert len(pd.read_parquet(parquet)) == 2 * trajectories
    bad = runner.invoke(app, ["rollouts", result.mlflow_run_id, "--step", "9", "--tracking-uri", uri])
    assert bad.exit_code == 2 and "logged rollout batches at steps [1, 2]" in bad.stderr


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    from recipes.trained.evaluate import pass_at_k

    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0 and pass_at_k(5, 2, 1) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k(2, 1, 3)


def test_orch_eval_logs_a_linked_run_with_pass_at_k_and_a_rollout_batch(train_overrides, tmp_path) -> None:
    """`orch eval RUN` (issue 28 item 1): the run's newest checkpoint plays validation seeds into a new MLflow run
    tagged with its source run and step; its rollout batch is one `orch predict-filter-gain --run` reads."""
    cfg, result, uri = trained(train_overrides, "filter=none", "trainer.total_steps=3")
    runner = CliRunner()
    done = runner.invoke(app, ["eval", result.mlflow_run_id, "--episodes", "4", "--samples", "4", "--pass-k", "2",
                               "--tracking-uri", uri])
    assert done.exit_code == 0, done.output
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("orch-eval").experiment_id])
    assert run.data.tags["orch.eval.source_run"] == result.mlflow_run_id and run.data.tags["orch.eval.step"] == "3"
    metrics = run.data.metrics
    for key in ("eval/success_rate", "eval/reward_mean", "eval/pass_at_2", "eval/format_validity",
                "eval/response_length", "eval/num_turns_mean"):
        assert key in metrics, key
    assert 0.0 <= metrics["eval/success_rate"] <= metrics["eval/pass_at_2"] <= 1.0
    assert [a.path for a in client.list_artifacts(run.info.run_id, "rollouts")] == ["rollouts/step_0003.parquet"]
    predicted = runner.invoke(app, ["predict-filter-gain", "--run", run.info.run_id, "--tracking-uri", uri])
    assert predicted.exit_code == 0, predicted.output
    bad = runner.invoke(app, ["eval", result.mlflow_run_id, "--samples", "2", "--pass-k", "3", "--tracking-uri", uri])
    assert bad.exit_code == 2 and "--pass-k 3 needs --samples >= 3" in bad.stderr
    hf = runner.invoke(app, ["eval", str(Path(cfg.infra.checkpoint_dir)), "--task", "frozenlake", "--episodes", "2",
                             "--tracking-uri", uri])
    assert hf.exit_code == 0, hf.output  # a checkpoint folder, played on another task

    # Issue 45 item 2: SIGTERM while it plays ends `orch eval` at once with one line, exit 143, and no run left open
    import os
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "eval", result.mlflow_run_id, "--episodes",
                                "512", "--tracking-uri", uri], stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    for line in process.stderr:
        if line.startswith("evaluating"):
            process.send_signal(signal.SIGTERM)
            break
    rest = process.stderr.read()
    assert process.wait(timeout=60) == 128 + signal.SIGTERM, rest
    assert rest.strip().splitlines()[-1] == "orch eval: stopped by SIGTERM; no evaluation run is kept; run it again"
    assert "Traceback" not in rest, rest
    assert not client.search_runs([client.get_experiment_by_name("orch-eval").experiment_id],
                                  "attributes.status = 'RUNNING'")
