"""The duration and token memories are rewritten whole: a session writes them at most every
few seconds while items finish, and once more at its end, never once per item."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pytest_modelbench.session import resume
from pytest_modelbench.store.records import PROPERTY_PREFIX


def report(item_id: str, seconds: float) -> Any:
    properties = [(PROPERTY_PREFIX + "item", item_id), (PROPERTY_PREFIX + "duration_s", seconds)]
    return SimpleNamespace(when="call", user_properties=properties)


def test_ten_thousand_items_write_the_memory_a_few_times(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[dict[str, float]] = []
    monkeypatch.setattr(resume, "read_durations", lambda _config: {})
    monkeypatch.setattr(resume, "write_durations", lambda _config, d: written.append(dict(d)))
    now = [0.0]
    plugin = resume.ResumePlugin(SimpleNamespace(stash={}), clock=lambda: now[0])  # type: ignore[arg-type]
    for n in range(10_000):  # one item finishing every millisecond: 10 s in all
        now[0] = n / 1000
        plugin.pytest_runtest_logreport(report(f"item{n}", 1.0 + n))
    assert 1 <= len(written) <= 10_000 / 1000 / resume.FLUSH_S + 1
    assert len(written[0]) == 1  # the first finished item is written at once
    plugin.pytest_sessionfinish()
    assert len(written[-1]) == 10_000 and written[-1]["item9999"] == 10_000.0
    count = len(written)
    plugin.pytest_sessionfinish()  # nothing changed since: nothing written
    assert len(written) == count
