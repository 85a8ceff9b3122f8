"""Reference fidelity: every setting of every paper cell (each shipped paper sweep, resolved as its jobs would run
it, default profile) equals what RAGEN's scripts and config set, or is a deliberate deviation documented in the map
(`analysis.paper.DEVIATIONS`, docs/paper.md).

The reference values below were read from RAGEN (github:mll-lab-nu/RAGEN) at commit 20daedc, each with its
`path:line`; veRL defaults that RAGEN does not override are cited from veRL at RAGEN's pinned commit d62da49, and
WebShop's pages from webshop-minimal (github:ZihanWang314/webshop-minimal, main at ec82552; RAGEN pins 4758174).
Every RAGEN experiment -- each `scripts/runs/` file and `docs/experiment_*.md`, listed with its blob in
`tests/analysis/ragen_experiments.txt` -- is compared here (`COMPARED`) or out of scope with the reason
(`OUT_OF_SCOPE`); with `ORCH_RAGEN_GIT_DIR` set to a RAGEN git directory the listing is checked against it.
Nothing here needs the network.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from analysis import paper
from envs.registry import build_config
from orchestrator.api import planned_configs

MAIN = ("table4", "table5", "table6", "table7", "length")  # the main-table settings (no script: main + one change)
EVERY = (*MAIN, "topp", "slip", "entropy", "kl", "filters", "gradient")  # every paper sweep, planned once
# A scope is a sweep, or `sweep:task,...` for the sweep's cells of those tasks: the filters sweep runs each task as
# RAGEN runs it, the length sweep gives each task RAGEN's lengths.
SOKOBAN, SEARCHQA, WEBSHOP, DEEPCODER = "filters:sokoban", "filters:searchqa", "filters:webshop", "filters:deepcoder"
FILTER_TASKS = (SEARCHQA, WEBSHOP, DEEPCODER)  # RAGEN's own runs of them (not run_filtering_final.sh)
LENGTH_MAIN = "length:sokoban,sokoban_8x8,frozenlake,countdown,metamathqa"
PARTS = {"filters": (SOKOBAN, *FILTER_TASKS),  # the task scopes that together hold every cell of a sweep
         "length": (LENGTH_MAIN, "length:searchqa", "length:webshop", "length:deepcoder")}


def every(*but: str) -> tuple[str, ...]:
    """Every cell of every paper sweep, as scopes, less the sweeps and task scopes named."""
    split = {scope.split(":")[0] for scope in but if ":" in scope}
    whole = tuple(sweep for sweep in EVERY if sweep not in split and sweep not in but)
    return (*whole, *(scope for sweep in sorted(split) for scope in PARTS[sweep] if scope not in but))


SEARCH = "docs/experiment_search.md"
WEBSHOP_DOC = "docs/experiment_webshop_release.md"
WEBSHOP_SH = "scripts/runs/run_webshop_release_combos.sh"
DEEPCODER_DOC = "docs/experiment_deepcoder.md"


@dataclass(frozen=True)
class Ref:
    """One RAGEN setting: an id (the key of a documented deviation, when orch differs on purpose), the scopes it
    applies to, how to read it from a cell (its resolved `TrainConfig` and its settings), RAGEN's value and where
    RAGEN sets it."""

    id: str
    sweeps: tuple[str, ...]
    read: Callable[[Any, dict[str, Any]], Any]
    ragen: Any
    source: str


def env(key: str) -> Callable[[Any, dict[str, Any]], Any]:
    return lambda cfg, _: cfg.task.env.get(key)


def budget(cfg: Any) -> tuple[int, int, int]:
    """(turns, actions per turn, actions an episode can take): RAGEN's max_actions_per_traj may exceed what its
    turns allow (SearchQA: 10 for 5 turns of one action)."""
    env = cfg.task.env
    return env["max_turns"], env["max_actions_per_turn"], min(env["max_actions"],
                                                             env["max_turns"] * env["max_actions_per_turn"])


def of_task(task: str, read: Callable[[Any, dict[str, Any]], Any]) -> Callable[[Any, dict[str, Any]], Any]:
    """`read` on the cells of `task`, None on the others."""
    return lambda cfg, settings: read(cfg, settings) if cfg.task.name == task else None


REFERENCE = (
    Ref("steps", ("table4", "table5", "table6", "table7", "length", "topp", "slip", "entropy", "kl", SOKOBAN,
                  WEBSHOP), lambda cfg, _: cfg.trainer.total_steps, 400,
        "scripts/runs/run_main_table_diff_algo.sh:9; run_top_p_sweep.sh:6; run_entropy_sweep.sh:6; run_kl_sweep.sh:6; "
        "run_frozen_lake_slipper_rate_sweep.sh:6; run_filtering_final.sh:79; docs/experiment_webshop_release.md:55,"
        "65,73,81,93 (run_webshop_release_combos.sh:14 defaults to 100)"),
    Ref("steps", (SEARCHQA, DEEPCODER), lambda cfg, _: cfg.trainer.total_steps, 200,
        f"{SEARCH}:65,80,97,150; scripts/runs/run_search_benchmark.sh:17; {DEEPCODER_DOC}:26,91"),
    Ref("steps", ("gradient",), lambda cfg, _: cfg.trainer.total_steps, 101,
        "scripts/runs/run_sokoban_ppo_filter_grad_analysis.sh:24"),
    Ref("batch", every("table5", *FILTER_TASKS),
        lambda cfg, _: (cfg.trainer.prompts_per_step, cfg.trainer.samples_per_prompt), (8, 16),
        "config/base.yaml:157-163 (es_manager.train 8 x 16); run_top_p_sweep.sh:274-275; run_filtering_final.sh:82; "
        "docs/experiment_intervention_sweep.md:142,160"),
    Ref("batch", FILTER_TASKS, lambda cfg, _: (cfg.trainer.prompts_per_step, cfg.trainer.samples_per_prompt),
        (16, 8), f"config/_9_search.yaml:29-30; {SEARCH}:141-142; {WEBSHOP_SH}:18-19,337-338; {WEBSHOP_DOC}:14; "
                 f"{DEEPCODER_DOC}:94"),
    Ref("budget", ("table5",), lambda cfg, _: cfg.trainer.prompts_per_step * cfg.trainer.samples_per_prompt, 128,
        "the paper's Table 5: a fixed budget of 128 trajectories (no RAGEN script)"),
    Ref("mini_batch", every(SEARCHQA), lambda cfg, _: cfg.trainer.mini_batch_size, 32,
        f"config/base.yaml:14,31,77; run_filtering_final.sh:79; {WEBSHOP_SH}:336; {DEEPCODER_DOC}:92"),
    Ref("mini_batch", (SEARCHQA,), lambda cfg, _: cfg.trainer.mini_batch_size, 64,
        f"{SEARCH}:63,95 (the no-filter and top-p runs; the top-k run's 32: searchqa_topk_arm)"),
    Ref("micro_batch", (SOKOBAN, SEARCHQA), lambda cfg, _: cfg.trainer.micro_batch_size, 4,
        f"run_filtering_final.sh:79; config/_9_search.yaml:11; {SEARCH}:63"),
    Ref("micro_batch", ("table4", "table5", "table6", "table7", LENGTH_MAIN, "length:searchqa"),
        lambda cfg, _: cfg.trainer.micro_batch_size, 1, "config/base.yaml:12 (micro_batch_size_per_gpu: 1)"),
    Ref("micro_batch", ("topp", "slip", "entropy", "kl", "gradient"), lambda cfg, _: cfg.trainer.micro_batch_size,
        4, "run_top_p_sweep.sh:261; run_frozen_lake_slipper_rate_sweep.sh:350; run_entropy_sweep.sh:274; "
           "run_kl_sweep.sh:278; run_sokoban_ppo_filter_grad_analysis.sh:28,177"),
    Ref("entropy_chunking", EVERY, lambda cfg, _: cfg.infra.verl.entropy_chunking, True,
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=True in every run script, e.g. "
        "run_main_table_diff_size.sh:245"),
    Ref("micro_batch", (WEBSHOP, DEEPCODER), lambda cfg, _: cfg.trainer.micro_batch_size, 1,
        f"{WEBSHOP_SH}:321; {WEBSHOP_DOC}:45; {DEEPCODER_DOC}:93"),
    Ref("actor_lr", EVERY, lambda cfg, _: cfg.model.actor_lr, 1e-6, "config/base.yaml:46"),
    Ref("critic_lr", EVERY, lambda cfg, _: cfg.model.critic_lr, 1e-5, "config/base.yaml:86"),
    Ref("weight_decay", EVERY, lambda cfg, _: cfg.model.weight_decay, 0.01,
        "veRL's default, not overridden by RAGEN (verl/trainer/config/actor/actor.yaml:126 at d62da49)"),
    Ref("grad_clip", EVERY, lambda cfg, _: cfg.model.grad_clip, 1.0, "verl/trainer/config/actor/dp_actor.yaml:29"),
    Ref("clip", EVERY, lambda cfg, _: (cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high), (0.2, 0.28),
        "config/base.yaml:38-39"),
    Ref("gae", EVERY, lambda cfg, _: (cfg.algorithm.gamma, cfg.algorithm.lam), (1.0, 1.0), "config/base.yaml:94-95"),
    Ref("entropy", ("table4", "table5", "table6", "table7", "length", "topp", "filters", "gradient"),
        lambda cfg, _: cfg.algorithm.entropy_coeff, 0.001,
        "scripts/runs/run_main_table_diff_algo.sh:266; run_top_p_sweep.sh:257; grad script :181; "
        f"run_search_benchmark.sh:294; {WEBSHOP_SH}:285; DeepCoder: config/base.yaml:34 ({DEEPCODER_DOC} sets none)"),
    Ref("entropy", ("slip", "kl"), lambda cfg, _: cfg.algorithm.entropy_coeff, 0.0,
        "scripts/runs/run_frozen_lake_slipper_rate_sweep.sh:346; run_kl_sweep.sh:274"),
    Ref("entropy_sweep", ("entropy",), lambda cfg, _: cfg.algorithm.entropy_coeff,
        {0.0, 0.001, 0.003, 0.01, 0.03, 0.1}, "scripts/runs/run_entropy_sweep.sh:12"),
    Ref("kl_off", (*MAIN, "slip", "entropy", "filters", "gradient"), lambda cfg, _: cfg.algorithm.use_kl, False,
        "scripts/runs/run_main_table_diff_algo.sh:263; slipper :343; run_entropy_sweep.sh:268; grad script :178; "
        "run_filtering_final.sh leaves config/base.yaml:35; run_search_benchmark.sh:291; "
        f"{WEBSHOP_SH}:282; {DEEPCODER_DOC}:25,100"),
    Ref("kl_topp", ("topp",), lambda cfg, _: (cfg.algorithm.use_kl, cfg.algorithm.kl_coef, cfg.algorithm.kl_penalty),
        (True, 0.001, "kl"), "scripts/runs/run_top_p_sweep.sh:255-256; config/base.yaml:37"),
    Ref("kl_sweep", ("kl",), lambda cfg, _: (cfg.algorithm.use_kl, cfg.algorithm.kl_coef, cfg.algorithm.kl_penalty),
        {(False, 0.0, "kl"), *((True, c, "kl") for c in (0.001, 0.003, 0.01, 0.03, 0.1))},
        "scripts/runs/run_kl_sweep.sh:12,237-240,272-273; config/base.yaml:37"),
    Ref("algorithm", every(DEEPCODER), lambda cfg, _: _algorithm(cfg), {
        "ppo": ("critic", "token-mean", False), "dapo": ("critic", "token-mean", False),
        "grpo": ("grpo", "seq-mean-token-mean", False), "drgrpo": ("grpo-nostd", "seq-mean-token-sum", False)},
        "scripts/runs/run_main_table_diff_algo.sh:229 (PPO), :232-233 (DAPO: PPO + clip-higher + no KL + token-mean, "
        "no dynamic sampling), :236 (GRPO), :239 (Dr.GRPO); run_search_benchmark.sh:129 (PPO); "
        f"{WEBSHOP_SH}:21,89 (GRPO)"),
    Ref("algorithm", (DEEPCODER,), lambda cfg, _: _algorithm(cfg), ("grpo", "token-mean", False),
        f"{DEEPCODER_DOC}:89 (adv_estimator=grpo and nothing else: std-normalised, config/base.yaml:101; token-mean, "
        ":43)"),
    Ref("validation", every(*FILTER_TASKS), lambda cfg, _: (cfg.trainer.val_size, cfg.trainer.val_every), (512, 10),
        "config/base.yaml:116,164-170; run_top_p_sweep.sh:277-279; docs/experiment_intervention_sweep.md:161"),
    Ref("validation", FILTER_TASKS, lambda cfg, _: (cfg.trainer.val_size, cfg.trainer.val_every), (256, 10),
        f"config/_9_search.yaml:35 x group 1 (config/base.yaml:166) x 1 validation step (:116), every 10 (:119); "
        f"{WEBSHOP_SH}:340-341; {WEBSHOP_DOC}:15; {DEEPCODER_DOC}:95,112,114"),
    Ref("temperature", EVERY, lambda cfg, _: (cfg.trainer.temperature, cfg.trainer.val_temperature), (1.0, 0.5),
        "config/base.yaml:59,72-74"),
    Ref("lengths", every(*FILTER_TASKS, "length:searchqa", "length:webshop", "length:deepcoder"),
        lambda cfg, _: (cfg.trainer.max_response_tokens, cfg.trainer.max_context_tokens),
        (400, 3600), "config/base.yaml:54,56 (max_model_len 3600, response_length 400)"),
    Ref("lengths", (SEARCHQA, "length:searchqa"), lambda cfg, _: (cfg.trainer.max_response_tokens,
                                                                 cfg.trainer.max_context_tokens),
        (400, 5000), f"config/_9_search.yaml:24; {SEARCH}:128,162 (the top-k run's 4000: searchqa_topk_arm); "
                     "config/base.yaml:56"),
    Ref("lengths", (WEBSHOP, "length:webshop"), lambda cfg, _: (cfg.trainer.max_response_tokens,
                                                               cfg.trainer.max_context_tokens),
        (400, 15000), "config/_6_webshop.yaml:22; config/base.yaml:56"),
    Ref("lengths", (DEEPCODER, "length:deepcoder"), lambda cfg, _: (cfg.trainer.max_response_tokens,
                                                                   cfg.trainer.max_context_tokens),
        (4000, 10000), f"{DEEPCODER_DOC}:105,107"),
    Ref("empty_stop", every(DEEPCODER), lambda cfg, _: cfg.trainer.max_empty_steps, 5, "config/base.yaml:66"),
    Ref("empty_stop", (DEEPCODER,), lambda cfg, _: cfg.trainer.max_empty_steps, 0,
        f"{DEEPCODER_DOC}:104 (rollout_filter_empty_stop_steps=0: never; ragen/trainer/agent_trainer.py:1144)"),
    Ref("diagnostics", every(SEARCHQA, DEEPCODER), lambda cfg, settings: (
        None if settings.get("task.env.observation") == "image" else
        ("collapse" in cfg.hooks, cfg.diagnostics.mi_every, cfg.diagnostics.num_samples,
         tuple(cfg.diagnostics.sets))), {None, (True, 5, 64, ("first_turn", "trajectory"))},
        "config/base.yaml:147-153 (MI in every run: step 1 then every 5, 64 samples, both sets)"),
    Ref("mi_off_runs", (SEARCHQA, DEEPCODER), lambda cfg, _: "collapse" in cfg.hooks and cfg.diagnostics.mi_every > 0,
        False, f"{SEARCH}:146-147 (compute_freq 999); {DEEPCODER_DOC}:115-116"),
    Ref("mi_image", ("table4",), lambda cfg, settings: (
        settings.get("task.env.observation") != "image" or cfg.diagnostics.mi_every > 0), True,
        "config/base.yaml:151-152 (MI in every run)"),
    Ref("gradient_cadence", ("gradient",), lambda cfg, _: (
        [step for step in range(1, 102) if cfg.diagnostics.grad_due(step)], cfg.diagnostics.grad_buckets),
        ([1, 51, 101], 6), "scripts/runs/run_sokoban_ppo_filter_grad_analysis.sh:196-197,202; "
                           "ragen/trainer/agent_trainer.py:1436-1446; "
                           "docs/experiment_sokoban_gradient_analysis.md:41"),
    Ref("main_filter", ("table4", "table5"), lambda cfg, _: _filter(cfg), {
        ("none",), ("top_p", 0.9, "softmax", True, "std")},
        "scripts/runs/run_main_table_diff_algo.sh:254-274 (filter: softmax top-p 0.9, zero-variance kept; "
        "nofilter: top-p 1.0, everything kept); rollout_filter.py:365,428 (the unbiased std); "
        "docs/experiment_main_table.md:112-121"),
    Ref("topp_arms", ("topp",), lambda cfg, _: _filter(cfg), {
        ("none",), *(("top_p", rho, "softmax", False, "std") for rho in (1.0, 0.98, 0.95, 0.9, 0.8, 0.6, 0.4))},
        "scripts/runs/run_top_p_sweep.sh:12,221-226,268-273; docs/experiment_intervention_sweep.md:9,26,28"),
    Ref("slip_arms", ("slip",), lambda cfg, _: (_filter(cfg), cfg.task.env.get("slip")), {
        *((("none",), s) for s in (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)),
        *((("top_p", 0.9, "softmax", False, "std"), s) for s in (0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0))},
        "scripts/runs/run_frozen_lake_slipper_rate_sweep.sh:12-15,260-273,358-360; "
        "docs/experiment_frozen_lake_slipper_sweep.md:25-28"),
    Ref("grad_filter", ("gradient",), lambda cfg, _: _filter(cfg), ("top_p", 0.9, "linear", False, "std"),
        "scripts/runs/run_sokoban_ppo_filter_grad_analysis.sh:187-192; docs/experiment_sokoban_gradient_analysis.md:45"),
    Ref("no_filter", ("entropy", "kl", "length"), lambda cfg, _: _filter(cfg), ("none",),
        "scripts/runs/run_entropy_sweep.sh:280-283; run_kl_sweep.sh:286-287 (top-p 1.0, everything kept)"),
    Ref("filters_arms", (SOKOBAN,), lambda cfg, _: _filter(cfg), {
        ("none",), ("top_p", 0.9, "linear", False, "std"), ("top_k", 0.25, "linear", False, "std")},
        "scripts/runs/run_filtering_final.sh:41-68 (PPO, include_zero False; top_p 0.9 :45, top_k 0.25 :56; "
        "linear: config/base.yaml:64)"),
    Ref("filters_arms", (SEARCHQA,), lambda cfg, _: _filter(cfg), {
        ("none",), ("top_p", 0.9, "linear", True, "std"), ("top_k", 0.25, "linear", True, "std")},
        f"{SEARCH}:15-19 (no filter = top-p 1.0 with zero-variance groups kept: everything, rollout_filter.py:458); "
        "run_search_benchmark.sh:349-350 sets nothing else: config/base.yaml:62-64,67 (largest, include_zero True, "
        f"linear -- {SEARCH}:88 says softmax, which no setting of the run selects -- reward variance)"),
    Ref("filters_arms", (WEBSHOP,), lambda cfg, _: _filter(cfg), {
        ("none",), ("top_p", 0.9, "linear", True, "std"), ("top_p", 0.95, "linear", True, "std"),
        ("top_k", 0.25, "linear", True, "std")},
        f"{WEBSHOP_SH}:22,234-247,279,289-293; {WEBSHOP_DOC}:20-30"),
    Ref("filters_arms", (DEEPCODER,), lambda cfg, _: _filter(cfg), {
        ("none",), ("top_p", 0.9, "linear", False, "std"), ("top_k", 0.25, "linear", True, "std")},
        f"{DEEPCODER_DOC}:7-9,23-24,101-103"),
    Ref("searchqa_topk_arm", (SEARCHQA,), lambda cfg, _: (
        cfg.filter.strategy, cfg.trainer.mini_batch_size, cfg.trainer.max_context_tokens),
        {("none", 64, 5000), ("top_p", 64, 5000), ("top_k", 32, 4000)},
        f"{SEARCH}:63,78,95,128,162"),
    Ref("hosting", (SOKOBAN, WEBSHOP), lambda cfg, _: (cfg.infra.verl.tensor_parallel,
                                                       cfg.infra.verl.gpu_memory_utilization), (1, 0.3),
        f"config/base.yaml:53,57; {WEBSHOP_SH}:31"),
    Ref("hosting", (SEARCHQA,), lambda cfg, _: (cfg.infra.verl.tensor_parallel,
                                                cfg.infra.verl.gpu_memory_utilization), (1, 0.65),
        f"run_search_benchmark.sh:30; {SEARCH}:64,130"),
    Ref("hosting", (DEEPCODER,), lambda cfg, _: (cfg.infra.verl.tensor_parallel,
                                                 cfg.infra.verl.gpu_memory_utilization), (4, 0.6),
        f"{DEEPCODER_DOC}:98,110"),
    Ref("topp_task", ("topp", "entropy", "kl", "gradient", "table5", "table6", "table7"),
        lambda cfg, _: cfg.task.name, "sokoban",
        "scripts/runs/run_top_p_sweep.sh:10; run_entropy_sweep.sh:10; run_kl_sweep.sh; grad script (Sokoban)"),
    Ref("grid_turns", (*EVERY,), lambda cfg, _: (
        budget(cfg) if cfg.task.name in ("sokoban", "sokoban_8x8", "frozenlake") else None), {None, (5, 2, 10)},
        "config/base.yaml:138,140; config/envs.yaml:62,177"),
    Ref("format_penalty", EVERY, lambda cfg, _: cfg.task.env.get("format_penalty"), -0.1, "config/base.yaml:156"),
    Ref("metamathqa_turns", ("table4", "length"), lambda cfg, _: (
        (cfg.task.env["max_turns"], cfg.task.env["max_actions"]) if cfg.task.name == "metamathqa" else None),
        {None, (5, 1)}, "config/base.yaml:138 (5 turns); config/envs.yaml:192 (max_actions_per_traj 1)"),
    Ref("sokoban_generation", EVERY, lambda cfg, _: (
        (cfg.task.env["search_depth"], cfg.task.env["solvable_within_budget"]) if cfg.task.name == "sokoban"
        else None), {None, (300, False)}, "ragen/env/sokoban/config.py:9; ragen/env/sokoban/utils.py:281-326"),
    Ref("countdown_records", EVERY, lambda cfg, _: (
        build_config("countdown", cfg.task.env).max_instances if cfg.task.name == "countdown" else None),
        {None, 20_000}, "ragen/env/countdown/config.py:8 (max_instances; the records then kept: env.py:46-50)"),
    Ref("searchqa_settings", EVERY, of_task("searchqa", lambda cfg, _: (
        *budget(cfg), cfg.task.env["top_k"], cfg.task.env["f1_threshold"], cfg.task.env["max_instances"])),
        {None, (5, 1, 5, 5, 0.3, 20_000)},
        "config/_9_search.yaml:19-20 (5 turns of 1 action); config/envs.yaml:311 (10 actions per trajectory, "
        "5 reachable), :327 (max_search_results 5); ragen/env/search/config.py:22 (max_instances), :38 and "
        "reward.py:165,190-196 (the F1 threshold 0.3)"),
    Ref("webshop_settings", EVERY, of_task("webshop", lambda cfg, _: (
        *budget(cfg), cfg.task.env["reward"], cfg.task.env["results_per_page"], cfg.task.env["max_results"])),
        {None, (9, 1, 9, "binary", 10, 50)},
        f"config/_6_webshop.yaml:17-18 and {WEBSHOP_SH}:323 (9 turns of 1 action); config/envs.yaml:207 (9 actions); "
        "ragen/env/webshop/env.py:133 (reward 1 for a full match, else 0); webshop-minimal engine.py:26-27 (50 "
        "results, 10 per page)"),
    Ref("deepcoder_turns", EVERY, of_task("deepcoder", lambda cfg, _: budget(cfg)), {None, (1, 1, 1)},
        f"config/_10_deepcoder.yaml:8-9; {DEEPCODER_DOC}:99; config/envs.yaml:157"),
    Ref("seeds", EVERY, lambda cfg, _: cfg.seed, 1, "config/base.yaml:8-10 (one run per setting)"),
    Ref("models", ("table4",), lambda cfg, _: model(cfg), {
        "Qwen2.5-3B", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Qwen2.5-14B", "Qwen2.5-3B-Instruct",
        "Llama-3.2-3B-Instruct", "Qwen2.5-VL-3B-Instruct"},
        "scripts/runs/run_main_table_diff_size.sh:10; run_main_table_diff_model.sh:10,79; "
        "docs/experiment_main_table.md:101; Qwen2.5-14B: scripts/eval_batch.sh:30 (no training script); "
        "the VL rows: no RAGEN script"),
    Ref("models", ("topp", "kl", "entropy", "slip", "gradient", "table5", "table6", "table7", "length"),
        lambda cfg, _: model(cfg), "Qwen2.5-3B",
        "docs/experiment_intervention_sweep.md:13,147; docs/experiment_frozen_lake_slipper_sweep.md:11,69; "
        "docs/experiment_sokoban_gradient_analysis.md:14,135; no script (Tables 5-7, length): "
        "docs/experiment_main_table.md:19"),
    Ref("models", (SOKOBAN, SEARCHQA, WEBSHOP), lambda cfg, _: model(cfg), "Qwen2.5-3B-Instruct",
        f"config/base.yaml:15 (run_filtering_final.sh sets none); run_search_benchmark.sh:18; {SEARCH}:9; "
        f"{WEBSHOP_SH}:20; {WEBSHOP_DOC}:12"),
    Ref("models", (DEEPCODER,), lambda cfg, _: model(cfg), "Qwen2.5-Coder-7B", f"{DEEPCODER_DOC}:11,88"),
)

# Every RAGEN experiment (tests/analysis/ragen_experiments.txt) is compared -- its scopes here, each cited by some
# Ref above -- or out of scope, with the reason.
COMPARED: dict[str, tuple[str, ...]] = {
    "docs/experiment_deepcoder.md": (DEEPCODER,),
    "docs/experiment_frozen_lake_slipper_sweep.md": ("slip",),
    "docs/experiment_intervention_sweep.md": ("topp", "kl", "entropy"),
    "docs/experiment_main_table.md": ("table4",),
    "docs/experiment_search.md": (SEARCHQA,),
    "docs/experiment_sokoban_gradient_analysis.md": ("gradient",),
    "docs/experiment_webshop_release.md": (WEBSHOP,),
    "scripts/runs/run_entropy_sweep.sh": ("entropy",),
    "scripts/runs/run_filtering_final.sh": (SOKOBAN,),
    "scripts/runs/run_frozen_lake_slipper_rate_sweep.sh": ("slip",),
    "scripts/runs/run_kl_sweep.sh": ("kl",),
    "scripts/runs/run_main_table_diff_algo.sh": ("table4",),
    "scripts/runs/run_main_table_diff_model.sh": ("table4",),
    "scripts/runs/run_main_table_diff_size.sh": ("table4",),
    "scripts/runs/run_search_benchmark.sh": (SEARCHQA,),
    "scripts/runs/run_sokoban_ppo_filter_grad_analysis.sh": ("gradient",),
    "scripts/runs/run_top_p_sweep.sh": ("topp",),
    "scripts/runs/run_webshop_release_combos.sh": (WEBSHOP,),
}
OUT_OF_SCOPE: dict[str, str] = {
    "scripts/runs/run_webshop_small_combos.sh":
        "a model x algorithm grid on WebShop (8 x 16, 12 turns, PPO and GRPO on three models, :16-17,297,422-428) "
        "that no item of the paper reports (Table 4 has no WebShop column); the paper's WebShop runs are the release "
        "runner's (docs/experiment_webshop_release.md:7)",
    "scripts/runs/README_webshop_small_combos.md": "the guide of run_webshop_small_combos.sh (out of scope above)",
    "scripts/runs/run_sokoban_ppo_filter_grad_analysis_probe_ckpt.sh":
        "re-probes a saved step-101 checkpoint of the gradient run (docs/experiment_sokoban_gradient_analysis.md:"
        "85-92); orch splits the gradient inside the run (diagnostics.grad_every), the documented deviation "
        "gradient_batch",
}
LISTING = Path(__file__).with_name("ragen_experiments.txt")


def model(cfg: Any) -> str:
    return str(cfg.model.path).split("/")[-1]


def _algorithm(cfg: Any) -> tuple[str, str, bool]:
    from recipes.policy.algorithms import get_algorithm

    estimator = ("critic" if get_algorithm(cfg.algorithm.name).uses_critic else
                 "grpo" if cfg.algorithm.norm_adv_by_std else "grpo-nostd")
    return estimator, cfg.algorithm.loss_agg_mode, cfg.algorithm.dynamic_sampling


def _filter(cfg: Any) -> tuple:
    f = cfg.filter
    if f.strategy == "none":
        return ("none",)
    return (f.strategy, f.value, f.prob_mode, f.include_zero, f.metric)


@pytest.fixture(scope="module")
def cells() -> dict[str, list[Any]]:
    return {sweep: planned_configs(paper.sweep_path(sweep)) for sweep in EVERY}


def scope_cells(cells: dict[str, list[Any]], scope: str) -> list[Any]:
    """The cells of a scope: a sweep's, or (`sweep:task,...`) its cells of those tasks."""
    sweep, _, tasks = scope.partition(":")
    if not tasks:
        return cells[sweep]
    return [cell for cell in cells[sweep] if cell.config.task.name in tasks.split(",")]


