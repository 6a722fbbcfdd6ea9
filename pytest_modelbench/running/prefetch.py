"""Import what session end will need while an item waits on its server.

Writing ``results.parquet`` at session end imports pyarrow (about 0.35 s), after the last
request, where the user waits for it. An item that sends requests spends most of its time
waiting on the server, so the import is started then, in a background thread: by session end
it is done. The import holds the GIL for most of its time, so whatever the item's event loop
does beside it waits: it starts when the loop first waits on its server
(:func:`prefetch_when_idle`), once the item's start-up (client, pre-flight) and its first
requests are done, not before them. Items read from the store never start it (their reports
may need no pyarrow).
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence

__all__ = ["SESSION_END_MODULES", "prefetch", "prefetch_when_idle"]

SESSION_END_MODULES = ("pyarrow", "pyarrow.json", "pyarrow.parquet")
IDLE_WINDOW_S = 0.01  # how long the loop is watched at a time (the watch's cost: one timer)
IDLE_SHARE = 0.25  # a loop thread on the CPU less than this share of a window waits on I/O
_started: set[str] = set()
_lock = threading.Lock()


def _load(modules: Sequence[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # missing or broken: session end says so itself
            continue


def prefetch(modules: Sequence[str] = SESSION_END_MODULES) -> None:
    """Import ``modules`` in a daemon thread, once per process; never raises."""
    with _lock:
        todo = [m for m in modules if m not in _started]
        _started.update(todo)
    if todo:
        threading.Thread(
            target=_load, args=(todo,), name="modelbench-prefetch", daemon=True
        ).start()


async def prefetch_when_idle(modules: Sequence[str] = SESSION_END_MODULES) -> None:
    """Call :func:`prefetch` once the running event loop waits on its server: its thread spent
    under :data:`IDLE_SHARE` of an :data:`IDLE_WINDOW_S` window on the CPU. Run as a task
    beside an item's requests (cancel it when they are done)."""
    # lazily: asyncio's import stays off the threads that only call prefetch()
    import asyncio

    cpu, wall = time.thread_time(), time.perf_counter()
    while True:
        await asyncio.sleep(IDLE_WINDOW_S)
        cpu_now, wall_now = time.thread_time(), time.perf_counter()
        if cpu_now - cpu < IDLE_SHARE * (wall_now - wall):
            prefetch(modules)
            return
        cpu, wall = cpu_now, wall_now
