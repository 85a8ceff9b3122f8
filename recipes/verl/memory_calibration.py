"""The memory model's calibration set: public configurations that ran, or could not, on a stated GPU.

    python -m recipes.verl.memory_calibration      # each case: the predicted peak beside what is known

Every case is a configuration published with the GPU it ran on (or the statement that it does not fit), read into a
`MemorySetup` key by key; `tests/recipes/verl/test_verl_preflight.py` asserts that `estimate_memory` calls every one
right (fits / does not fit), and docs/verl.md reports the margins. GPU memory is what `nvidia-smi` reports for an
80 GB H100 or H800 (81,559 MiB = 79.6 GiB).

Sequence lengths. A micro-batch of a fixed number of sequences holds at most that many x the longest sequence: with
padding (RAGEN's runs: veRL's `use_remove_padding` defaults to false and RAGEN never sets it) every sequence is padded
to the micro-batch's longest, bounded by `max_model_len`; with `use_remove_padding=True` (veRL's tuning scripts) only
real tokens are packed, and the bound is the data's longest prompt plus the response cap. For GSM8K (the tuning
scripts' data) that prompt bound is taken as 256 tokens: veRL's own GSM8K quickstart log shows prompts of 68-185
tokens (docs/start/quickstart.rst:116-117 in github:volcengine/verl). Every length is an upper bound, so a "fits"
call does not rest on a guess of typical lengths.

Not in the set, and why: veRL's GRPO-LoRA MIN rows (device_tuning.rst) use micro-batches of 16-116 sequences whose
memory depends on GSM8K's real response lengths (1024-token caps; at the caps none of them would fit, and their
scripts bisect the batch by trial, e.g. qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh:10); OOM reports whose issue text
leaves out settings the estimate needs (verl#855: 14B on 8 H100, its vLLM share cut off; verl#3366: LoRA Coder-7B,
its micro-batches cut off); TRL's GRPO measurement (trl#3456), which is TRL's own logits path, not veRL's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recipes.verl.memory import BUILTIN, Architecture, MemoryEstimate, MemorySetup, estimate_memory

H100_GIB = 79.6  # 81,559 MiB, an 80 GB H100's (and H800's) memory as nvidia-smi reports it
GSM8K_PROMPT_BOUND = 256  # tokens; veRL's GSM8K quickstart log: prompts of 68-185 tokens
RAGEN_PR160 = "github:mll-lab-nu/RAGEN PR #160 (refs/pull/160/merge 3523507c)"
VERL_TUNING = "github:volcengine/verl 55cfe6cb (the last commit with examples/tuning/), docs/perf/device_tuning.rst"


@dataclass(frozen=True)
class CalibrationCase:
    name: str
    source: str  # repository, commit, path:line
    hardware: str  # GPUs as stated by the source
    verl_version: str
    settings: str  # what the estimate reads, in the source's own keys
    outcome: str  # what is known: "ran" | "does not fit"
    arch: Architecture
    setup: MemorySetup

    @property
    def fits(self) -> bool:
        return self.outcome == "ran"

    def estimate(self) -> MemoryEstimate:
        return estimate_memory(self.arch, self.setup)


def _ragen(world: int = 1, **kw) -> MemorySetup:
    """RAGEN's hosting (its veRL submodule, legacy FSDP worker): padded micro-batches, the reference policy resident
    in bf16 (no ref offload set), flash-attn installed, entropy in the loss (entropy_coeff 0.01 in these runs)."""
    return MemorySetup(world=world, gpu_mem_gb=H100_GIB, ref_resident=True, fused_cross_entropy=True, **kw)


def _tuning(world: int, **kw) -> MemorySetup:
    """veRL's tuning scripts: remove padding, entropy_coeff 0, flash-attn, the reference offloaded."""
    return MemorySetup(world=world, gpu_mem_gb=H100_GIB, remove_padding=True, entropy_in_loss=False,
                       fused_cross_entropy=True, **kw)


def _gsm8k_min_row(world: int, gpu_memory_utilization: float, tensor_parallel: int = 1) -> MemorySetup:
    """veRL's MIN-row GRPO runs on GSM8K: micro-batch 16 of prompt (bounded) + 1024 response tokens, offloaded."""
    return _tuning(world, token_budget=16 * (GSM8K_PROMPT_BOUND + 1024), max_model_len=2048, offload=True,
                   tensor_parallel=tensor_parallel, gpu_memory_utilization=gpu_memory_utilization)


