"""A crash-proof ``--lf``: pytest's ``cache/lastfailed`` updated as each test finishes.

pytest's own ``LFPlugin`` keeps failures in memory and writes the cache key
only at session end, so a session killed after ten hours forgets which items
failed. :class:`LastFailedRecorder` applies the same rule as ``LFPlugin``
(a failure adds the node id, a pass or skip removes it) on the controller and
writes the key atomically whenever it changes, so the next session's
``LFPlugin`` reads an up-to-date record whether or not this one ended cleanly.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from pytest_modelbench.store import StoreWriteError, atomic_write_text

LASTFAILED_KEY = "cache/lastfailed"


def cache_get(config: pytest.Config, key: str, default: Any) -> Any:
    cache = getattr(config, "cache", None)
    return default if cache is None else cache.get(key, default)


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


class LastFailedRecorder:
    """Controller-side: keeps ``cache/lastfailed`` current after every test report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._lastfailed: dict[str, bool] | None = None

    def _state(self) -> dict[str, bool]:
        if self._lastfailed is None:
            saved = cache_get(self.config, LASTFAILED_KEY, {})
            self._lastfailed = (
                {str(k): bool(v) for k, v in saved.items()} if isinstance(saved, dict) else {}
            )
        return self._lastfailed

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self._state()
        if (report.when == "call" and report.passed) or report.skipped:
            if state.pop(report.nodeid, None) is None:
                return
        elif report.failed:
            if state.get(report.nodeid):
                return
            state[report.nodeid] = True
        else:
            return
        cache_set(self.config, LASTFAILED_KEY, state)
