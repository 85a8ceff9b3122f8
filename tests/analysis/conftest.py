"""A synthetic sweep in a real MLflow SQLite store, built with known answers (MLflow's own client writes it).

Sweep ``demo`` (experiment ``demo``, a parent run, one child run per cell, tagged like the sweep engine does):
tasks sokoban and frozenlake x algorithms ppo and grpo x filter none / top_p (rho 0.9) x seeds 0 and 1 -- 16
finished cells -- plus a FAILED cell and a SCHEDULED cell with no metrics.

Per finished cell (``expected_peak`` gives the peak success as a fraction):

* ``val/success_rate`` every 10 steps on 0..60: rises linearly to its peak at step 30, then falls to half of it at
  step 60 (the decline rule first holds at step 50);
* ``collapse/trajectory/mi_zscore_ema`` every 5 steps: 2.0 up to step 10, then (baseline runs only) falling
  linearly by 2% of 2.0 per step (first at or below 70% of the peak at step 25); filtered runs keep 2.0;
* ``collapse/alert``: baseline runs 0 before step 30 and 1 from step 30; filtered runs 0;
* every step 1..60: ``timing_s/step`` 10 s (baseline) or 7 s (filtered); kept ratio 1.0 / 0.5, kept groups 8 / 4
  of 8, kept samples 64 / 32; chosen-group RV 0.3 / 0.45; entropy 1 + 0.01 step; response length 100 - step;
  reward mean = success peak fraction; ``rollout/in_group_reward_std_mean`` 0.5 - 0.005 step.

Baseline seed-0 and seed-1 runs carry rollout batches at steps 0 and 10: sokoban's bimodal (3 of 8 prompts with
reward variance, ratio std/mean of RV = sqrt(5/3) ≈ 1.29), frozenlake's uniform (every prompt the same, ratio 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

TASKS = ("sokoban", "frozenlake")
ALGORITHMS = ("ppo", "grpo")
BASE = {("sokoban", "ppo"): 0.20, ("sokoban", "grpo"): 0.15, ("frozenlake", "ppo"): 0.60, ("frozenlake", "grpo"): 0.55}
GAIN = {("sokoban", "ppo"): 0.10, ("sokoban", "grpo"): 0.05, ("frozenlake", "ppo"): 0.02, ("frozenlake", "grpo"): -0.03}
SEED_OFFSET = 0.02
STEPS = 60


def expected_peak(task: str, algorithm: str, filtered: bool, seed: int) -> float:
    return BASE[task, algorithm] + (GAIN[task, algorithm] if filtered else 0.0) + SEED_OFFSET * seed


def success_at(step: int, peak: float) -> float:
    return peak * step / 30 if step <= 30 else peak * (1 - 0.5 * (step - 30) / 30)


def mi_at(step: int, filtered: bool) -> float:
    return 2.0 if filtered or step <= 10 else 2.0 * (1 - (step - 10) / 50)


def rollout_batch(task: str, step: int) -> pd.DataFrame:
    """8 prompts x 8 samples; sokoban: prompts 0-2 alternate rewards 0 / 10, the rest all 0; frozenlake: every
    prompt alternates 0 / 1."""
    rows = []
    for prompt in range(8):
        for sample in range(8):
            spread = (10.0 if prompt < 3 else 0.0) if task == "sokoban" else 1.0
            reward = spread * (sample % 2)
            rows.append({"prompt_id": f"p{prompt}", "reward": reward, "step": step, "sample": sample})
    return pd.DataFrame(rows)


def _params(task: str, algorithm: str, filtered: bool, seed: int) -> dict[str, str]:
    return {
        "task.name": task,
        "task.env.max_turns": "5" if task == "sokoban" else "4",
        "algorithm.name": algorithm,
        "algorithm.clip_ratio_high": "0.28" if algorithm == "ppo" else "0.2",
        "model.name": "tiny",
        "model.path": "None",
        "filter.name": "top_p" if filtered else "none",
        "filter.strategy": "top_p" if filtered else "none",
        "filter.value": "0.9" if filtered else "1.0",
        "filter.prob_mode": "linear",
        "seed": str(seed),
        "trainer.prompts_per_step": "8",
        "trainer.samples_per_prompt": "8",
        "backend": "torch",
        "mlflow.experiment_name": "demo",
    }


def _metrics(task: str, algorithm: str, filtered: bool, seed: int) -> list[tuple[str, float, int]]:
    peak = expected_peak(task, algorithm, filtered, seed)
    entries = [("val/success_rate", success_at(step, peak), step) for step in range(0, STEPS + 1, 10)]
    for step in range(0, STEPS + 1, 5):
        entries.append(("collapse/trajectory/mi_zscore_ema", mi_at(step, filtered), step))
        entries.append(("collapse/trajectory/mi_est", mi_at(step, filtered) / 2, step))
        entries.append(("collapse/alert", 1.0 if not filtered and step >= 30 else 0.0, step))
    for step in range(1, STEPS + 1):
        entries += [
            ("timing_s/step", 7.0 if filtered else 10.0, step),
            ("rollout/kept_ratio", 0.5 if filtered else 1.0, step),
            ("rollout/kept_groups", 4.0 if filtered else 8.0, step),
            ("rollout/total_groups", 8.0, step),
            ("rollout/kept_samples", 32.0 if filtered else 64.0, step),
            ("rollout/chosen_in_group_reward_std_mean", 0.45 if filtered else 0.3, step),
            ("rollout/in_group_reward_std_mean", 0.5 - 0.005 * step, step),
            ("rollout/reward_mean", peak, step),
            ("actor/entropy", 1.0 + 0.01 * step, step),
            ("response_length/mean", 100.0 - step, step),
        ]
    return entries


@dataclass(frozen=True)
class DemoStore:
    uri: str
    path: Path
    run_ids: dict[tuple[str, str, bool, int], str]  # (task, algorithm, filtered, seed) -> run id
    failed_run: str
    scheduled_run: str
    parent_run: str


def build_demo_store(root: Path) -> DemoStore:
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    path = root / "mlflow.db"
    uri = f"sqlite:///{path}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("demo", artifact_location=(root / "artifacts").as_uri())
    parent = client.create_run(experiment, run_name="demo", tags={"sweep": "demo", "orch.role": "sweep"}).info.run_id
    run_ids = {}

    def child(task: str, algorithm: str, filtered: bool, seed: int) -> str:
        varied = {"task": task, "algorithm": algorithm, "filter": "top_p" if filtered else "none"}
        tags = {"mlflow.parentRunId": parent, "sweep": "demo", "cell": f"{task}-{algorithm}-{filtered}-{seed}",
                "seed": str(seed), "orch.role": "cell", **varied}
        name = ",".join(f"{k}={v}" for k, v in varied.items()) + f",seed={seed}"
        return client.create_run(experiment, run_name=name, tags=tags).info.run_id

    start = 1_700_000_000_000
    for task in TASKS:
        for algorithm in ALGORITHMS:
            for filtered in (False, True):
                for seed in (0, 1):
                    run_id = child(task, algorithm, filtered, seed)
                    run_ids[task, algorithm, filtered, seed] = run_id
                    params = [Param(k, v) for k, v in _params(task, algorithm, filtered, seed).items()]
                    tags = [RunTag("task", task), RunTag("algorithm", algorithm), RunTag("model", "tiny"),
                            RunTag("backend", "torch")]
                    metrics = [Metric(k, v, start + s, s) for k, v, s in _metrics(task, algorithm, filtered, seed)]
                    client.log_batch(run_id, params=params, tags=tags)
                    for first in range(0, len(metrics), 1000):
                        client.log_batch(run_id, metrics=metrics[first : first + 1000])
                    if not filtered:
                        for step in (0, 10):
                            local = root / f"step_{step:04d}.parquet"
                            rollout_batch(task, step).to_parquet(local, index=False)
                            client.log_artifact(run_id, str(local), "rollouts")
                    client.set_terminated(run_id, "FINISHED")
    failed = child("sokoban", "ppo", True, 2)
    client.log_batch(failed, params=[Param(k, v) for k, v in _params("sokoban", "ppo", True, 2).items()])
    client.set_terminated(failed, "FAILED")
    scheduled = child("frozenlake", "grpo", False, 2)
    client.update_run(scheduled, status="SCHEDULED")
    return DemoStore(uri=uri, path=path, run_ids=run_ids, failed_run=failed, scheduled_run=scheduled, parent_run=parent)


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> DemoStore:
    """The synthetic sweep of the module docstring (built once per test session; treat it as read-only)."""
    return build_demo_store(tmp_path_factory.mktemp("demo_store"))


@pytest.fixture(scope="session")
def demo_report(demo_store: DemoStore):
    """The demo sweep's report from MLflow alone (no orch store's cells), bootstrapped 100 times: built once per
    session for every test that reads it (tests/analysis/reports/test_report.py, tests/analysis/stores/test_archive.py;
    each built its own before, the costliest set-up of the analysis tests); treat it as read-only."""
    from analysis.reports.report import build_report

    return build_report("demo", demo_store.uri, n_boot=100)


@pytest.fixture(scope="session")
def demo_data(demo_store: DemoStore):
    """The demo sweep loaded through the bulk reader."""
    from analysis.stores.mlflow_store import RunQuery, load_runs

    return load_runs(RunQuery(sweep="demo"), demo_store.uri, reader="sql")
