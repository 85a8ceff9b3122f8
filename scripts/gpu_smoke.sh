#!/usr/bin/env bash
# A lab's first GPU node: bash scripts/gpu_smoke.sh MODEL_FOLDER [--gpus N] [--steps 5] (after scripts/setup_gpu.sh).
# 5 steps of GRPO on Sokoban through veRL with vLLM rollouts, filter and MI on; prints tokens/s, the step-time split,
# peak memory beside preflight's estimate (scripts/gpu_smoke.py). VENV picks the environment (default .venv-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${VENV:-.venv-gpu}/bin/python" scripts/gpu_smoke.py "$@"
