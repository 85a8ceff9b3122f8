#!/usr/bin/env bash
# Create .venv and install orch with its dev tools. CPU torch is pinned first: the machine ships torch 2.13.0 (CPU)
# on disk, while an unpinned torch would pull a multi-GB CUDA build. scripts/constraints.txt pins veRL and its
# heavy dependencies to the tested versions. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

pip_install() {  # pip, minus the machine's noisy "Location ... is ignored" lines; pip's exit status is kept
  .venv/bin/python -m pip install --quiet "$@" 2> >(grep -v '^WARNING: Location' >&2)
}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip_install --upgrade pip
pip_install "torch==2.13.0"
pip_install -c scripts/constraints.txt -e '.[dev]'
# Compile orch's own modules once (pip compiled the installed packages): where PYTHONDONTWRITEBYTECODE is set, as on
# this project's machines, every process would otherwise compile the ones it imports from source each time it starts.
.venv/bin/python -m compileall -q -j 0 orchlib envs recipes orchestrator analysis tests > /dev/null
echo "setup.sh: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
