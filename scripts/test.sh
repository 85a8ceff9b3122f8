#!/usr/bin/env bash
# The README's test command: set everything up on a fresh machine, then lint and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
