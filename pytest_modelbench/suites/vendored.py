"""Vendored benchmark data: lazy, cached, checksum-verified loading from the installed package.

Files live in ``suites/data/<suite>/`` (built by ``scripts/vendor_data.py``)
and are listed with their SHA-256 in ``suites/data/SHA256SUMS``. Reading a
file verifies it against that manifest, so a damaged install fails loudly
instead of scoring against corrupted gold answers.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import threading
from collections.abc import Mapping
from functools import cache, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

MANIFEST = "SHA256SUMS"
Record = Mapping[str, Any]
_lock = threading.Lock()


class DataIntegrityError(RuntimeError):
    """A vendored data file is missing or does not match its recorded checksum."""


def data_root() -> Traversable:
    """The ``suites/data`` folder inside the installed package."""
    return resources.files("pytest_modelbench.suites").joinpath("data")


@lru_cache(maxsize=1)
def manifest() -> dict[str, str]:
    """``relative path -> sha256`` from ``SHA256SUMS``."""
    try:
        text = data_root().joinpath(MANIFEST).read_text(encoding="utf-8")
    except OSError as error:
        raise DataIntegrityError(
            f"pytest_modelbench/suites/data/{MANIFEST} is missing ({error}); "
            "reinstall pytest-modelbench or run scripts/vendor_data.py"
        ) from error
    sums = {}
    for line in text.splitlines():
        digest, _, path = line.partition("  ")
        if digest and path:
            sums[path.strip()] = digest.strip()
    return sums


def _resource(path: str) -> Traversable:
    node = data_root()
    for part in path.split("/"):
        node = node.joinpath(part)
    return node


@cache
def read_verified(path: str) -> bytes:
    """The bytes of ``data/<path>``, after checking them against the manifest."""
    expected = manifest().get(path)
    if expected is None:
        raise DataIntegrityError(f"suites/data/{path} is not listed in {MANIFEST}")
    try:
        data = _resource(path).read_bytes()
    except OSError as error:
        raise DataIntegrityError(f"suites/data/{path} cannot be read: {error}") from error
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise DataIntegrityError(
            f"suites/data/{path}: sha256 {actual} does not match {MANIFEST} ({expected}); "
            "the installed data is damaged: reinstall pytest-modelbench"
        )
    return data


@cache
def _load(path: str) -> tuple[Record, ...]:
    text = gzip.decompress(read_verified(path)).decode("utf-8")
    return tuple(_frozen(json.loads(line)) for line in text.split("\n") if line)


def _frozen(value: Any) -> Any:
    """``value`` with its lists as tuples. A tuple of strings (MMLU's options), then the record
    holding it, is dropped from the garbage collector's lists by its first full pass: MMLU's
    14,042 records otherwise add 28,000 objects to every later one (two in pytest's
    ``unconfigure``, two or three at interpreter exit)."""
    if isinstance(value, dict):
        return {
            key: _frozen(item) if isinstance(item, (dict, list)) else item
            for key, item in value.items()
        }
    if isinstance(value, list):
        return tuple(_frozen(item) if isinstance(item, (dict, list)) else item for item in value)
    return value


def load_jsonl(path: str) -> tuple[Record, ...]:
    """Records of a vendored ``.jsonl.gz`` file (parsed once per process; do not mutate)."""
    with _lock:  # suites may be built from several runner threads at once
        return _load(path)


def checksum(*paths: str) -> str:
    """One SHA-256 over the manifest digests of ``paths`` (cheap: no file is read)."""
    sums = manifest()
    missing = [path for path in paths if path not in sums]
    if missing:
        raise DataIntegrityError(f"not listed in {MANIFEST}: {', '.join(missing)}")
    joined = "".join(f"{sums[path]}  {path}\n" for path in sorted(paths))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()
