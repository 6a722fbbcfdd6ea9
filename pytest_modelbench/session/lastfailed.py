"""A crash-proof ``--lf``: pytest's ``cache/lastfailed`` updated as each test finishes.

pytest's own ``LFPlugin`` keeps failures in memory and writes the cache key
only at session end, so a session killed after ten hours forgets which items
failed. :class:`LastFailedRecorder` applies the same rule as ``LFPlugin``
(a failure adds the node id, a pass or skip removes it) on the controller and
writes the key atomically whenever it changes, so the next session's
``LFPlugin`` reads an up-to-date record whether or not this one ended cleanly.
"""

from __future__ import annotations

import pytest

from pytest_modelbench.store.pytest_cache import cache_get, cache_set

LASTFAILED_KEY = "cache/lastfailed"


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
