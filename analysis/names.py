"""Every MLflow name analysis relies on -- metric names, param keys, tags -- in one place.

The trainer (`recipes/`) and the sweep engine (`orchestrator/`) write these names; analysis only reads them. The
filter and MI names are checked against the code that produces them (tests/analysis/test_names.py), so a rename
there fails a test here instead of silently emptying a table.
"""

from __future__ import annotations

from recipes.config.schema import INFRA_KEYS
from recipes.run.tracking import PEAK_MEMORY_METRIC
from recipes.stats import rollout_stats

# --- validation (every `trainer.val_every` steps) -------------------------------------------------------------
VAL_SUCCESS = rollout_stats.VAL_SUCCESS  # success rate in [0, 1]
VAL_MEAN_RETURN = "val/reward_mean"
VAL_FORMAT_VALID = "val/format_validity"
VAL_RESPONSE_LENGTH = "val/response_length"

# --- training step --------------------------------------------------------------------------------------------
STEP_TIME = "timing_s/step"  # seconds of the whole step
ENTROPY = "actor/entropy"  # per-token policy entropy over response tokens
RESPONSE_LENGTH = "response_length/mean"
REWARD_MEAN = "rollout/reward_mean"  # mean episode return of the (unfiltered) training batch
PEAK_MEMORY = PEAK_MEMORY_METRIC  # peak accelerator memory (CPU: peak RSS) so far, GB; veRL's own name

# --- SNR-Aware Filtering (recipes/stats/filtering.py: filter_metrics) -----------------------------------------------
RV_STD_MEAN = "rollout/in_group_reward_std_mean"
RV_STD_MAX = "rollout/in_group_reward_std_max"
RV_VAR_MEAN = "rollout/in_group_reward_var_mean"
RV_CHOSEN_STD_MEAN = "rollout/chosen_in_group_reward_std_mean"
TOTAL_GROUPS = "rollout/total_groups"
KEPT_GROUPS = "rollout/kept_groups"
KEPT_SAMPLES = "rollout/kept_samples"
KEPT_RATIO = "rollout/kept_ratio"
ZERO_VARIANCE_GROUPS = "rollout/zero_variance_groups"
FILTER_METRICS = (
    RV_STD_MEAN,
    RV_STD_MAX,
    RV_VAR_MEAN,
    RV_CHOSEN_STD_MEAN,
    TOTAL_GROUPS,
    KEPT_GROUPS,
    KEPT_SAMPLES,
    KEPT_RATIO,
    ZERO_VARIANCE_GROUPS,
)

# --- MI proxies (recipes/stats/mi.py: MIProxies.to_metrics(prefix)) and the collapse alert ---------------------------
SAMPLE_SETS = ("first_turn", "trajectory")
MI_PROXY_NAMES = ("retrieval_acc", "retrieval_chance", "mi_est", "mi_seq_est", "mi_zscore", "conditional_entropy")
COLLAPSE_ALERT = "collapse/alert"  # 0 until the collapse alert fires, then 1


def collapse_metric(sample_set: str, name: str) -> str:
    """``collapse/<sample_set>/<name>``, e.g. ``collapse/trajectory/mi_zscore``."""
    return f"collapse/{sample_set}/{name}"


MI_ZSCORE_EMA = collapse_metric("trajectory", "mi_zscore_ema")
MI_EST = collapse_metric("trajectory", "mi_est")
RETRIEVAL_ACC = collapse_metric("trajectory", "retrieval_acc")
RETRIEVAL_CHANCE = collapse_metric("trajectory", "retrieval_chance")  # 1 / (columns a sample could be matched to)
# Derived by analysis (never logged): retrieval_acc / retrieval_chance - 1, the excess over chance that the
# collapse alert's rule tracks (recipes.stats.collapse_alert.CollapseAlert).
RETRIEVAL_EXCESS = collapse_metric("trajectory", "retrieval_excess")
COLLAPSE_NUM_SAMPLES = collapse_metric("trajectory", "num_samples")  # 0 when no sample set could be built
CONDITIONAL_ENTROPY = collapse_metric("trajectory", "conditional_entropy")