def _matches(value: Any, ragen: Any) -> bool:
    if isinstance(ragen, set | dict):
        if isinstance(ragen, dict):  # per algorithm
            return False
        return value in ragen
    if isinstance(ragen, float) and isinstance(value, int | float):
        return abs(value - ragen) <= 1e-12
    return value == ragen


def differences(cells: dict[str, list[Any]]) -> dict[str, list[str]]:
    """Setting id -> one line per (scope, value) that differs from RAGEN."""
    out: dict[str, list[str]] = {}
    for ref in REFERENCE:
        for scope in ref.sweeps:
            for cell in scope_cells(cells, scope):
                value = ref.read(cell.config, cell.settings)
                ragen = ref.ragen
                if isinstance(ragen, dict):
                    ok = value == ragen.get(cell.config.algorithm.name)
                else:
                    ok = _matches(value, ragen)
                if not ok:
                    line = f"{scope}: {value!r} where RAGEN has {ragen!r} ({ref.source})"
                    out.setdefault(ref.id, [])
                    if line not in out[ref.id]:
                        out[ref.id].append(line)
    return out


def test_every_scope_has_cells(cells) -> None:
    """A scope that selects nothing compares nothing (a task renamed or dropped from its sweep)."""
    scopes = {scope for ref in REFERENCE for scope in ref.sweeps} | {s for scopes in COMPARED.values() for s in scopes}
    assert not [scope for scope in sorted(scopes) if not scope_cells(cells, scope)]
    for sweep, parts in PARTS.items():  # each cell of the split sweeps is in exactly one of their task scopes
        assert sum(len(scope_cells(cells, scope)) for scope in parts) == len(cells[sweep])