CASES: tuple[CalibrationCase, ...] = (
    CalibrationCase(
        "RAGEN Sokoban GRPO, Qwen2.5-0.5B, 1 H100", f"{RAGEN_PR160}: sokoban.slurm:7,48-58", "1x H100 80GB",
        "RAGEN's veRL (0.6.1)",
        "micro_batch_size_per_gpu=8, max_model_len=2048, gpu_memory_utilization=0.80, entropy_coeff=0.01",
        "ran", BUILTIN["Qwen2.5-0.5B"],
        _ragen(token_budget=8 * 2048, max_model_len=2048, gpu_memory_utilization=0.8)),
    CalibrationCase(
        "RAGEN Sokoban GRPO v2 (KL loss), Qwen2.5-0.5B, 1 H100",
        "github:mll-lab-nu/RAGEN 0707192a: sokoban_0p5b_v2.slurm:7,48-66", "1x H100 80GB", "RAGEN's veRL (0.6.1)",
        "micro_batch_size_per_gpu=8, max_model_len=4096, gpu_memory_utilization=0.80, use_kl_loss=True",
        "ran", BUILTIN["Qwen2.5-0.5B"],
        _ragen(token_budget=8 * 4096, max_model_len=4096, gpu_memory_utilization=0.8)),
    CalibrationCase(
        "RAGEN Sokoban GRPO, Qwen2.5-3B + LoRA rank 8, 1 H100", f"{RAGEN_PR160}: grpo_full_3b_lora.slurm:7,16-19,50-66",
        "1x H100 80GB", "RAGEN's veRL (0.6.1)",
        "lora.rank=8 (all-linear), micro_batch_size_per_gpu=4, max_model_len=3072, gpu_memory_utilization=0.80",
        "ran", BUILTIN["Qwen2.5-3B"],
        _ragen(token_budget=4 * 3072, max_model_len=3072, gpu_memory_utilization=0.8, lora_rank=8)),
    CalibrationCase(
        "the same 3B run full-parameter, 1 H100", f"{RAGEN_PR160}: grpo_full_3b_lora.slurm:16-17 (\"LoRA reduces "
        "Adam states from ~37GB to ~0.3GB, making 3B feasible on H100 80GB\")", "1x H100 80GB",
        "RAGEN's veRL (0.6.1)", "as above, lora.rank=0", "does not fit", BUILTIN["Qwen2.5-3B"],
        _ragen(token_budget=4 * 3072, max_model_len=3072, gpu_memory_utilization=0.8)),
    CalibrationCase(
        "veRL MIN: Qwen2-7B GRPO, 2 H800", f"{VERL_TUNING}:126-134; examples/tuning/7b/qwen2-7b_grpo_2_h800_fsdp_vllm.sh"
        ":11-40", "2x H800 80GB", "veRL 0.3-0.4 (vLLM 0.8.2)",
        "param+optimizer offload, use_remove_padding, ppo_micro_batch_size_per_gpu=16, prompt 1024 + response 1024, "
        "tensor_model_parallel_size=2, gpu_memory_utilization=0.6, entropy_coeff=0",
        "ran", BUILTIN["Qwen2.5-7B"],  # Qwen2-7B has Qwen2.5-7B's dimensions
        _gsm8k_min_row(2, 0.6, tensor_parallel=2)),
    CalibrationCase(
        "below the MIN row: the same 7B run on 1 H800", f"{VERL_TUNING}:126-134 (2 GPUs the minimum)",
        "1x H800 80GB", "veRL 0.3-0.4", "as above on 1 GPU, tensor_model_parallel_size=1", "does not fit",
        BUILTIN["Qwen2.5-7B"],
        _gsm8k_min_row(1, 0.6)),
    CalibrationCase(
        "veRL MIN: Qwen2.5-Coder-14B GRPO, 4 H800",
        f"{VERL_TUNING}:161-169; examples/tuning/14b/qwen2_14b_grpo_4_h800_fsdp_vllm.sh:4,11-40", "4x H800 80GB",
        "veRL 0.3-0.4 (vLLM 0.8.2)",
        "param+optimizer offload, use_remove_padding, ppo_micro_batch_size_per_gpu=16, prompt 1024 + response 1024, "
        "tensor_model_parallel_size=4, gpu_memory_utilization=0.5, entropy_coeff=0",
        "ran", BUILTIN["Qwen2.5-14B"],
        _gsm8k_min_row(4, 0.5, tensor_parallel=4)),
    CalibrationCase(
        "below the MIN row: the same 14B run on 2 H800", f"{VERL_TUNING}:161-169 (4 GPUs the minimum)",
        "2x H800 80GB", "veRL 0.3-0.4", "as above on 2 GPUs, tensor_model_parallel_size=2", "does not fit",
        BUILTIN["Qwen2.5-14B"],
        _gsm8k_min_row(2, 0.5, tensor_parallel=2)),
    CalibrationCase(
        "veRL tuning: Qwen2.5-Math-1.5B Dr.GRPO, 1 H100, no offload",
        "github:volcengine/verl 55cfe6cb: examples/tuning/1.5b/qwen2.5math-1.5b_grpo_1_h100_fsdp_vllm.sh:4-5,18-49 "
        "(with its training-curve screenshot)", "1x H100 80GB", "veRL 0.4 (its tuning directory)",
        "no param/optimizer offload, use_remove_padding, ppo_micro_batch_size_per_gpu=4, prompt 1024 + response "
        "3000, gpu_memory_utilization=0.4, entropy_coeff=0, ref offload",
        "ran", BUILTIN["Qwen2.5-1.5B"],  # Qwen2.5-Math-1.5B has Qwen2.5-1.5B's dimensions
        _tuning(1, token_budget=4 * 4024, max_model_len=4024, gpu_memory_utilization=0.4)),
)


