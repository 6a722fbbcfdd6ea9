"""The session-end import starts when the item's event loop first waits on its server, not
while it starts up and sends its first requests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from pytest_modelbench.running import prefetch


class Clock:
    """The loop thread's CPU time and the wall clock, a window further at each reading."""

    def __init__(self, busy_windows: int) -> None:
        self.busy = busy_windows  # windows the thread spends on the CPU, then it waits
        self.wall = self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu

    def window(self) -> None:
        self.wall += 0.01
        if self.busy > 0:
            self.busy -= 1
            self.cpu += 0.009
        else:
            self.cpu += 0.001


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Sequence[str], int]]:
    """(modules, windows watched) per prefetch() call."""
    calls: list[tuple[Sequence[str], int]] = []
    windows = [0]
    monkeypatch.setattr(prefetch, "IDLE_WINDOW_S", 0)
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        windows[0] += 1
        clock.window()
        await real_sleep(0)

    clock = Clock(busy_windows=3)
    monkeypatch.setattr(prefetch, "time", clock)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    monkeypatch.setattr(prefetch, "prefetch", lambda modules: calls.append((modules, windows[0])))
    return calls


def test_the_import_starts_after_the_busy_start_up(
    started: list[tuple[Sequence[str], int]],
) -> None:
    asyncio.run(prefetch.prefetch_when_idle(("colorsys",)))
    assert started == [(("colorsys",), 4)]  # three busy windows, then the first idle one


def test_an_item_done_before_its_loop_waits_starts_no_import(
    started: list[tuple[Sequence[str], int]],
) -> None:
    async def item() -> None:
        idle = asyncio.create_task(prefetch.prefetch_when_idle())
        await asyncio.sleep(0)  # one window, still busy
        idle.cancel()

    asyncio.run(item())
    assert started == []
