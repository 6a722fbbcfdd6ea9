"""The server's batch width: a FIFO counting gate whose uncontended path never awaits.

``asyncio.Semaphore`` creates a coroutine (and scans its waiters) on every
acquire; at thousands of requests per second that is a visible share of the
simulator's own overhead, which load tests must keep small.
"""

from __future__ import annotations

import asyncio
from collections import deque


class SlotGate:
    """``size`` slots; ``try_take()`` or ``await take()`` one, ``give()`` it back.

    Waiters are served first in, first out: a freed slot is handed straight to
    the oldest waiter, and ``try_take`` refuses while anyone is waiting.
    """

    __slots__ = ("_free", "_waiters", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests queued for a slot (cancelled ones may linger until skipped)."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    def try_take(self) -> bool:
        """Take a slot now if one is free and nobody is queued."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait in line for a slot."""
        if self.try_take():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # granted just before the cancel: pass the slot on
            raise

    def give(self) -> None:
        """Return a slot: to the oldest live waiter, else to the pool."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
