"""GPU lists as users write them (``--gpus 0,1,3``, ``CUDA_VISIBLE_DEVICES``): parsed and checked."""

from __future__ import annotations

import re

GPU_ID = re.compile(r"^(?:\d+|(?:GPU|MIG)-[0-9A-Za-z/_-]+)$")
_NONE_WORDS = frozenset({"", "none", "cpu", "-1", "nodevfiles"})


class GpuSpecError(ValueError):
    """A malformed GPU list given explicitly (``--gpus``)."""


def parse_gpu_list(text: str, source: str) -> list[str]:
    """``"0,1,3"`` → ``["0", "1", "3"]``; ``""``/``none``/``-1`` → ``[]``; else GpuSpecError."""
    if text.strip().lower() in _NONE_WORDS:
        return []
    ids: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if not GPU_ID.match(token):
            raise GpuSpecError(
                f"{source}={text!r}: {token!r} is not a GPU index or GPU-<uuid>; "
                "expected a comma-separated list such as 0,1,3 (or 'none' for no GPU)"
            )
        if token not in ids:
            ids.append(token)
    return ids