def test_every_paper_cell_equals_ragen_or_its_deviation_is_documented(cells) -> None:
    found = differences(cells)
    undocumented = {key: lines for key, lines in found.items() if key not in paper.DEVIATIONS}
    assert not undocumented, "\n".join(f"{key}: {line}" for key, lines in undocumented.items() for line in lines)
    # the documented deviations that the configs show are really there (a fixed deviation leaves the list)
    assert set(found) == {"seeds", "metamathqa_turns", "sokoban_generation", "mi_image", "mi_off_runs",
                          "searchqa_topk_arm"}, found


def test_every_deviation_has_a_reason_and_is_in_docs_paper_md() -> None:
    from pathlib import Path

    doc = (Path(paper.__file__).resolve().parents[1] / "docs" / "paper.md").read_text()
    for key, (what, why) in paper.DEVIATIONS.items():
        assert what and why, key
        assert f"| `{key}` |" in doc, f"docs/paper.md's table of deviations does not list {key!r}"


def test_the_fidelity_test_catches_a_changed_setting(cells, monkeypatch) -> None:
    """A paper cell that differs from RAGEN without a documented deviation fails: here, DAPO with dynamic sampling
    (orch's former DAPO), as if conf/algorithm/dapo.yaml had drifted."""
    import dataclasses

    dapo = [cell for cell in cells["table4"] if cell.config.algorithm.name == "dapo"]
    assert dapo
    drifted = dataclasses.replace(dapo[0], config=dapo[0].config.model_copy(update={
        "algorithm": dapo[0].config.algorithm.model_copy(update={"dynamic_sampling": True})}))
    found = differences({**cells, "table4": [drifted]})
    assert "algorithm" in found and "algorithm" not in paper.DEVIATIONS


