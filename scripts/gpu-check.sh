#!/usr/bin/env bash
# The GPU path on a real GPU (perf/gpu_check.py), on a machine without a package index.
#
#   bash scripts/gpu-check.sh --pack DIR    # here, with an index: the wheels a GPU machine lacks
#   bash scripts/gpu-check.sh DIR [ARGS]    # there: install them and run the check
#   bash scripts/gpu-check.sh --dry-run     # anywhere: fake GPUs, no CUDA, this checkout
#
# A GPU machine typically has torch, pytest, pytest-xdist, aiohttp, pyarrow and nvidia-ml-py
# but neither vLLM nor an index. The check makes a virtual environment that sees those
# (--system-site-packages), installs pytest-modelbench and its other requirements from the
# carried wheels only (--no-index), and runs a stand-in engine that holds real CUDA memory.
# ARGS go to perf/gpu_check.py (--gib 8, --work DIR, --only NAME).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# the requirements that are not usually on a GPU machine (pure Python, or with wheels for it)
CARRIED="pyyaml pydantic filelock math-verify sympy ruamel.yaml pytest-xdist"

if [ "${1:-}" = "--pack" ]; then
  dir=${2:?usage: gpu-check.sh --pack DIR [--python-version 3.11] [--platform manylinux2014_x86_64]}
  shift 2
  mkdir -p "$dir"
  "$PYTHON" -m pip wheel --no-deps -w "$dir" .
  # binary wheels for the GPU machine's Python and platform (pass --python-version/--platform
  # when they differ from this one's)
  # shellcheck disable=SC2086  # the list is split into requirements on purpose
  "$PYTHON" -m pip download --only-binary=:all: -d "$dir" "$@" $CARRIED
  echo "wheels for the GPU machine in $dir: copy it there with this checkout"
  exit 0
fi

if [ "${1:-}" = "--dry-run" ]; then
  exec "$PYTHON" perf/gpu_check.py "$@"
fi

wheels=${1:?usage: gpu-check.sh WHEEL_DIR [perf/gpu_check.py args] (make it with --pack)}
shift
venv=${GPU_CHECK_VENV:-.venv-gpu-check}
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$venv"
fi
wheel=$(ls "$wheels"/pytest_modelbench-*.whl 2>/dev/null | tail -1 || true)
if [ -z "$wheel" ]; then
  # no carried wheel of the project: build one here (needs setuptools and wheel, no index)
  "$venv/bin/python" -m pip wheel --no-deps --no-build-isolation --no-index -w "$wheels" .
  wheel=$(ls "$wheels"/pytest_modelbench-*.whl | tail -1)
fi
"$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels" "$wheel[xdist]"
"$venv/bin/python" -c 'import pynvml, torch; assert torch.cuda.is_available(), "no CUDA device"'
exec "$venv/bin/python" perf/gpu_check.py "$@"
