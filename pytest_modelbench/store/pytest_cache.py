"""pytest cache values written atomically, so a killed session never leaves a torn value."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from pytest_modelbench.store.files import StoreWriteError, atomic_write_text


def cache_get(config: pytest.Config, key: str, default: Any) -> Any:
    """``config.cache.get``; ``default`` without a cache (``-p no:cacheprovider``) or when
    the value cannot be read (a corrupt cache file must not stop the run)."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return default
    try:
        return cache.get(key, default)
    except Exception:
        return default


def cache_set(config: pytest.Config, key: str, value: Any) -> None:
    """``config.cache.set`` made atomic (temp file + rename): a kill never leaves a torn value."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return
    # _getvaluepath is private but has been stable since pytest 3; fall back to the public set()
    path_for = getattr(cache, "_getvaluepath", None)
    path = path_for(key) if path_for is not None else None
    if path is None or not path.parent.is_dir():
        cache.set(
            key, value
        )  # first write: let pytest create the cache directory (README, .gitignore)
        return
    try:
        atomic_write_text(path, json.dumps(value, ensure_ascii=False, indent=2), durable=False)
    except StoreWriteError as exc:
        warnings.warn(
            pytest.PytestCacheWarning(f"could not write cache key {key}: {exc.strerror}"),
            stacklevel=2,
        )