@pytest.mark.parametrize(("scope", "setting", "drift"), [
    (SEARCHQA, "searchqa_settings", {"task.env.top_k": 3}),  # orch's former 3 passages per search
    (SEARCHQA, "mini_batch", {"trainer.mini_batch_size": 32}),
    (WEBSHOP, "lengths", {"trainer.max_context_tokens": 3600}),  # the former context
    (WEBSHOP, "webshop_settings", {"task.env.max_turns": 6}),
    (DEEPCODER, "algorithm", {"algorithm.loss_agg_mode": "seq-mean-token-mean"}),  # orch's grpo default
    (DEEPCODER, "models", {"model.path": "models/Qwen2.5-7B"}),
])
def test_a_drift_in_searchqa_webshop_or_deepcoder_fails(cells, scope, setting, drift) -> None:
    """A SearchQA, WebShop or DeepCoder cell that moved off RAGEN's value is found, under an id that is no documented
    deviation."""
    sweep = scope.split(":")[0]
    drifted = [_drift(cell, drift) if cell in scope_cells(cells, scope) else cell for cell in cells[sweep]]
    assert setting not in differences(cells)
    found = differences({**cells, sweep: drifted})
    assert setting in found and setting not in paper.DEVIATIONS, found.get(setting)


def _drift(cell: Any, drift: dict[str, Any]) -> Any:
    """The cell with its resolved config changed at the dotted keys of `drift`."""
    import dataclasses

    config = cell.config
    for key, value in drift.items():
        section, _, leaf = key.partition(".")
        part = getattr(config, section)
        if section == "task":
            part = part.model_copy(update={"env": {**part.env, leaf.removeprefix("env."): value}})
        else:
            part = part.model_copy(update={leaf: value})
        config = config.model_copy(update={section: part})
    return dataclasses.replace(cell, config=config)


