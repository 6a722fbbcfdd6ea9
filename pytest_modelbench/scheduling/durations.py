"""The duration memory: every item's last evaluation time, kept in the pytest cache.

The scheduler orders and places items by it; the controller updates it as
items finish (``session/resume.py``), atomically, so a killed session keeps
what it learned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest

from pytest_modelbench.store.pytest_cache import cache_get, cache_set

DURATIONS_KEY = "modelbench/durations"


def read_durations(config: pytest.Config) -> dict[str, float]:
    """Remembered item durations; anything missing or malformed is ignored."""
    raw = cache_get(config, DURATIONS_KEY, None)
    if not isinstance(raw, dict):
        return {}
    durations: dict[str, float] = {}
    for key, value in raw.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(key, str) and number and math.isfinite(value) and value >= 0:
            durations[key] = float(value)
    return durations


def write_durations(config: pytest.Config, durations: Mapping[str, float]) -> None:
    """Remember ``durations`` (all of them: the cache key is replaced whole)."""
    cache_set(config, DURATIONS_KEY, dict(durations))
