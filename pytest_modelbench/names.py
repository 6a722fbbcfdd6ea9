"""Names used as path components (run ids, item directories, baseline files), made safe exactly."""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")
_STEP = re.compile(r"^(?P<base>.+)-step(?P<step>\d+)$")
_MAX_COMPONENT = 120


def safe_component(name: str) -> str:
    """``name`` as one path component, exactly: unchanged when it is already safe (letters,
    digits, ``._+=-``; not empty, not starting or ending with a dot; at most 120 characters),
    else a readable part, ``~`` and a hash of the whole name. ``~`` never occurs in an unchanged
    name, so two different names never share a component (``med:x`` vs ``med_x``, long ids that
    differ only at the end, non-ASCII ids)."""
    cleaned = _UNSAFE.sub("_", name).strip(".")
    if cleaned == name and 0 < len(name) <= _MAX_COMPONENT:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{(cleaned or '_')[: _MAX_COMPONENT - len(digest) - 1]}~{digest}"


def checkpoint_of(model: str) -> tuple[str, int] | None:
    """``(family, step)`` for a checkpoint-sweep model label ``<name>-step<N>``, else None."""
    match = _STEP.match(model)
    return (match["base"], int(match["step"])) if match else None
