#!/usr/bin/env bash
# Create .venv and install orch with its dev tools, with uv (the version scripts/constraints.txt pins, bootstrapped by
# pip) or, where uv cannot be had or fails, with pip: scripts/installer.sh. ORCH_SETUP_INSTALLER=pip installs with pip
# alone. Torch is the CPU build of 2.13.0: the machine ships it on disk (pip's find-links, which uv is handed), while
# an unpinned torch would pull a multi-GB CUDA build. scripts/constraints.txt pins veRL and its heavy dependencies to
# the tested versions, for both installers. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
source scripts/installer.sh

with_uv() {  # one resolution: torch's CPU build comes from pip's find-links; pip itself upgraded as with pip
  uv_run install -c scripts/constraints.txt -e '.[dev]' pip --upgrade-package pip
}
with_pip() {  # torch first (its CPU build, before anything can ask for another), then the rest
  pip_run install --upgrade pip && pip_run install "torch==2.13.0" && pip_run install -c scripts/constraints.txt -e '.[dev]'
}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
installer_run .venv with_uv with_pip
# Compile orch's own modules once (the installer compiled the installed packages): where PYTHONDONTWRITEBYTECODE is
# set, as on this project's machines, every process would otherwise compile the ones it imports from source each time.
.venv/bin/python -m compileall -q -j 0 orchlib envs recipes orchestrator analysis tests > /dev/null
echo "setup.sh: .venv ready with $INSTALLER_USED ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
