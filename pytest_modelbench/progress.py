"""Progress reporting from an evaluation loop (examples done/total, errors)."""

from __future__ import annotations

import time
from typing import Protocol


class ProgressSink(Protocol):
    """Receives one call per finished example."""

    def start(self, item_id: str, total: int, done: int) -> None: ...

    def advance(self, *, error: bool = False) -> None: ...

    def finish(self) -> None: ...


class NullProgress:
    """Discards progress (quiet runs, tests)."""

    def start(self, item_id: str, total: int, done: int) -> None:
        pass

    def advance(self, *, error: bool = False) -> None:
        pass

    def finish(self) -> None:
        pass


class CountingProgress:
    """Counts examples and computes rate/ETA; a reporter reads it periodically."""

    def __init__(self) -> None:
        self.item_id = ""
        self.total = 0
        self.done = 0
        self.errors = 0
        self.started = time.monotonic()
        self._done_at_start = 0

    def start(self, item_id: str, total: int, done: int) -> None:
        self.item_id, self.total, self.done, self.errors = item_id, total, done, 0
        self._done_at_start = done
        self.started = time.monotonic()

    def advance(self, *, error: bool = False) -> None:
        self.done += 1
        self.errors += int(error)

    def finish(self) -> None:
        pass

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return (self.done - self._done_at_start) / elapsed if elapsed > 0 else 0.0

    def eta_s(self) -> float | None:
        rate = self.rate()
        return (self.total - self.done) / rate if rate > 0 else None
