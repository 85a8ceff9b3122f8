"""Wall time and GPU-hours of a verl-backend cell before it runs, from a throughput model with one documented anchor.

    estimate = estimate_cost(cfg, parameters=3.09e9, gpus=4)
    estimate.step_s, estimate.wall_h, estimate.gpu_hours, estimate.basis

The anchor is RAGEN-2's own Table 5 (arXiv 2604.06268): Qwen2.5-3B, 8 prompts x 16 samples, no filter, 89.2 s per
step; RAGEN's experiment docs run each experiment on 4 H100s (docs/experiment_main_table.md:37 in
github:mll-lab-nu/RAGEN), taken here as that table's hardware. Every paper sweep runs its Qwen2.5-3B cells on the same
4 GPUs per cell (tests/recipes/verl/test_verl_preflight.py checks it), so the anchor class is one class. A step's compute is taken proportional to
parameters x trajectories x context tokens, spread evenly over the GPUs (an optimistic scaling: more GPUs than 4 are
rarely that efficient), with the update phase a share `UPDATE_SHARE` of the step that shrinks with the filter's kept
fraction. That share comes from the same paper: Table 5's 8 x 16 row goes from 89.2 s to 65.9 s with the filter,
which keeps about 40% of the trajectories (Table 7: 50.6 of 128), so 1 - u + 0.4 u = 65.9 / 89.2 gives u = 0.43.
Validation adds a rollout of `val_size` episodes every `val_every` steps. Accuracy: an anchor-scaled estimate, to
tell a 40 GPU-hour cell from a 400 GPU-hour one, not to bill by; a finished run's `timing_s/step` is the measurement.

**Calibration**: where the tracking store holds finished verl-backend GPU runs of the same model (`calibration`),
each run's median step time (steps after the first) over what this model predicts for that run's own config and
GPUs gives a factor; the median factor over those runs scales every estimate of that model, and the basis says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipes.policy.lora import update_compute_factor

ANCHOR_STEP_S = 89.2  # RAGEN-2 Table 5, 8 x 16, no filter
ANCHOR_PARAMETERS = 3.09e9  # Qwen2.5-3B
ANCHOR_TRAJECTORIES = 128
ANCHOR_CONTEXT = 3600  # RAGEN's max_model_len (config/base.yaml:54)
ANCHOR_GPUS = 4  # H100s per experiment in RAGEN's docs
UPDATE_SHARE = 0.43  # of a step, from Table 5 and Table 7 (module docstring)
TOP_P_KEPT = 50.6 / 128  # Table 7: the prompt-level filter's mean kept trajectories of 128
BASIS = "anchor: RAGEN-2 Table 5 (Qwen2.5-3B, 8x16, 89.2 s/step, 4 H100 assumed)"
WORLD_TAG = "orch.world_gpus"  # a verl run's GPUs (set by recipes.verl.backend), what its step time was measured on
DEVICE_TAG = "orch.device"


@dataclass(frozen=True)
class CostEstimate:
    """One cell's estimate: seconds per step, wall hours, GPU-hours, and what it rests on."""

    step_s: float
    wall_h: float
    gpu_hours: float
    basis: str


def kept_fraction(filter_cfg: Any) -> float:
    """The share of trajectories the filter keeps for the update, as the paper measured it where it did: top-p
    (Table 7), top-k its fraction, none 1; other filters are taken as keeping everything (an upper bound)."""
    strategy, value = filter_cfg.strategy, float(filter_cfg.value)
    if strategy == "none" or (strategy == "top_p" and value >= 1.0):
        return 1.0
    if strategy == "top_p":
        return TOP_P_KEPT
    if strategy == "top_k":
        return min(1.0, max(0.0, value))
    if strategy == "quartile":
        return 0.25
    return 1.0


def estimate_cost(cfg: Any, parameters: float, gpus: int, factor: float = 1.0, basis: str = BASIS) -> CostEstimate:
    """The cost of running `cfg` (a `TrainConfig`) to its last step on `gpus` GPUs, for a model of `parameters`
    (`factor`: a calibration of the anchor, see `calibration`)."""
    trainer = cfg.trainer
    scale = (parameters / ANCHOR_PARAMETERS) * (trainer.max_context_tokens / ANCHOR_CONTEXT) \
        * (ANCHOR_GPUS / max(1, gpus))
    trajectories = trainer.prompts_per_step * trainer.samples_per_prompt
    rollout_s = ANCHOR_STEP_S * (1 - UPDATE_SHARE) * scale * trajectories / ANCHOR_TRAJECTORIES
    update_s = ANCHOR_STEP_S * UPDATE_SHARE * scale * trajectories / ANCHOR_TRAJECTORIES * kept_fraction(cfg.filter)
    update_s *= update_compute_factor(cfg.model.lora)  # LoRA: no frozen weight's gradient (recipes.policy.lora)
    step_s = (rollout_s + update_s) * factor
    validations = (trainer.total_steps // trainer.val_every + 1) if trainer.val_every > 0 else 0
    validation_s = validations * ANCHOR_STEP_S * (1 - UPDATE_SHARE) * scale * trainer.val_size / ANCHOR_TRAJECTORIES
    wall_h = (trainer.total_steps * step_s + validation_s * factor) / 3600
    return CostEstimate(step_s=step_s, wall_h=wall_h, gpu_hours=wall_h * max(1, gpus), basis=basis)


def calibration(tracking_uri: str, model_path: str, parameters: float) -> tuple[float, str] | None:
    """(factor, basis) from the finished verl-backend GPU runs of `model_path` in the store at `tracking_uri`, or None
    when there is none (or no store: nothing is created). Each run contributes its median `timing_s/step` after the
    first step over `estimate_cost` of its own logged config (`config.yaml`) on its GPUs (`WORLD_TAG`)."""
    import statistics
    import tempfile
    from pathlib import Path

    import yaml

    from recipes.config.schema import TrainConfig
    from recipes.run.tracking import mlflow_client

    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        return None
    try:
        client = mlflow_client(tracking_uri)
        runs = client.search_runs(
            [e.experiment_id for e in client.search_experiments()],
            filter_string=(f"tags.backend = 'verl' and tags.`{DEVICE_TAG}` = 'cuda' and "
                           f"attributes.status = 'FINISHED'"), max_results=200)
    except Exception:  # noqa: BLE001 - a store that cannot be read gives no calibration, never a failed preflight
        return None
    factors = []
    for run in runs:
        world = run.data.tags.get(WORLD_TAG, "")
        if not world.isdigit():
            continue
        steps = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "timing_s/step"))
        measured = [value for step, value in steps if step > 1]
        if not measured:
            continue
        with tempfile.TemporaryDirectory() as scratch:
            try:
                tree = yaml.safe_load(Path(client.download_artifacts(run.info.run_id, "config.yaml", scratch))
                                      .read_text())
                cfg = TrainConfig.from_tree(tree)
            except Exception:  # noqa: BLE001 - a run without a readable config is skipped
                continue
        if str(cfg.model.path) != str(model_path):
            continue
        predicted = estimate_cost(cfg, parameters, int(world)).step_s
        factors.append(statistics.median(measured) / predicted)
    if not factors:
        return None
    factor = statistics.median(factors)
    return factor, (f"calibrated from {len(factors)} finished run(s) of {model_path} in the tracking store "
                    f"(x{factor:.2f} the anchor's prediction)")