# Diagnostics correlated with task performance: metric -> family (the paper's MI-vs-entropy comparison).
DIAGNOSTIC_FAMILIES: dict[str, str] = {
    **{collapse_metric(s, n): "MI" for s in SAMPLE_SETS for n in ("retrieval_acc", "mi_est", "mi_zscore")},
    **{collapse_metric(s, "mi_zscore_ema"): "MI" for s in SAMPLE_SETS},
    ENTROPY: "entropy",
    **{collapse_metric(s, "conditional_entropy"): "entropy" for s in SAMPLE_SETS},
    REWARD_MEAN: "reward",
    RESPONSE_LENGTH: "response length",
}
# Candidate proxies of reward variance (the paper's RV-vs-proxies table), correlated per (run, step).
RV_PROXIES = (REWARD_MEAN, RETRIEVAL_ACC, RESPONSE_LENGTH, MI_EST, CONDITIONAL_ENTROPY)

# Training curves of the report, in display order.
CURVES = (VAL_SUCCESS, MI_ZSCORE_EMA, RETRIEVAL_ACC, MI_EST, ENTROPY, RV_STD_MEAN, KEPT_RATIO, RESPONSE_LENGTH)

# --- params: the flattened resolved training config (conf/) ---------------------------------------------------
PARAM_TASK = "task.name"
PARAM_ALGORITHM = "algorithm.name"
PARAM_MODEL = "model.name"
PARAM_MODEL_PATH = "model.path"  # a local Hugging Face checkpoint; its folder name labels the model
PARAM_SEED = "seed"
PARAM_FILTER_NAME = "filter.name"
PARAM_FILTER_STRATEGY = "filter.strategy"
PARAM_FILTER_VALUE = "filter.value"  # rho for top_p
PARAM_PROMPTS = "trainer.prompts_per_step"
PARAM_SAMPLES = "trainer.samples_per_prompt"
PARAM_SLIP = "task.env.slip"  # FrozenLake slip probability
PARAM_HOOKS = "hooks"  # the step hooks, as a list repr: "['collapse']" when the MI diagnostics are on
COLLAPSE_HOOK = "collapse"
FILTER_PREFIX = "filter."


def is_infra_key(key: str) -> bool:
    """Whether a param never distinguishes experimental settings: one of the training config's infra keys
    (hosting and bookkeeping: `recipes.config.schema.INFRA_KEYS`) or a key inside one."""
    return any(key == infra or key.startswith(f"{infra}.") for infra in INFRA_KEYS)


# Keys tried first when naming a variant (then the others, alphabetically).
VARIANT_KEY_PRIORITY = (PARAM_ALGORITHM, PARAM_MODEL_PATH, PARAM_MODEL, "backend")

# --- tags -----------------------------------------------------------------------------------------------------
TAG_SWEEP = "sweep"  # sweep name, on the parent run and every cell run
TAG_CELL = "cell"  # the cell's content hash; only cell runs carry it
EVAL_SUCCESS = "eval/success_rate"  # `orch eval`: success rate of the evaluated checkpoint, in [0, 1]
TAG_EVAL_SOURCE_CELL = "orch.eval.source_cell"  # an evaluation cell's run: the training cell it evaluates
TAG_EVAL_STEP = "orch.eval.step"  # ... and the step of the checkpoint it evaluated
PARAM_EVAL_EPISODES = "evaluation.episodes"
TAG_SEED = "seed"
TAG_TASK = "task"
TAG_ALGORITHM = "algorithm"
TAG_MODEL = "model"
TAG_BACKEND = "backend"
TAG_PARENT = "mlflow.parentRunId"
TAG_COLLAPSE_ALERT_STEP = "collapse_alert_step"  # set by the collapse hook when the collapse alert first fires

# --- artifacts ------------------------------------------------------------------------------------------------
ROLLOUT_DIR = "rollouts"  # rollouts/step_NNNN.parquet, the rollout-batch format (docs/rollout_batch.md)
