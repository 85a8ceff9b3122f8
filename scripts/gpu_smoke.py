"""A lab's first GPU node, in one command: 5 steps of GRPO on Sokoban through veRL with vLLM rollouts, the filter and
the MI diagnostics on, then what was measured beside what preflight estimated.

    bash scripts/gpu_smoke.sh /models/Qwen2.5-0.5B-Instruct [--gpus 1] [--steps 5]
    python scripts/gpu_smoke.py --cpu        # the same plumbing on this CPU (a micro model on Countdown, HF rollouts)

Prints the stack's versions, tokens per second, the step-time split (generation, log-probs, update, weight sync,
diagnostics), the peak memory per GPU measured against preflight's estimate (`recipes.verl.preflight`), and whether
the filter and the MI proxies ran. Exit 0 when the run finished and both ran; 1 otherwise (the reason in one line); 2 on bad input.
Everything it writes goes to a scratch folder it names (MLflow store, checkpoints).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SPLIT = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights", "filter",
         "diagnostics")


def overrides(args: argparse.Namespace, scratch: Path) -> list[str]:
    common = ["backend=verl", "algorithm=grpo", "hooks=[collapse]", "diagnostics.mi_every=5",
              f"mlflow.tracking_uri=sqlite:///{scratch / 'mlflow.db'}",
              f"trainer.checkpoint_dir={scratch / 'checkpoints'}", "trainer.progress=false",
              "mlflow.experiment_name=gpu-smoke"]
    if args.cpu:  # the plumbing only: a micro model with a small Countdown warm start (so that its replies differ
        #           by prompt and the filter has groups to rank), HF rollouts, 4 prompts x 4 samples, 2 steps
        return [*common, "trainer=test", "task=countdown", "filter=top_k", "filter.value=0.5",
                "filter.include_zero=true", "trainer.total_steps=2", "trainer.prompts_per_step=4",
                "trainer.samples_per_prompt=4", "trainer.mini_batch_size=4", "trainer.max_response_tokens=64",
                "trainer.val_every=0", "diagnostics.num_samples=8", "model.preset.hidden_size=32",
                "model.preset.num_hidden_layers=1", "model.preset.num_attention_heads=2",
                "model.preset.num_key_value_heads=1", "model.preset.intermediate_size=64",
                "model.warm_start.enabled=true", "model.warm_start.demos=8", "model.warm_start.epochs=60",
                "model.warm_start.eval_every=60", "model.warm_start.lr=1e-2", "model.warm_start.batch_size=4",
                "model.warm_start.eval_episodes=2", "model.warm_start.max_response_tokens=16"]
    return [*common, "task=sokoban", "filter=top_p", "trainer=paper", "model=hf", f"model.path={args.model}",
            f"trainer.total_steps={args.steps}",
            "trainer.val_every=0", "verl.rollout=vllm", f"verl.gpus_per_node={args.gpus}", "verl.nnodes=1"]


def stack() -> str:
    """The versions this run trains with (Ray's workers inherit the driver's environment)."""
    from importlib import metadata

    import torch
    import transformers
    import verl

    line = (f"torch {torch.__version__} (cuda available: {'yes' if torch.cuda.is_available() else 'no'}), "
            f"transformers {transformers.__version__}, veRL {verl.__version__}")
    try:
        return f"{line}, vLLM {metadata.version('vllm')}"
    except metadata.PackageNotFoundError:
        return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="a Hugging Face checkpoint folder, e.g. Qwen2.5-0.5B-Instruct")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--gpu-mem-gb", type=float, default=80.0, help="each GPU's memory, for the estimate")
    parser.add_argument("--cpu", action="store_true", help="rehearse on this CPU with the tiny model")
    args = parser.parse_args()

    from mlflow import MlflowClient

    from analysis import names
    from orchlib.errors import OrchError
    from recipes.config.schema import compose_train_config
    from recipes.run.training import run_training
    from recipes.runtime.hf_folder import hf_folder_problems
    from recipes.verl.preflight import preflight_cell

    if not args.cpu:
        if not args.model:
            print("gpu_smoke: error: give the model folder (e.g. /models/Qwen2.5-0.5B-Instruct), or --cpu",
                  file=sys.stderr)
            return 2
        problems = hf_folder_problems(args.model)
        if problems:
            print(f"gpu_smoke: error: {problems[0]}", file=sys.stderr)
            return 2
    scratch = Path(tempfile.mkdtemp(prefix="orch-gpu-smoke-"))
    try:
        cfg = compose_train_config(overrides(args, scratch))
    except OrchError as err:
        print(f"gpu_smoke: error: {err}", file=sys.stderr)
        return 2
    estimate = None if args.cpu else preflight_cell(cfg, 1, args.gpus, args.gpu_mem_gb)
    if estimate is not None and estimate.problems:
        for line in estimate.problems:
            print(f"gpu_smoke: preflight: {line}")
    print(f"gpu_smoke: stack: {stack()}")
    print(f"gpu_smoke: training {cfg.trainer.total_steps} steps ({'cpu rehearsal' if args.cpu else args.model}); "
          f"scratch {scratch}", flush=True)
    result = run_training(cfg)
    if result.status != "finished":
        print(f"gpu_smoke: the run ended {result.status}: {result.reason}")
        return 1
    client = MlflowClient(f"sqlite:///{scratch / 'mlflow.db'}")
    metrics = client.get_run(result.mlflow_run_id).data.metrics

    def series(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(result.mlflow_run_id, key), key=lambda m: m.step)
                if m.step >= 1]

    steps = series(names.STEP_TIME)
    later = steps[1:] or steps  # the first step carries start-up (compilation, CUDA graphs, warm-up)
    print(f"step time: {sum(later) / len(later):.2f} s mean after the first ({steps[0]:.2f} s first)")
    throughput = series("perf/throughput")
    if throughput:
        print(f"throughput: {sum(throughput[1:] or throughput) / len(throughput[1:] or throughput):,.0f} tokens/s "
              "per GPU (veRL's perf/throughput)")
    split = {key: series(f"timing_s/{key}") for key in SPLIT}
    shown = [f"{key} {sum(values) / len(values):.2f}" for key, values in split.items() if values]
    print("split (s per step): " + ", ".join(shown))
    peak = max(series(names.PEAK_MEMORY), default=math.nan)
    if estimate is not None and estimate.memory is not None:
        memory = estimate.memory
        print(f"peak memory: {peak:.1f} GB per GPU measured (the trainer's torch allocation; vLLM's own share is not "
              f"in it) vs preflight: update {memory.update_gb:.1f} GB, rollout {memory.rollout_gb:.1f} GB of "
              f"{args.gpu_mem_gb:g}")
    else:
        print(f"peak memory: {peak:.2f} GB (the actor worker's peak resident set on cpu; no GPU estimate)")
    filtered = "rollout/kept_ratio" in metrics
    mi = names.RETRIEVAL_ACC in metrics
    print(f"filter ran: {'yes' if filtered else 'NO'}; MI proxies ran: {'yes' if mi else 'NO'}")
    return 0 if filtered and mi else 1


if __name__ == "__main__":
    sys.exit(main())
