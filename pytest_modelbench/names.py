"""Names used as path components (run ids, item directories, baseline files), made safe exactly,
and as pytest writes item ids into node ids."""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")
_STEP = re.compile(r"^(?P<base>.+)-step(?P<step>\d+)$")
_MAX_COMPONENT = 120
# pytest's escaping of parametrize ids (``_pytest.compat.ascii_escaped``)
_NON_PRINTABLE = {i: f"\\x{i:02x}" for i in range(128) if i not in range(32, 127)}
_NON_PRINTABLE.update({ord("\t"): "\\t", ord("\r"): "\\r", ord("\n"): "\\n"})


def safe_component(name: str) -> str:
    """``name`` as one path component, exactly: unchanged when it is already safe (letters,
    digits, ``._+=-``; not empty, not starting or ending with a dot; at most 120 characters),
    else a readable part, ``~`` and a hash of the whole name. ``~`` never occurs in an unchanged
    name, so two different names never share a component (``med:x`` vs ``med_x``, long ids that
    differ only at the end, non-ASCII ids)."""
    cleaned = _UNSAFE.sub("_", name).strip(".")
    if cleaned == name and 0 < len(name) <= _MAX_COMPONENT:
        return name
    digest = short_hash(name)
    return f"{(cleaned or '_')[: _MAX_COMPONENT - len(digest) - 1]}~{digest}"


def short_hash(text: str, digits: int = 12) -> str:
    """The first ``digits`` hex digits of ``text``'s SHA-256: the ``~hash`` of path components
    and the ``+hash`` of item ids that would otherwise collide."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:digits]


def checkpoint_of(model: str) -> tuple[str, int] | None:
    """``(family, step)`` for a checkpoint-sweep model label ``<name>-step<N>``, else None."""
    match = _STEP.match(model)
    return (match["base"], int(match["step"])) if match else None


def param_id(item_id: str) -> str:
    """How pytest writes ``item_id`` into node ids (``test_benchmark[<param id>]``): ASCII, with
    non-ASCII and unprintable characters escaped (``modèle`` → ``mod\\xe8le``), as
    ``_pytest.compat.ascii_escaped`` does unless escaping is switched off."""
    return item_id.encode("unicode_escape").decode("ascii").translate(_NON_PRINTABLE)
