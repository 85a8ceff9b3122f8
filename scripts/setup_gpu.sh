#!/usr/bin/env bash
# The GPU stack on a Linux x86_64 node with NVIDIA GPUs, in one command:
#
#     bash scripts/setup_gpu.sh            # checks, then .venv-gpu with everything (flash-attn built from source)
#     bash scripts/setup_gpu.sh --check    # only the checks (driver, Python, nvcc), nothing installed
#     VENV=/shared/orch-gpu SKIP_FLASH_ATTN=1 bash scripts/setup_gpu.sh
#
# Installs orch with veRL 0.9.1's own vllm extra, every package pinned by scripts/gpu/constraints.txt (torch 2.11.0,
# the CUDA 13 build PyPI serves; vLLM 0.24.0; transformers 5.9.0), then flash-attn 2.8.3 built from source (orch's
# veRL config asks for flash_attention_2 on GPU, and veRL uses flash-attn's fused cross-entropy when it imports; the
# build needs nvcc from a CUDA 13 toolkit and takes 30-60 min, MAX_JOBS limits its memory). This project has no GPU:
# this script is not run by its CI, which resolves the same pins for this platform (tests/test_gpu_stack.py) and runs
# the veRL smoke test under transformers 5.9.0. After it: bash scripts/gpu_smoke.sh MODEL_FOLDER.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-gpu}
FLASH_ATTN=flash-attn==2.8.3
MIN_DRIVER=580  # CUDA 13.0's minimum Linux driver (NVIDIA's CUDA toolkit release notes)

fail() { echo "setup_gpu.sh: $*" >&2; exit 1; }

[ "$(uname -sm)" = "Linux x86_64" ] || fail "needs Linux x86_64 (this is $(uname -sm)): the pinned wheels are built for it"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12)))' \
  || fail "needs Python 3.11 or 3.12 (PYTHON=$PYTHON is $("$PYTHON" -V 2>&1))"
command -v nvidia-smi >/dev/null || fail "no NVIDIA driver on this node (nvidia-smi not found): run it on a GPU node"
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
[ "${driver%%.*}" -ge "$MIN_DRIVER" ] 2>/dev/null \
  || fail "NVIDIA driver $driver is older than $MIN_DRIVER, which the CUDA 13 build of torch 2.11.0 needs; update the driver (docs/verl.md#the-gpu-stack)"
if [ -z "${SKIP_FLASH_ATTN:-}" ]; then
  command -v nvcc >/dev/null || fail "flash-attn builds from source and needs nvcc (a CUDA 13 toolkit): load it, or set SKIP_FLASH_ATTN=1 and run with verl.attention=sdpa (docs/verl.md#the-gpu-stack)"
fi
gpus=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c | sed 's/^ *//')
echo "setup_gpu.sh: driver $driver; GPUs: $gpus"
[ "${1:-}" = "--check" ] && { echo "setup_gpu.sh: checks passed"; exit 0; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -c scripts/gpu/constraints.txt -e '.[gpu,postgres]'
if [ -z "${SKIP_FLASH_ATTN:-}" ]; then
  echo "setup_gpu.sh: building $FLASH_ATTN (MAX_JOBS=${MAX_JOBS:=4}; 30-60 min)"
  MAX_JOBS=$MAX_JOBS "$VENV/bin/python" -m pip install --quiet --no-build-isolation -c scripts/gpu/constraints.txt \
    "$FLASH_ATTN"
fi
"$VENV/bin/python" - <<'PY'
import torch, transformers, verl, vllm
assert torch.cuda.is_available(), "torch sees no GPU"
print(f"setup_gpu.sh: ready: torch {torch.__version__} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPUs), "
      f"vLLM {vllm.__version__}, transformers {transformers.__version__}, veRL {verl.__version__}")
PY
