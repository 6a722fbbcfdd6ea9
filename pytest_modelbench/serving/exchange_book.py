"""The session exchange's rules and state, without the transport (``serving/exchange.py``
carries the messages): :class:`ExchangeBook`, each of whose changes returns the events it
pushes.

The rules, by role (the messages: ``serving/messages.py``):

* the **keeper** (the worker running an item of a served model) says, at every replica step,
  how many servers from other nodes would pay, counting those they are starting for it
  (:class:`~.messages.WantServers`); a server that becomes ready for it is pushed
  (:class:`~.messages.LeaseReady`), and so is one that did not start or was lost
  (:class:`~.messages.LeaseLost`);
* a **helper** (a worker at its end, its GPUs still claimed) asks for work
  (:class:`~.messages.AskWork`): one unit of a want from another node whose launch fits its
  GPUs. While items may still want servers it waits to be woken (:class:`~.messages.Wake`:
  a want opened, a worker ended), and gives its GPUs back at once when a keeper of its own
  node wants servers. It starts the launch on its own GPUs, listening on its node's network,
  requiring the session's server key and serving TLS from the session's CA, and offers it
  (:class:`~.messages.Offer`); the exchange records the URL with the address the helper
  called from, as the keeper reaches it (a helper on the controller's node calls over
  loopback: the keeper gets the controller's address it called), and serves until the
  keeper releases it (:class:`~.messages.LeaseEnded`);
* a helper whose own server already holds a running item's launch **lends** it as it is
  (to a keeper of its own node first, whatever the engine; to one of another node, a vLLM
  server);
* GPUs a worker gives back to the session (:class:`~.messages.SessionGpus`) are pushed to
  the keepers of its node (:class:`~.messages.GpusGiven`), which start replicas on them;
* a worker without a GPU **shares** a running server of its node
  (:class:`~.messages.ShareServer`, ``serving/sharing.py``), whose owner withdraws it and
  is told when the last sharer let go (:class:`~.messages.SharersGone`); while it finds
  none and workers of the session hold the node's GPUs it **waits**
  (:class:`~.messages.WaitGpus`), woken when GPUs of its node are given back
  (:class:`~.messages.GpusGiven`), a server of its node is published or a worker ends
  (:class:`~.messages.Wake`).
"""

from __future__ import annotations

import random
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from pytest_modelbench.serving.messages import (
    AskWork,
    GpusGiven,
    LeaseEnded,
    LeaseLost,
    LeaseReady,
    Message,
    NoWork,
    Offer,
    Publish,
    Release,
    SessionGpus,
    SharedWith,
    ShareLost,
    SharersGone,
    ShareServer,
    Unshare,
    WaitGpus,
    Wake,
    WantAnswer,
    WantServers,
    Withdraw,
    Withdrawn,
    Work,
)

__all__ = ["Events", "ExchangeBook"]

Events = list[tuple[str, Message]]  # (worker, event) to push


@dataclass
class _Want:
    keeper: str
    node: str
    key: str
    launch: dict[str, Any]
    open: int
    lend: bool = False  # its item has work left: a live server of ``key`` always helps


@dataclass
class _Lease:
    id: str
    keeper: str
    key: str
    helper: str
    node: str
    ready: bool = False
    url: str | None = None  # where it serves, once offered


@dataclass
class _Served:
    """An owner's running server, open to the GPU-less workers of its node."""

    owner: str
    key: str
    node: str
    url: str
    sharers: dict[str, str] = field(default_factory=dict)  # share -> the worker sharing it
    withdrawn: bool = False