def _listing() -> dict[str, str]:
    """tests/analysis/ragen_experiments.txt: path -> blob sha."""
    rows = [line.split() for line in LISTING.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {path: sha for sha, path in rows}


def test_every_ragen_experiment_is_compared_or_out_of_scope_with_a_reason() -> None:
    listed = set(_listing())
    assert not set(COMPARED) & set(OUT_OF_SCOPE)
    assert listed == set(COMPARED) | set(OUT_OF_SCOPE), (
        f"not mapped: {sorted(listed - set(COMPARED) - set(OUT_OF_SCOPE))}; "
        f"not in the listing: {sorted(set(COMPARED) | set(OUT_OF_SCOPE) - listed)}")
    assert all(reason.strip() for reason in OUT_OF_SCOPE.values())
    assert all(path.startswith(("scripts/runs/", "docs/experiment_")) for path in listed)


@pytest.mark.parametrize("path", sorted(COMPARED))
def test_each_compared_experiment_is_cited_by_settings_of_its_scopes(path) -> None:
    """Each scope a RAGEN script or doc is compared on has settings citing it (by path or file name)."""
    name = path.rsplit("/", 1)[-1]
    citing = [ref for ref in REFERENCE if name in ref.source]
    assert citing, f"no setting cites {path}"
    covered = {scope for ref in citing for scope in ref.sweeps}
    for scope in COMPARED[path]:
        sweep = scope.split(":")[0]
        assert scope in covered or (sweep in covered and ":" in scope), f"{path}: no setting of {scope} cites it"


@pytest.mark.skipif(not os.environ.get("ORCH_RAGEN_GIT_DIR"), reason="set ORCH_RAGEN_GIT_DIR to a RAGEN git "
                    "directory (e.g. the one `fetch github:mll-lab-nu/RAGEN` gives) to check the listing against it")
def test_the_listing_is_ragens_current_one() -> None:
    """RAGEN moved on (a script added, changed or removed): re-read it, update the settings and the listing."""
    out = subprocess.run(["git", "--git-dir", os.environ["ORCH_RAGEN_GIT_DIR"], "ls-tree", "-r", "HEAD", "--",
                          "scripts/runs", "docs"], capture_output=True, text=True, check=True).stdout
    current = {path: sha for _, _, sha, path in (line.split(maxsplit=3) for line in out.splitlines())
               if path.startswith(("scripts/runs/", "docs/experiment_"))}
    listed = _listing()
    changed = sorted(path for path in set(current) | set(listed) if current.get(path) != listed.get(path))
    assert not changed, f"RAGEN's experiments differ from tests/analysis/ragen_experiments.txt: {changed}"


def test_ragen_padding_copies_up_to_the_next_multiple_of_its_divisor() -> None:
    """RAGEN pads a kept batch to a multiple of lcm(env groups 8, PPO mini-batch 32, GPUs) by copying kept
    trajectories (ragen/trainer/agent_trainer.py:1190-1196, :104-110) and skips an empty one (:1126-1186)."""
    assert [paper.ragen_duplicates(16 * k) for k in range(9)] == [0, 16, 0, 16, 0, 16, 0, 16, 0]
    assert paper.ragen_duplicates(16, gpus=3) == 80  # lcm(8, 32, 3) = 96
    assert paper.ragen_duplicate_share([8, 8]) == 0.0  # a full batch is never padded
    assert paper.ragen_duplicate_share([1, 3, 0]) == pytest.approx((16 / 32 + 16 / 64) / 2)  # empty steps left out
    assert math.isnan(paper.ragen_duplicate_share([0, 0]))
