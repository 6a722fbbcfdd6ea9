"""The session's exchange: the one channel through which the workers of an xdist session
coordinate (GPUs given back, servers lent, started for another node, or shared), served by
the controller in every xdist session whose plan serves a model.

Every worker holds one WebSocket to it (``serving/channel.py``), over TLS from a CA made for
the session (``serving/tls.py``): both sides show a certificate of that CA, whose material
reaches the workers over xdist's channel, and the session's bearer token opens the socket.
The first message names the worker; its requests get one reply each, and the exchange pushes
events (``serving/messages.py``):

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

A worker's end is its connection's close by the worker, or its process's end, which xdist
tells the controller (:meth:`Exchange.worker_down`) at once. A connection that drops without
a close (a network blip, a process stalled past the WebSocket's heartbeat, ``HEARTBEAT_S``)
may be made again by the same worker within ``RESUME_S``; what it holds is kept, and events
for it wait, until then; after that, it has ended. A keeper's leases are then released, a
helper's are lost. The controller listens on loopback unless a node is reached over the
network.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import random
import secrets
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_modelbench.secrets import remember
from pytest_modelbench.serving.messages import (
    CLEAN_CLOSE,
    PATH,
    RESUME_S,
    SCHEMA_VERSION,
    Ack,
    AskWork,
    GpusGiven,
    Hello,
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
    decode,
    encode,
)
from pytest_modelbench.serving.tls import SessionTls, session_tls

if TYPE_CHECKING:
    from aiohttp import web

HEARTBEAT_S = 10.0  # a connection silent this long (a vanished node) is closed
CLOSE_S = 2.0  # at the session's end, how long workers get to answer the close, all at once

__all__ = ["PATH", "Exchange", "ExchangeBook", "networked_spec", "reachable_url", "tx_nodes"]

Events = list[tuple[str, Message]]  # (worker, event) to push


def tx_nodes(specs: Sequence[str]) -> tuple[set[str], bool]:
    """The nodes of xdist ``--tx`` specs (one per group: ``4*popen//env:A=1`` is the node
    ``popen//env:A=1``) and whether any is reached over the network (ssh, a socket, or
    ``serving.remote``), so that the exchange must listen beyond loopback."""
    nodes: set[str] = set()
    networked = False
    for spec in specs:
        count, star, rest = str(spec).partition("*")
        group = rest if star and count.isdigit() else str(spec)
        parts = [p for p in group.split("//") if not p.startswith("id=")]
        nodes.add("//".join(parts))
        networked = networked or networked_spec(group)
    return nodes, networked


def networked_spec(spec: str) -> bool:
    """Whether a ``--tx`` spec's workers run on another node (ssh, a socket, or
    ``serving.remote``); ``popen`` workers run on the controller's."""
    return any(
        p.startswith(("ssh=", "socket=", "vagrant_ssh=")) or "serving.remote" in p
        for p in str(spec).split("//")
    )


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
        start or died; a lease released meanwhile ends at once."""
        with self._lock:
            lease = self.leases.get(offer.lease)
            if lease is None:
                return [(helper, LeaseEnded(offer.lease))]
            if offer.note is not None or url is None:
                del self.leases[lease.id]
                return [(lease.keeper, LeaseLost(lease.id, offer.note or "no address"))]
            lease.ready = True
            return [(lease.keeper, LeaseReady(lease.id, url))]

    # -- sharing a running server with the GPU-less workers of its node ------------------------
    def publish(self, owner: str, publish: Publish) -> Events:
        """``owner``'s running server, open to share: the workers waiting on its node look;
        one it published before is gone (its sharers are told)."""
        with self._lock:
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


def reachable_url(url: str, keeper_peer: str, keeper_local: str) -> str:
    """``url`` as the keeper reaches it: a helper on the controller's node called over
    loopback, which the keeper (on another node) reaches at the controller's address it
    called (``keeper_local``)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if not (_loopback(host) and keeper_local and not _loopback(keeper_peer)):
        return url
    shown = f"[{keeper_local}]" if ":" in keeper_local else keeper_local
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{shown}:{parts.port}"))


def _loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def _url(host: str, port: int, tls: bool) -> str:
    """A server's base URL at the address its worker called the exchange from (``tls``: it
    serves TLS from the session's CA)."""
    return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}/v1"


