"""Item fingerprints: a hash of everything that changes an item's results.

Stored in ``metadata.json`` and the manifest; on resume a finished item is
reused only when its fingerprint matches, and a mismatch names the fields
that changed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FINGERPRINT_VERSION = 1


def model_identity(name: str, model: str | None, api: str) -> dict[str, Any]:
    """Name and path/id; for a local path also the files' sizes and mtimes (a retrained checkpoint differs)."""
    identity: dict[str, Any] = {"name": name, "model": model, "api": api}
    if model and os.path.exists(model):
        path = Path(model)
        files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
        identity["files"] = [[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in files[:200]]
    return identity


def digest(parts: Mapping[str, Any]) -> str:
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ between two fingerprint part dicts."""
    changed: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            changed.extend(changed_fields(a, b, f"{prefix}{key}."))
        else:
            changed.append(f"{prefix}{key}")
    return changed