@dataclass
class ExchangeBook:
    """The exchange's state and rules, without the transport: each change returns the
    events it pushes, as (worker, event)."""

    wants: dict[str, _Want] = field(default_factory=dict)  # keeper -> its want
    leases: dict[str, _Lease] = field(default_factory=dict)  # starting or serving
    workers: set[str] = field(default_factory=set)  # every worker the controller set up
    down: set[str] = field(default_factory=set)  # those that exited
    helpers: set[str] = field(default_factory=set)  # those at their end, asking for work
    waiting: set[str] = field(default_factory=set)  # helpers told to wait, not yet woken
    given: dict[str, set[str]] = field(default_factory=dict)  # node -> GPUs given back there
    nodes: int = 2  # the session's nodes: with one, helpers never wait for work
    served: dict[str, _Served] = field(default_factory=dict)  # owner -> its shared server
    gpu_waiters: dict[str, str] = field(default_factory=dict)  # GPU-less worker -> its node
    rng: random.Random = field(default_factory=random.Random, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def worker_up(self, worker: str) -> Events:
        with self._lock:
            self.workers.add(worker)
            self.down.discard(worker)  # xdist restarted it
            self.helpers.discard(worker)
            return []

    def worker_down(self, worker: str) -> Events:
        with self._lock:
            self.down.add(worker)
            return self._wake() + self._wake_gpu_waiters()

    def want(self, want: WantServers) -> tuple[WantAnswer, Events]:
        """The keeper's step: returns how many leases are starting for it (units already
        taken are not offered again)."""
        with self._lock:
            events: Events = []
            starting = 0
            for lease in list(self.leases.values()):
                if lease.keeper != want.keeper:
                    continue
                if lease.key != want.key:  # the keeper switched model: older leases are done
                    events += self._end(lease)
                elif not lease.ready:
                    starting += 1
            gpus = want.launch.get("gpus", 1)
            if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
                raise ValueError(f"want: the launch's gpus is not a count ({gpus!r:.50})")
            open_ = max(0, want.need - starting)
            old = self.wants.get(want.keeper)
            new = _Want(want.keeper, want.node, want.key, dict(want.launch), open_, want.lend)
            self.wants[want.keeper] = new
            if old is None or (old.key, old.open, old.lend) != (new.key, new.open, new.lend):
                events += self._wake()
            return WantAnswer(starting, tuple(sorted(self.given.get(want.node, ())))), events

    def session_gpus(self, note: SessionGpus) -> Events:
        """GPUs of a node given back to the session (its keepers are told at once), or
        taken."""
        with self._lock:
            given = self.given.setdefault(note.node, set())
            if not note.free:
                given.difference_update(note.gpus)
                return []
            given.update(note.gpus)
            keepers = {w.keeper for w in self.wants.values() if w.node == note.node}
            keepers.update(w for w, node in self.gpu_waiters.items() if node == note.node)
            return [(keeper, GpusGiven(tuple(note.gpus))) for keeper in sorted(keepers)]

    def wait_gpus(self, worker: str, wait: WaitGpus) -> Events:
        """``worker`` (without a GPU) waits on its node, or stopped waiting. Helpers waiting
        for work are woken: one of its node gives its GPUs back instead."""
        with self._lock:
            if not wait.waiting:
                self.gpu_waiters.pop(worker, None)
                return []
            self.gpu_waiters[worker] = wait.node
            return self._wake()

    def _wake_gpu_waiters(self, node: str | None = None) -> Events:
        return [
            (worker, Wake())
            for worker, on in sorted(self.gpu_waiters.items())
            if node is None or on == node
        ]

    def release(self, release: Release) -> Events:
        """The keeper lets one lease (or, with None, every lease and its want) go."""
        with self._lock:
            events: Events = []
            if release.lease is None and self.wants.pop(release.keeper, None) is not None:
                events += self._wake()
            for lease in list(self.leases.values()):
                if lease.keeper == release.keeper and release.lease in (None, lease.id):
                    events += self._end(lease)
            return events

    def serve(self, ask: AskWork, live_url: str | None = None) -> tuple[Work | NoWork, Events]:
        """A helper asks for work: a :class:`Work`; ``local`` when a keeper of its own node
        wants servers or a worker of its node waits for GPUs (it gives its GPUs back there
        instead); ``wait`` while items may still
        want some (a keeper runs, or a worker that is neither down nor helping). ``live_url``:
        where its live server (``ask.live``) serves, lent as it is to a keeper of another
        node that runs that launch."""
        with self._lock:
            self.helpers.add(ask.helper)
            self.waiting.discard(ask.helper)
            if ask.live is not None and live_url is not None:
                live = ask.live
                takers = [w for w in self.wants.values() if w.lend and w.key == live.key]
                here = [w for w in takers if w.node == ask.node]  # this node's first
                takers = here or [w for w in takers if live.remote and w.node != ask.node]
                if takers:
                    want = self.rng.choice(takers)
                    lease = _Lease(
                        secrets.token_hex(8), want.keeper, want.key, ask.helper, ask.node
                    )
                    lease.ready = True
                    self.leases[lease.id] = lease
                    ready = LeaseReady(lease.id, live_url)
                    return Work(lease.id, want.key, dict(want.launch), lent=True), [
                        (want.keeper, ready)
                    ]
            if ask.node in self.gpu_waiters.values():  # a worker of its node needs its GPUs
                return NoWork(local=True), []
            wanted = [w for w in self.wants.values() if w.open > 0]
            local = [w for w in wanted if w.node == ask.node]
            if local:  # this helper's GPUs go back there: one unit fewer to find
                local[0].open -= 1
                return NoWork(local=True), []
            fits = [w for w in wanted if w.launch.get("gpus", 1) == ask.gpus]
            if not fits:
                if self.nodes < 2:  # nobody else will want this helper's GPUs
                    return NoWork(), []
                running = self.workers - self.down - self.helpers
                if self.wants or running:
                    self.waiting.add(ask.helper)
                    return NoWork(wait=True), []
                return NoWork(), []
            want = max(fits, key=lambda w: w.open)
            want.open -= 1
            lease = _Lease(secrets.token_hex(8), want.keeper, want.key, ask.helper, ask.node)
            self.leases[lease.id] = lease
            return Work(lease.id, want.key, dict(want.launch)), []

    def offer(self, helper: str, offer: Offer, url: str | None) -> Events:
        """The helper's server for the lease serves at ``url``, or (``offer.note``) did not
        start or died; a lease released meanwhile ends at once. A repeat (sent again after a
        dropped connection) changes nothing."""
        with self._lock:
            lease = self.leases.get(offer.lease)
            if lease is None:  # released meanwhile, or lost by this offer's first sending
                return [] if offer.note is not None else [(helper, LeaseEnded(offer.lease))]
            if offer.note is not None or url is None:
                del self.leases[lease.id]
                return [(lease.keeper, LeaseLost(lease.id, offer.note or "no address"))]
            if lease.ready:  # a repeat, perhaps from another address: one server per lease
                return []
            lease.ready, lease.url = True, url
            return [(lease.keeper, LeaseReady(lease.id, url))]

    # -- sharing a running server with the GPU-less workers of its node ------------------------
    def publish(self, owner: str, publish: Publish) -> Events:
        """``owner``'s running server, open to share: the workers waiting on its node look;
        one it published before is gone (its sharers are told); a repeat changes nothing."""
        with self._lock:
            old = self.served.get(owner)
            same = (publish.key, publish.node, publish.url, False)
            if old is not None and (old.key, old.node, old.url, old.withdrawn) == same:
                return []
            events = self._lose(owner, "its worker published another server in its place")
            self.served[owner] = _Served(owner, publish.key, publish.node, publish.url)
            return events + self._wake_gpu_waiters(publish.node)

    def withdraw(self, owner: str, withdraw: Withdraw) -> tuple[Withdrawn, Events]:
        """Nobody new shares ``owner``'s server; how many still send to it. With
        ``withdraw.lost`` its sharers lose it now (told why), and none is waited for."""
        with self._lock:
            served = self.served.get(owner)
            if served is None or served.key != withdraw.key:
                return Withdrawn(0), []
            if withdraw.lost is not None:
                return Withdrawn(0), self._lose(owner, withdraw.lost)
            served.withdrawn = True
            if not served.sharers:
                del self.served[owner]
            return Withdrawn(len(served.sharers)), []

    def _lose(self, owner: str, note: str) -> Events:
        served = self.served.pop(owner, None)
        if served is None:
            return []
        return [(w, ShareLost(h, note)) for h, w in served.sharers.items()]

    def share(self, sharer: str, share: ShareServer) -> SharedWith | NoWork:
        """A running server of the launch on the sharer's node (the one fewest share), or
        none."""
        with self._lock:
            found = [
                s
                for s in self.served.values()
                if s.key == share.key and s.node == share.node and not s.withdrawn
            ]
            found = [s for s in found if s.owner != sharer]
            if not found:
                return NoWork()
            served = min(found, key=lambda s: (len(s.sharers), s.owner))
            handle = secrets.token_hex(8)
            served.sharers[handle] = sharer
            return SharedWith(handle, served.url, served.owner)

    def unshare(self, unshare: Unshare) -> Events:
        with self._lock:
            for served in list(self.served.values()):
                if served.sharers.pop(unshare.share, None) is not None:
                    return self._let_go(served)
            return []

    def _let_go(self, served: _Served) -> Events:
        if served.withdrawn and not served.sharers:
            del self.served[served.owner]
            return [(served.owner, SharersGone(served.key))]
        return []

    def gone(self, worker: str) -> Events:
        """``worker``'s connection closed: as a keeper its leases are released, as a helper
        the servers it served are lost, as an owner its sharers lose its server, as a sharer
        it lets go."""
        with self._lock:
            events: Events = []
            for served in list(self.served.values()):
                if served.owner == worker:
                    events += self._lose(worker, f"its worker {worker} ended")
                    continue
                for handle in [h for h, w in served.sharers.items() if w == worker]:
                    del served.sharers[handle]
                events += self._let_go(served)
            self.helpers.discard(worker)
            self.waiting.discard(worker)
            self.gpu_waiters.pop(worker, None)
            events += self._wake_gpu_waiters()  # its GPUs are free, or its server gone
            if self.wants.pop(worker, None) is not None:
                events += self._wake()
            for lease in list(self.leases.values()):
                if lease.keeper == worker:
                    events += self._end(lease)
                elif lease.helper == worker:
                    del self.leases[lease.id]
                    note = f"the worker serving it ({worker} on {lease.node}) disconnected"
                    events.append((lease.keeper, LeaseLost(lease.id, note)))
            return events

    def _end(self, lease: _Lease) -> Events:
        del self.leases[lease.id]
        return [(lease.helper, LeaseEnded(lease.id))]

    def _wake(self) -> Events:
        woken, self.waiting = self.waiting, set()
        return [(helper, Wake()) for helper in sorted(woken)]
