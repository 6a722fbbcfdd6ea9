"""Item fingerprints: a hash of everything that changes an item's results.

Stored in ``metadata.json`` and the manifest; on resume a finished item is
reused only when its fingerprint matches, and a mismatch names the fields
that changed (with their old and new values).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FINGERPRINT_VERSION = 1

# serve.args that only place or size the server; they do not change what the model answers
_RESOURCE_ONLY_SERVE_ARGS = frozenset(
    {
        "gpu_memory_utilization",
        "port",
        "host",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "swap_space",
        "disable_log_requests",
        "disable_log_stats",
        "uvicorn_log_level",
        "api_key",
        "served_model_name",
    }
)


def _hf_revision(model: str) -> str | None:
    """The commit of ``org/name`` in the local Hugging Face cache (``refs/main``), if downloaded."""
    if model.count("/") != 1:
        return None
    home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    ref = Path(home) / f"models--{model.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def model_identity(
    name: str, model: str | None, api: str, serve: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Name and path/id; for a local path the files' sizes and mtimes (a retrained checkpoint
    differs); for a model modelbench serves, the engine args that change outputs and the
    Hugging Face revision when the model is in the local cache."""
    identity: dict[str, Any] = {"name": name, "model": model, "api": api}
    if model and os.path.exists(model):
        path = Path(model)
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
        identity["files"] = [
            [p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in files[:200]
        ]
    if serve is not None:
        args = {
            k: v
            for k, v in dict(serve.get("args") or {}).items()
            if k not in _RESOURCE_ONLY_SERVE_ARGS
        }
        identity["serve"] = {"engine": serve.get("engine"), "args": args}
        if serve.get("command"):  # engine: command: its argv is the server
            identity["serve"]["command"] = list(serve["command"])
        revision = _hf_revision(model) if model and "files" not in identity else None
        if revision:
            identity["revision"] = revision
    return identity


def digest(parts: Mapping[str, Any]) -> str:
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ between two fingerprint part dicts."""
    return [name for name, _, _ in _changes(old, new, prefix)]


def _changes(
    old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = ""
) -> list[tuple[str, Any, Any]]:
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(_changes(a, b, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", a, b))
    return out


def _short(value: Any, limit: int = 40) -> str:
    text = "(unset)" if value is None else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_changes(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 4) -> str:
    """``env_args.path: "a.jsonl" -> "b.jsonl", seed: 0 -> 1`` (at most ``limit`` fields shown)."""
    changes = _changes(old, new)
    if not changes:
        return "fingerprint"
    shown = [f"{name}: {_short(a)} -> {_short(b)}" for name, a, b in changes[:limit]]
    if len(changes) > limit:
        shown.append(f"and {len(changes) - limit} more")
    return ", ".join(shown)
