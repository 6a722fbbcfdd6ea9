"""Sharing a running server with the workers of the same session on its node that have no
GPU of their own, through the session's exchange (``serving/exchange.py``).

Every worker's own server is published while it runs (:class:`Published`); a worker that
finds no free GPU shares one of the same launch (:func:`share`), with any number of others.
The owner withdraws it before stopping it and waits until every sharer has let go: the
exchange pushes :class:`~.messages.SharersGone` when the last one does, or its worker ends
(its connection closes). A sharer is told at once (:class:`~.messages.ShareLost`) when the
owner's worker ends, and when its server died or stops without waiting for it (its owner
restarts it at another address, and publishes that one).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from pytest_modelbench.serving.messages import (
    Message,
    Publish,
    SharedWith,
    ShareLost,
    SharersGone,
    ShareServer,
    Unshare,
    Withdraw,
    Withdrawn,
)

if TYPE_CHECKING:
    from pytest_modelbench.serving.channel import ExchangeClient

WAIT_LOOK_S = 1.0  # while waiting for sharers, how often the owner checks its exchange is there

__all__ = ["Published", "Shared", "share"]


class Published:
    """The owner's side: its running server of ``key``, open to the GPU-less workers of the
    session on its node (their requests join its queue)."""

    def __init__(self, client: ExchangeClient, key: str, node: str, url: str) -> None:
        self.client = client
        self.key = key
        self._gone = threading.Event()
        client.listen(self._on_event)
        client.call(Publish(key, node, url))
        self._open = True

    def _on_event(self, event: Message) -> None:
        if isinstance(event, SharersGone) and event.key == self.key:
            self._gone.set()

    def withdraw(self, lost: str | None = None) -> int:
        """No new sharer finds it; how many workers still send to it. ``lost``: why they lose
        it now (they are told, and none is waited for)."""
        if not self._open:
            return 0
        self._open = False
        answer = self.client.call(Withdraw(self.key, lost))
        sharers = answer.sharers if isinstance(answer, Withdrawn) else 0
        if not sharers:
            self._gone.set()
        return sharers

    def close(self, *, lost: str | None = None) -> None:
        """Withdraw it and wait until every worker sending to it has let go (its item ended,
        or its process died); with ``lost`` (it died, or stops at once), they are told why and
        lose it now."""
        if lost is not None:
            self.withdraw(lost)
            return
        self.withdraw()
        while not self._gone.wait(WAIT_LOOK_S):
            if self.client.failure is not None:  # nobody will say any more
                return


class Shared:
    """The sharer's side: another worker's running server, used until :meth:`stop`."""

    def __init__(self, client: ExchangeClient, found: SharedWith) -> None:
        self.client = client
        self.base_url = found.url
        self.worker = found.owner
        self.handle = found.share
        self.lost: str | None = None
        self._stopped = False
        client.listen(self._on_event)

    def _on_event(self, event: Message) -> None:
        if isinstance(event, ShareLost) and event.share == self.handle:
            self.lost = event.note

    def is_alive(self) -> bool:
        return not self._stopped and self.death_report() is None

    def stop(self) -> None:
        """Let go: its owner may stop it (it stays up while other workers send to it)."""
        if not self._stopped:
            self._stopped = True
            self.client.call(Unshare(self.handle))

    def death_report(self) -> str | None:
        if self.lost is not None:
            return f"the server of worker {self.worker}, shared, is gone ({self.lost})"
        if self.client.failure is not None:
            return self.client.failure
        return None


def share(client: ExchangeClient, key: str, node: str) -> Shared | None:
    """A running server of ``key`` that a worker of the session on ``node`` published, shared
    by this worker until it lets go; None when there is none."""
    found = client.call(ShareServer(key, node))
    return Shared(client, found) if isinstance(found, SharedWith) else None