@dataclass(eq=False)
class _Connection:
    worker: str
    socket: web.WebSocketResponse
    peer: str  # the worker's address, as the controller sees it
    local: str  # the controller's address the worker called


class Exchange:
    """The controller's exchange: an ``aiohttp`` WebSocket server in a daemon thread."""

    def __init__(self, host: str | None = "127.0.0.1", nodes: int = 2) -> None:
        """``host`` None listens on every interface (IPv4 and IPv6); ``nodes``: how many the
        session's workers run on (with one, nobody serves another node's item)."""
        self.nodes = nodes
        self.token = secrets.token_hex(16)
        self.server_key = secrets.token_hex(16)  # what helpers' servers require
        remember(self.server_key)
        self.book = ExchangeBook(nodes=nodes)
        self.host = host
        self.port = 0
        self.connections: dict[str, _Connection] = {}
        self._absent: dict[str, asyncio.TimerHandle] = {}  # dropped, may connect again
        self._missed: dict[str, list[Message]] = {}  # events for them meanwhile
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._tls: tuple[SessionTls, SessionTls] | None = None  # (exchange's, workers')

    def start(self) -> None:
        """Make the session's CA and serve; OSError (:class:`TlsUnavailable` among them) when
        it cannot."""
        # lazily: only sessions that may lend servers serve the exchange
        from pytest_modelbench.running.router import start_loop

        self._tls = session_tls()
        self._loop, self._thread = start_loop("modelbench-exchange", self._serve)

    def workerinput(self, spec: str) -> dict[str, Any]:
        """What the workers of ``--tx`` spec ``spec`` need to call it (sent over xdist's
        channel, never written)."""
        import socket

        networked = networked_spec(spec)
        return {
            "host": socket.gethostname() if networked else "127.0.0.1",
            "networked": networked,
            "local": self.host is not None,  # every node is this one: servers stay on loopback
            "port": self.port,
            "nodes": self.nodes,
            "token": self.token,
            "server_key": self.server_key,
            "tls": self._tls[1].fields() if self._tls is not None else None,
        }

    def worker_up(self, worker: str) -> None:
        self._push_soon(self.book.worker_up(worker))

    def worker_down(self, worker: str) -> None:
        """The controller saw ``worker`` exit: it has ended (whether or not its connection
        closed yet), and helpers waiting for it are woken."""
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._down(worker), self._loop)

    async def _down(self, worker: str) -> None:
        self._forget(worker)
        await self._push(self.book.worker_down(worker) + self.book.gone(worker))

    def _forget(self, worker: str) -> None:
        timer = self._absent.pop(worker, None)
        if timer is not None:
            timer.cancel()
        self._missed.pop(worker, None)

    def _absent_too_long(self, worker: str) -> None:
        self._absent.pop(worker, None)
        self._missed.pop(worker, None)
        asyncio.get_running_loop().create_task(self._push(self.book.gone(worker)))

    def _push_soon(self, events: Events) -> None:
        if events and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._push(events), self._loop)

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get(PATH, self._accept)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        assert self._tls is not None
        tls = self._tls[0].server_context()
        if self.host is None:  # every interface, IPv4 and IPv6, on one port
            from pytest_modelbench.serving.process import free_port

            try:
                site = web.TCPSite(runner, None, free_port("0.0.0.0"), ssl_context=tls)
                await site.start()
            except OSError:  # no IPv6 here, or the port was taken meanwhile
                site = web.TCPSite(runner, "0.0.0.0", 0, ssl_context=tls)
                await site.start()
        else:
            site = web.TCPSite(runner, self.host, 0, ssl_context=tls)
            await site.start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def _accept(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import WSMsgType, web

        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given, f"Bearer {self.token}"):
            return web.Response(status=403)
        socket = web.WebSocketResponse(heartbeat=HEARTBEAT_S)
        await socket.prepare(request)
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        connection: _Connection | None = None
        try:
            async for frame in socket:
                if frame.type != WSMsgType.TEXT:
                    continue
                try:
                    ref, message = decode(frame.data)
                except ValueError as exc:
                    await socket.send_str(encode(Ack(error=str(exc)), 0))
                    continue
                if connection is None:
                    if not isinstance(message, Hello):
                        await socket.send_str(encode(Ack(error="hello first"), ref))
                        continue
                    if message.schema_version != SCHEMA_VERSION:
                        refused = (
                            f"worker {message.worker} speaks version {message.schema_version} "
                            f"of the exchange's messages, the controller {SCHEMA_VERSION}: "
                            "install the same pytest-modelbench on every node"
                        )
                        await socket.send_str(encode(Ack(error=refused), ref))
                        break
                    peer = (request.remote or "", str(sockname[0]) if sockname else "")
                    connection = _Connection(message.worker, socket, *peer)
                    await self._greet(connection, ref)
                    continue
                try:
                    reply, events = self._handle(connection, message)
                except Exception as exc:  # a peer's bad request fails that request only
                    reply, events = Ack(error=f"{message.type}: {type(exc).__name__}: {exc}"), []
                await socket.send_str(encode(reply, ref))
                await self._push(events)
        finally:
            if connection is not None:
                await self._ended(connection)
        return socket

    async def _greet(self, connection: _Connection, ref: int) -> None:
        """``connection`` holds its worker from now on (one it made again in time resumes:
        nothing it held was lost, and the events it missed follow)."""
        worker = connection.worker
        older = self.connections.get(worker)
        self.connections[worker] = connection
        timer = self._absent.pop(worker, None)
        if timer is not None:
            timer.cancel()
        await connection.socket.send_str(encode(Ack(), ref))
        if older is not None:  # one that dropped unnoticed yet
            with contextlib.suppress(Exception):
                await older.socket.close()
        await self._push([(worker, event) for event in self._missed.pop(worker, [])])

    async def _ended(self, connection: _Connection) -> None:
        """``connection`` closed: closed by its worker, the worker has ended; dropped, it may
        connect again within ``RESUME_S``; replaced by a newer one, nothing ended."""
        worker = connection.worker
        if self.connections.get(worker) is not connection:
            return
        del self.connections[worker]
        if connection.socket.close_code in CLEAN_CLOSE or self._loop is None:
            await self._push(self.book.gone(worker))
            return
        self._missed.setdefault(worker, [])
        loop = asyncio.get_running_loop()
        self._absent[worker] = loop.call_later(RESUME_S, self._absent_too_long, worker)

    def _handle(self, connection: _Connection, message: Message) -> tuple[Message, Events]:
        book = self.book
        if isinstance(message, WantServers):
            return book.want(message)
        if isinstance(message, Release):
            return Ack(), book.release(message)
        if isinstance(message, AskWork):
            live = message.live
            url = _url(connection.peer, live.port, live.tls) if live is not None else None
            return book.serve(message, url)
        if isinstance(message, Publish):
            return Ack(), book.publish(connection.worker, message)
        if isinstance(message, WaitGpus):
            return Ack(), book.wait_gpus(connection.worker, message)
        if isinstance(message, Withdraw):
            return book.withdraw(connection.worker, message)
        if isinstance(message, ShareServer):
            return book.share(connection.worker, message), []
        if isinstance(message, Unshare):
            return Ack(), book.unshare(message)
        if isinstance(message, SessionGpus):
            return Ack(), book.session_gpus(message)
        if isinstance(message, Offer):
            port = message.port
            url = _url(connection.peer, port, message.tls) if port is not None else None
            return Ack(), book.offer(connection.worker, message, url)
        return Ack(error=f"no request {message.type!r}"), []

    async def _push(self, events: Events) -> None:
        for worker, event in events:
            connection = self.connections.get(worker)
            if connection is None:
                if worker in self._absent:  # told when it connects again
                    self._missed.setdefault(worker, []).append(event)
                continue
            if isinstance(event, LeaseReady):
                url = reachable_url(event.url, connection.peer, connection.local)
                event = LeaseReady(event.lease, url)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await connection.socket.send_str(encode(event))

    def close(self) -> None:
        """Close every worker's connection and stop serving; never raises (the session ends)."""
        # lazily: only sessions that may lend servers serve the exchange
        from pytest_modelbench.running.router import stop_loop

        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None:
            with contextlib.suppress(Exception):  # the loop is stopped whatever happened
                stop_loop(loop, thread, self._shutdown)

    async def _shutdown(self) -> None:
        closing = [
            asyncio.ensure_future(connection.socket.close())
            for connection in list(self.connections.values())
        ]
        if closing:  # a worker that does not answer (stopped, its node gone) is not waited for
            _, late = await asyncio.wait(closing, timeout=CLOSE_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*closing, return_exceptions=True)
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
