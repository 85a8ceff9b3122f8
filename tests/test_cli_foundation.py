"""`orch predict-filter-gain` and `orch filter` as a user runs them: exit codes, messages, lazy imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
HEAVY = ("torch", "mlflow", "verl", "transformers", "pandas", "numpy", "plotly", "sqlalchemy", "scipy")


def orch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["predict-filter-gain", "--help"], ["filter", "--help"], ["runs", "--help"], ["report", "--help"]],
)
def test_help_imports_nothing_heavy(argv):
    code = (
        "import sys\n"
        f"sys.argv = ['orch', *{argv!r}]\n"
        "from orchestrator.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60).stdout
    assert "Usage" in out
    assert out.strip().splitlines()[-1] == "HEAVY="
    if argv == ["--help"]:
        assert " runs " in out and " report " in out


def test_shipped_examples_reproduce_from_the_script(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_example_batches.py"), str(tmp_path)], check=True)
    for name in ("sokoban_bimodal.parquet", "frozenlake_uniform.jsonl"):
        shipped = pd.read_parquet(EXAMPLES / name) if name.endswith("parquet") else pd.read_json(EXAMPLES / name, lines=True)
        fresh = pd.read_parquet(tmp_path / name) if name.endswith("parquet") else pd.read_json(tmp_path / name, lines=True)
        pd.testing.assert_frame_equal(shipped, fresh)


def test_predict_on_examples_gives_opposite_verdicts():
    bimodal = orch("predict-filter-gain", str(EXAMPLES / "sokoban_bimodal.parquet"), "--json")
    uniform = orch("predict-filter-gain", str(EXAMPLES / "frozenlake_uniform.jsonl"), "--json")
    assert bimodal.returncode == 0 and uniform.returncode == 0, bimodal.stderr + uniform.stderr
    bimodal_reports = json.loads(bimodal.stdout)["reports"]
    assert [r["step"] for r in bimodal_reports] == [1, 2, 3]
    assert all(r["verdict"] == "likely helps" for r in bimodal_reports)
    assert json.loads(uniform.stdout)["reports"][0]["verdict"] == "unlikely to help"


def test_predict_table_output_and_step_option():
    result = orch("predict-filter-gain", str(EXAMPLES / "sokoban_bimodal.parquet"), "--step", "2")
    assert result.returncode == 0, result.stderr
    assert "step 2" in result.stdout and "step 1" not in result.stdout
    assert "verdict" in result.stdout and "rho=0.9" in result.stdout


def test_predict_json_matches_library_call():
    from analysis.stats.predictor import predict_batch_file

    expected = predict_batch_file(EXAMPLES / "frozenlake_uniform.jsonl", metric="std")[0].to_json()
    result = orch("predict-filter-gain", str(EXAMPLES / "frozenlake_uniform.jsonl"), "--json", "--metric", "std")
    assert json.loads(result.stdout)["reports"][0] == json.loads(json.dumps(expected))


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content)
    return path


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.parquet", None, "no such rollout-batch file"),
        ("batch.xlsx", "x", "unknown rollout-batch format '.xlsx'"),
        ("batch.csv", "prompt_id,score\na,1\na,2\n", "missing required column(s) reward"),
        ("batch.csv", "prompt_id,reward\na,1\na,abc\n", "column 'reward' must hold finite numbers"),
        ("batch.csv", "prompt_id,reward\na,1\na,nan\n", "column 'reward' must hold finite numbers"),
        ("batch.csv", "prompt_id,reward\na,1\na,0\nb,1\n", "single trajectory"),
    ],
)
@pytest.mark.parametrize("command", ["predict-filter-gain", "filter"])
def test_bad_input_exits_2_with_one_line(tmp_path, name, content, message, command):
    path = tmp_path / name if content is None else write(tmp_path, name, content)
    result = orch(command, str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0] and str(path) in lines[0]
    assert result.stdout == ""


def test_bad_options_exit_2(tmp_path):
    batch = str(EXAMPLES / "frozenlake_uniform.jsonl")
    result = orch("predict-filter-gain", batch, "--metric", "mad")
    assert result.returncode == 2 and "valid choices: std, var" in result.stderr
    result = orch("filter", batch, "--strategy", "top_q")
    assert result.returncode == 2 and "top_p" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = orch("filter", batch, "--value", "1.5")
    assert result.returncode == 2 and "rho must be in (0, 1]" in result.stderr
    result = orch("predict-filter-gain", batch, "--step", "9")
    assert result.returncode == 2 and "available steps: 1" in result.stderr


def test_filter_json_uses_the_trainers_function(tmp_path):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=40) * np.repeat([3.0, 0.1, 1.0, 0.0, 2.0], 8)
    frame = pd.DataFrame({"prompt_id": np.repeat(list("abcde"), 8), "reward": rewards})
    path = tmp_path / "b.parquet"
    frame.to_parquet(path)
    result = orch("filter", str(path), "--strategy", "top_k_abs", "--value", "2", "--metric", "var", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["reports"][0]
    assert report["kept_groups"] == ["a", "e"]  # the two largest variances
    assert report["metrics"]["rollout/kept_groups"] == 2
    assert report["metrics"]["rollout/zero_variance_groups"] == 1
    table = orch("filter", str(path), "--strategy", "top_p", "--value", "0.9")
    assert table.returncode == 0 and "kept" in table.stdout


def test_filter_options_are_the_filter_configs_fields(tmp_path):
    from recipes.stats.filtering import FilterConfig

    help_text = orch("filter", "--help").stdout
    for field in FilterConfig.model_fields:
        assert "--" + field.replace("_", "-") in help_text
    batch = str(EXAMPLES / "sokoban_bimodal.parquet")
    result = orch("filter", batch, "--strategy", "top_k", "--value", "0.5", "--loss-scaling", "sqrt", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["reports"][0]
    assert report["loss_scale"] == pytest.approx(report["metrics"]["rollout/kept_ratio"] ** 0.5)
    result = orch("filter", batch, "--loss-scaling", "cubic")
    assert result.returncode == 2 and "valid choices: none, linear, sqrt" in result.stderr


def test_predict_reads_the_rollout_batch_a_run_logged(tmp_path):
    """`--run RUN_ID`: the batch the run dumped (its first step by default, or --step), the same report as the
    file; a wrong run, step or store is one line and exit 2, and nothing is created where no store was."""
    from mlflow import MlflowClient

    from analysis.stats.predictor import predict_batch_file

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    frame = pd.read_parquet(EXAMPLES / "sokoban_bimodal.parquet")
    for step in (1, 3):
        rows = frame[frame["step"] == step].drop(columns="step")
        (tmp_path / "rollouts").mkdir(exist_ok=True)
        rows.to_parquet(tmp_path / "rollouts" / f"step_{step:04d}.parquet")
        client.log_artifact(run_id, str(tmp_path / "rollouts" / f"step_{step:04d}.parquet"), "rollouts")
    result = orch("predict-filter-gain", "--run", run_id, "--tracking-uri", uri, "--json")
    assert result.returncode == 0, result.stderr
    (report,) = json.loads(result.stdout)["reports"]
    expected = predict_batch_file(EXAMPLES / "sokoban_bimodal.parquet", step=1)[0].to_json()
    assert {key: report[key] for key in ("step", "ratio", "verdict", "num_prompts")} == {
        key: json.loads(json.dumps(expected))[key] for key in ("step", "ratio", "verdict", "num_prompts")}
    assert report["source"] == f"run {run_id} step 1"
    third = orch("predict-filter-gain", "--run", run_id, "--tracking-uri", uri, "--step", "3", "--json")
    assert json.loads(third.stdout)["reports"][0]["step"] == 3
    for args, message in [
        (["--run", run_id, "--tracking-uri", uri, "--step", "2"], f"--step 2: run {run_id} logged rollout batches "
                                                                 "at steps [1, 3]"),
        (["--run", "0" * 32, "--tracking-uri", uri], f"--run {'0' * 32}: no such run"),
        (["--run", run_id, "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}"], "no MLflow store there"),
        ([str(EXAMPLES / "sokoban_bimodal.parquet"), "--run", run_id], "not both or neither"),
        ([], "not both or neither"),
    ]:
        result = orch("predict-filter-gain", *args)
        assert result.returncode == 2 and result.stdout == "", (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, (args, result.stderr)
    assert not (tmp_path / "none.db").exists()