def table() -> list[str]:
    """One line per case: the predicted peak and verdict beside what is known, and the headroom (GiB)."""
    lines = []
    for case in CASES:
        estimate = case.estimate()
        verdict = "fits" if estimate.fits else "does not fit"
        right = "right" if estimate.fits == case.fits else "WRONG"
        lines.append(f"{case.name}: predicted peak {estimate.peak_gb:.1f} of {case.setup.gpu_mem_gb:g} GiB "
                     f"(rollout {estimate.rollout_gb:.1f}, update {estimate.update_gb:.1f}) -> {verdict}; known: "
                     f"{case.outcome} [{right}]  ({case.hardware}, {case.verl_version}; {case.source})")
    return lines


def record_line() -> str:
    """The memory verdict's measured record, in one line, for every report that prints a fits / does not fit: how
    many calibration cases it calls right, and how close to the GPU the runs that fit were predicted."""
    estimates = [(case, case.estimate()) for case in CASES]
    right = sum(estimate.fits == case.fits for case, estimate in estimates)
    ran = [(case.setup.gpu_mem_gb - estimate.peak_gb, estimate.peak_gb / case.setup.gpu_mem_gb)
           for case, estimate in estimates if case.fits]
    tightest = max(share for _, share in ran)
    loo, _ = leave_one_out()
    inferred = sum(not case.fits for case in CASES)
    return (f"memory verdicts: {right} of {len(CASES)} public runs called right (recipes.verl.memory_calibration), "
            f"in sample; leave-one-out {loo} of {len(CASES)}; its {inferred} 'does not fit' cases are inferred, none "
            f"seen to fail; those that ran were predicted {min(h for h, _ in ran):.1f}-{max(h for h, _ in ran):.1f} "
            f"GiB under their GPU (the tightest at {tightest:.0%} of it): a class within a few % of its GPU is not a "
            "safe fit")


def margin_range() -> tuple[float, float]:
    """The range of the model's one unmeasured constant, the margin `recipes.verl.memory.CONTEXT_GB` (added once to
    every phase's peak), over which every case is still called right: (lowest, highest) in GiB."""
    from recipes.verl.memory import CONTEXT_GB

    estimates = [(case, case.estimate()) for case in CASES]
    headroom = min(case.setup.gpu_mem_gb - estimate.peak_gb for case, estimate in estimates if case.fits)
    over = min(estimate.peak_gb - case.setup.gpu_mem_gb for case, estimate in estimates if not case.fits)
    return CONTEXT_GB - over, CONTEXT_GB + headroom


def leave_one_out() -> tuple[int, int]:
    """(cases called right by a model calibrated without them, cases). No constant of the model is fitted on these
    cases (its bytes are measured on CPU with veRL's functions or read from veRL's code), except that its one
    unmeasured margin must leave the others right: a case counts as right only when it is called right at every
    margin the other cases allow (:func:`margin_range` without it, within the margin's sign: 0 or more)."""
    from recipes.verl.memory import CONTEXT_GB

    estimates = [(case, case.estimate()) for case in CASES]
    right = 0
    for index, (case, estimate) in enumerate(estimates):
        others = [pair for other, pair in enumerate(estimates) if other != index]
        top = min([c.setup.gpu_mem_gb - e.peak_gb for c, e in others if c.fits] or [math.inf])
        bottom = min([e.peak_gb - c.setup.gpu_mem_gb for c, e in others if not c.fits] or [math.inf])
        low, high = max(0.0, CONTEXT_GB - bottom), CONTEXT_GB + top  # the margins the other cases allow
        worst = estimate.peak_gb - CONTEXT_GB + (high if case.fits else low)
        right += (worst <= case.setup.gpu_mem_gb) == case.fits
    return right, len(CASES)


def fit_record() -> str:
    """The memory verdict's record for a fit refusal, in one line: in-sample and leave-one-out accuracy on the
    calibration set, with the inferred cases marked (no "does not fit" case was seen to fail)."""
    estimates = [(case, case.estimate()) for case in CASES]
    ran = [(case, estimate) for case, estimate in estimates if case.fits]
    inferred = [(case, estimate) for case, estimate in estimates if not case.fits]
    loo, total = leave_one_out()
    return (f"memory model's record: {sum(e.fits for _, e in ran)} of {len(ran)} public runs that ran called "
            f"'fits', {sum(not e.fits for _, e in inferred)} of {len(inferred)} 'does not fit' cases called so -- "
            f"those {len(inferred)} are inferred (below a published minimum GPU count or from a script's note), none "
            f"seen to fail; leave-one-out {loo} of {total} (recipes.verl.memory_calibration)")


if __name__ == "__main__":
    print("\n".join(table()))
