"""The session's exchange: the one channel through which the workers of an xdist session
coordinate (GPUs given back, servers lent, started for another node, or shared), served by
the controller in every xdist session whose plan serves a model.

Every worker holds one WebSocket to it (``serving/channel.py``), over TLS from a CA made for
the session (``serving/tls.py``): both sides show a certificate of that CA, whose material
reaches the workers over xdist's channel, and the session's bearer token opens the socket.
The first message names the worker; its requests get one reply each, and the exchange pushes
events (``serving/messages.py``) by the rules of its book (``serving/exchange_book.py``: who
keeps, helps, lends, shares and waits, without the transport).

A worker's end is its connection's close by the worker, or its process's end, which xdist
tells the controller (:meth:`Exchange.worker_down`) at once. A connection that drops without
a close (a network blip, a process stalled past the WebSocket's heartbeat, ``HEARTBEAT_S``)
may be made again by the same worker within ``RESUME_S``; what it holds is kept until then,
and every event pushed to it is numbered and kept (the last ``KEPT_EVENTS``), so that those
it did not receive (pushed while it was away, or to a connection that dropped before the
exchange noticed) are replayed, in order, when it greets again; after that, it has ended. A keeper's leases are then released, a
helper's are lost. The controller listens on loopback unless a node is reached over the
network.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import secrets
import threading
import urllib.parse
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_modelbench.secrets import remember
from pytest_modelbench.serving.exchange_book import Events, ExchangeBook
from pytest_modelbench.serving.messages import (
    CLEAN_CLOSE,
    KEPT_EVENTS,
    PATH,
    RESUME_S,
    SCHEMA_VERSION,
    Ack,
    AskWork,
    Hello,
    LeaseReady,
    Message,
    Offer,
    Publish,
    Release,
    SessionGpus,
    ShareServer,
    Unshare,
    WaitGpus,
    WantServers,
    Withdraw,
    decode,
    encode,
)
from pytest_modelbench.serving.tls import SessionTls, session_tls

if TYPE_CHECKING:
    from aiohttp import web

HEARTBEAT_S = 10.0  # a connection silent this long (a vanished node) is closed
CLOSE_S = 2.0  # at the session's end, how long workers get to answer the close, all at once

__all__ = ["PATH", "Exchange", "ExchangeBook", "networked_spec", "reachable_url", "tx_nodes"]


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


async def _close(connection: _Connection) -> None:
    with contextlib.suppress(Exception):
        await connection.socket.close()


@dataclass(eq=False)
class _Connection:
    worker: str
    socket: web.WebSocketResponse
    peer: str  # the worker's address, as the controller sees it
    local: str  # the controller's address the worker called
    sending: asyncio.Lock = field(default_factory=asyncio.Lock)  # events go out in order


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
        self._seq: dict[str, int] = {}  # the last event pushed to each worker
        self._kept: dict[str, deque[tuple[int, Message]]] = {}  # (seq, event), to replay
        self._closing: set[asyncio.Task[None]] = set()  # dropped connections being closed
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
        self._kept.pop(worker, None)

    def _absent_too_long(self, worker: str) -> None:
        self._absent.pop(worker, None)
        self._kept.pop(worker, None)
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
                    await self._greet(connection, ref, message.seen)
                    continue
                if self.connections.get(connection.worker) is not connection:
                    break  # replaced by a newer connection: a late copy here would undo it
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

    async def _greet(self, connection: _Connection, ref: int, seen: int) -> None:
        """``connection`` holds its worker from now on (one it made again in time resumes:
        nothing it held was lost, and the events after the last it received, ``seen``,
        follow in order, before any newer one)."""
        worker = connection.worker
        older = self.connections.get(worker)
        kept = self._kept.setdefault(worker, deque(maxlen=KEPT_EVENTS))
        while kept and kept[0][0] <= seen:  # received: acknowledged
            kept.popleft()
        async with connection.sending:
            self.connections[worker] = connection
            timer = self._absent.pop(worker, None)
            if timer is not None:
                timer.cancel()
            replay = list(kept)
            await connection.socket.send_str(encode(Ack(), ref))
            for seq, event in replay:
                await self._send(connection, event, seq)
        if older is not None:  # one that dropped unnoticed yet: closed aside, never waited for
            closing = asyncio.get_running_loop().create_task(_close(older))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

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
            if connection is None and worker not in self._absent:
                continue  # never connected, or ended
            seq = self._seq[worker] = self._seq.get(worker, 0) + 1
            self._kept.setdefault(worker, deque(maxlen=KEPT_EVENTS)).append((seq, event))
            if connection is None:  # away: replayed when it connects again
                continue
            async with connection.sending:
                await self._send(connection, event, seq)

    @staticmethod
    async def _send(connection: _Connection, event: Message, seq: int) -> None:
        """Send one event; one lost to a connection that dropped is replayed on a resume."""
        if isinstance(event, LeaseReady):
            url = reachable_url(event.url, connection.peer, connection.local)
            event = LeaseReady(event.lease, url)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await connection.socket.send_str(encode(event, seq=seq))

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
