#!/usr/bin/env bash
# The README's test command: set everything up on a fresh machine (venv, a real single-node SLURM, PostgreSQL,
# headless Chromium, bubblewrap), then lint and run the whole test suite. Must run as root for the services.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/setup_vllm_cpu.sh  # the optional vLLM-on-CPU environment tests/recipes/test_vllm_cpu.py trains through
bash scripts/setup_slurm.sh
ORCH_TEST_POSTGRES_URL="$(bash scripts/setup_postgres.sh)"
export ORCH_TEST_POSTGRES_URL
if ! command -v chromium >/dev/null; then
  echo "test.sh: installing Debian chromium (for the report render test)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }
fi
if ! command -v bwrap >/dev/null; then
  echo "test.sh: installing Debian bubblewrap (the DeepCoder sandbox)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null; }
fi

.venv/bin/ruff check .
.venv/bin/python -m pytest -q --durations=30 "$@"
