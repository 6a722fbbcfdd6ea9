"""Replicas across nodes: the session's exchange, served by the xdist controller.

Node-local replicas (``replicas.py``, ``handover.py``) use the GPUs and servers of the
keeper's own node. With several ``--tx`` groups (nodes) the controller also runs this
exchange, and a worker with nothing left to run on one node can serve the model of an item
still running on another:

* the **keeper** (the worker running an item of a served model) says, at every replica step,
  how many servers from other nodes would pay, counting those they are starting for it
  (``want``); the answer carries the servers that became ready for it, and those that died;
* a **helper** (a worker at its end, its GPUs still claimed) asks for work (``serve``): one
  unit of a want from another node whose launch fits its GPUs. It asks again every second
  while a keeper runs or a worker that may become one has not ended (the controller tells
  the exchange which workers it set up and which went down), and gives its GPUs back at once
  when a keeper of its own node wants servers. It starts the launch on its own GPUs,
  listening on its node's network, requiring the session's server key and serving TLS from
  the session's CA, and offers it (``offer``); the exchange records the URL (``https``) with
  the address the helper called from. The
  helper then reports every second (``lease``) until the keeper releases it;
* a helper whose own server already holds a running item's launch **lends** it as it is (no
  start): in a session with an exchange, workers' servers listen on their node's network,
  require the session's server key and serve TLS from the start;
* the keeper adopts the server like a lent one and **releases** it when its model is done.

A keeper that stops calling for ``SILENT_S`` is taken as gone: its leases are released. A
helper that stops calling for as long is taken as dead, and so is its server (a start may
take its launch's timeout first). The controller listens on loopback unless a node is
reached over the network, and always over TLS from a CA made for the session
(``serving/tls.py``): both sides show a certificate of that CA, whose material reaches the
workers over xdist's channel, and every call's bearer token travels encrypted. The servers
that workers reach across nodes require the same certificates (``replica_policy.listen``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import random
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_modelbench.running import blocking
from pytest_modelbench.secrets import remember
from pytest_modelbench.serving.tls import SessionTls, session_tls

SILENT_S = 30.0  # a party that has not called for this long is gone
DEFAULT_START_S = 900.0  # a helper's start that says no timeout may take this long
FAILURES = 3  # calls in a row that fail before a worker stops calling
CALL_TIMEOUT_S = 5.0
WORKERINPUT_KEY = "modelbench_exchange"
HOST_ENV = "MODELBENCH_EXCHANGE_HOST"  # how a node reaches the controller, when ssh cannot say

__all__ = [
    "WORKERINPUT_KEY",
    "Exchange",
    "ExchangeBook",
    "ExchangeClient",
    "Job",
    "client_from",
    "tx_nodes",
]


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


def client_from(
    workerinput: Mapping[str, Any] | None, environ: Mapping[str, str]
) -> ExchangeClient | None:
    """A worker's client for the exchange its controller runs, or None. The controller's
    address: ``$MODELBENCH_EXCHANGE_HOST``; on a node reached over the network, where its
    ssh session came from (``$SSH_CONNECTION``), else the controller's host name; on the
    controller's own node, loopback (a ``popen`` worker inherits the user's own ssh login)."""
    given = (workerinput or {}).get(WORKERINPUT_KEY)
    if not isinstance(given, Mapping):
        return None
    remember(str(given["server_key"]))  # redacted wherever a server echoes it
    host = environ.get(HOST_ENV, "")
    if not host and given.get("networked"):
        ssh = environ.get("SSH_CONNECTION", "").split()
        host = ssh[0] if ssh else str(given.get("host") or "")
    tls = given.get("tls")
    return ExchangeClient(
        host or "127.0.0.1",
        int(given["port"]),
        str(given["token"]),
        str(given["server_key"]),
        local=bool(given.get("local")),
        tls=SessionTls.of(tls) if isinstance(tls, Mapping) else None,
    )


@dataclass
class _Want:
    keeper: str
    node: str
    key: str
    launch: dict[str, Any]
    open: int
    seen: float
    lend: bool = False  # its item has work left: a live server of ``key`` always helps


@dataclass
class _Lease:
    id: str
    keeper: str
    key: str
    helper: str
    node: str
    state: str = "starting"  # starting | ready | taken | released | dead
    url: str | None = None
    note: str | None = None
    helper_seen: float = 0.0
    start_s: float = 0.0  # a start may take this long without a report (its timeout)


@dataclass(frozen=True)
class Job:
    """A unit of work a helper took: start ``launch`` for lease ``id`` (``lent``: its live
    server already serves it)."""

    id: str
    key: str
    launch: dict[str, Any]
    lent: bool = False


@dataclass
class ExchangeBook:
    """The exchange's state and rules, without the transport (``now`` is given)."""

    silent_s: float = SILENT_S
    wants: dict[str, _Want] = field(default_factory=dict)  # keeper -> its want
    leases: dict[str, _Lease] = field(default_factory=dict)
    workers: set[str] = field(default_factory=set)  # every worker the controller set up
    down: set[str] = field(default_factory=set)  # those that exited
    helpers: set[str] = field(default_factory=set)  # those at their end, asking for work
    rng: random.Random = field(default_factory=random.Random, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def worker_up(self, worker: str) -> None:
        with self._lock:
            self.workers.add(worker)
            self.down.discard(worker)  # xdist restarted it
            self.helpers.discard(worker)

    def worker_down(self, worker: str) -> None:
        with self._lock:
            self.down.add(worker)

    def want(
        self,
        keeper: str,
        node: str,
        key: str,
        launch: dict[str, Any],
        need: int,
        now: float,
        lend: bool = False,
    ) -> dict[str, Any]:
        """The keeper's call: ``need`` servers of ``key`` from other nodes would pay now,
        counting those they are starting for it (``lend``: live ones are welcome). Returns
        the leases starting for it, those ready (now taken by it) and those that died since."""
        with self._lock:
            self._expire(now)
            starting = 0
            ready: list[dict[str, str]] = []
            dead: list[dict[str, str]] = []
            for lease in list(self.leases.values()):
                if lease.keeper != keeper:
                    continue
                if lease.key != key:  # the keeper switched model: older leases are done
                    lease.state = "released"
                elif lease.state == "starting":
                    starting += 1
                elif lease.state == "ready":
                    lease.state = "taken"
                    ready.append({"id": lease.id, "url": lease.url or ""})
                elif lease.state == "dead" and lease.note is not None:
                    dead.append({"id": lease.id, "note": lease.note})
                    lease.note = None  # told once
            open_ = max(0, need - starting)  # units already taken are not offered again
            self.wants[keeper] = _Want(keeper, node, key, launch, open_, now, lend)
            self._forget(now)
            return {"starting": starting, "ready": ready, "dead": dead}

    def release(self, keeper: str, lease_id: str | None) -> None:
        """The keeper lets one lease (or, with None, every lease and its want) go."""
        with self._lock:
            if lease_id is None:
                self.wants.pop(keeper, None)
            for lease in self.leases.values():
                mine = lease.keeper == keeper and lease_id in (None, lease.id)
                if mine and lease.state != "dead":
                    lease.state = "released"

    def serve(
        self,
        helper: str,
        node: str,
        gpus: int,
        now: float,
        live: tuple[str, str] | None = None,
    ) -> Job | str | None:
        """A helper on ``node`` with ``gpus`` GPUs asks for work: a :class:`Job`; ``"local"``
        when a keeper of its own node wants servers (it gives its GPUs back there instead);
        ``"wait"`` while items may still want some (a keeper runs, or a worker that is
        neither down nor helping); None when none will. ``live``: the (key, URL) of its
        server, lent as it is to a keeper of another node that runs that launch."""
        with self._lock:
            self._expire(now)
            self.helpers.add(helper)
            if live is not None:
                key, url = live
                takers = [w for w in self.wants.values() if w.lend and w.key == key]
                takers = [w for w in takers if w.node != node]  # this node's: handover.py
                if takers:
                    want = self.rng.choice(takers)
                    lease = _Lease(secrets.token_hex(8), want.keeper, key, helper, node)
                    lease.state, lease.url, lease.helper_seen = "ready", url, now
                    self.leases[lease.id] = lease
                    return Job(lease.id, key, dict(want.launch), lent=True)
            wanted = [w for w in self.wants.values() if w.open > 0]
            local = [w for w in wanted if w.node == node]
            if local:  # this helper's GPUs go back there: one unit fewer to find
                local[0].open -= 1
                return "local"
            fits = [w for w in wanted if int(w.launch.get("gpus", 1)) == gpus]
            if not fits:
                running = self.workers - self.down - self.helpers
                return "wait" if self.wants or running else None
            want = max(fits, key=lambda w: w.open)
            want.open -= 1
            lease = _Lease(
                secrets.token_hex(8),
                want.keeper,
                want.key,
                helper,
                node,
                helper_seen=now,
                start_s=float(want.launch.get("timeout_s", DEFAULT_START_S)),
            )
            self.leases[lease.id] = lease
            return Job(lease.id, want.key, dict(want.launch))

    def offer(self, lease_id: str, url: str | None, note: str | None, now: float) -> None:
        """The helper's server for ``lease_id`` serves at ``url``, or (``note``) did not start
        or died."""
        with self._lock:
            lease = self.leases.get(lease_id)
            if lease is None:
                return
            lease.helper_seen = now
            if note is not None:
                lease.state, lease.note = "dead", note
            elif lease.state == "starting":
                lease.state, lease.url = "ready", url

    def lease(self, lease_id: str, now: float) -> bool:
        """The helper's report: True while it should keep serving."""
        with self._lock:
            self._expire(now)
            lease = self.leases.get(lease_id)
            if lease is None:
                return False
            lease.helper_seen = now
            return lease.state in ("starting", "ready", "taken")

    def _expire(self, now: float) -> None:
        """Keepers silent for ``silent_s`` are gone (their leases released); helpers silent
        that long are dead."""
        for keeper in [k for k, w in self.wants.items() if now - w.seen > self.silent_s]:
            del self.wants[keeper]
            for lease in self.leases.values():
                if lease.keeper == keeper and lease.state != "dead":
                    lease.state = "released"
        for lease in self.leases.values():
            limit = self.silent_s + (lease.start_s if lease.state == "starting" else 0.0)
            if lease.state in ("starting", "ready", "taken") and now - lease.helper_seen > limit:
                lease.state = "dead"
                lease.note = f"the worker serving it ({lease.helper} on {lease.node}) went silent"

    def _forget(self, now: float) -> None:
        for lease_id in [
            i
            for i, lease in self.leases.items()
            if lease.state == "released" or (lease.state == "dead" and lease.note is None)
        ]:
            if now - self.leases[lease_id].helper_seen > self.silent_s:
                del self.leases[lease_id]


class Exchange:
    """The controller's exchange: an ``aiohttp`` server in a daemon thread."""

    def __init__(
        self, host: str | None = "127.0.0.1", clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``host`` None listens on every interface (IPv4 and IPv6)."""
        self.token = secrets.token_hex(16)
        self.server_key = secrets.token_hex(16)  # what helpers' servers require
        remember(self.server_key)
        self.book = ExchangeBook()
        self.host = host
        self.port = 0
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._tls: tuple[SessionTls, SessionTls] | None = None  # (exchange's, workers')

    def start(self) -> None:
        """Make the session's CA and serve; OSError (:class:`TlsUnavailable` among them) when
        it cannot."""
        # lazily: only multi-node sessions serve the exchange
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
            "token": self.token,
            "server_key": self.server_key,
            "tls": self._tls[1].fields() if self._tls is not None else None,
        }

    async def _serve(self) -> None:
        from aiohttp import web

        server = web.Server(self._handle, access_log=None)
        runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
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

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        given = request.headers.get("Authorization", "")
        if request.method != "POST" or not hmac.compare_digest(given, f"Bearer {self.token}"):
            return web.Response(status=403)
        try:
            body = await request.json()
            answer = self._call(request.path.strip("/"), body, request.remote or "")
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(answer)

    def _call(self, name: str, body: dict[str, Any], remote: str) -> Any:
        now, book = self._clock(), self.book
        if name == "want":
            return book.want(
                str(body["keeper"]),
                str(body["node"]),
                str(body["key"]),
                dict(body["launch"]),
                int(body["need"]),
                now,
                lend=bool(body.get("lend")),
            )
        if name == "release":
            book.release(str(body["keeper"]), body.get("id"))
            return {}
        if name == "serve":
            live = body.get("live")  # [key, port, tls] of the helper's running server
            job = book.serve(
                str(body["helper"]),
                str(body["node"]),
                int(body["gpus"]),
                now,
                live=(str(live[0]), _url(remote, int(live[1]), bool(live[2]))) if live else None,
            )
            if isinstance(job, Job):
                return {"id": job.id, "key": job.key, "launch": job.launch, "lent": job.lent}
            return {"local": job == "local", "wait": job == "wait"}
        if name == "offer":
            port = body.get("port")
            url = _url(remote, int(port), bool(body.get("tls"))) if port is not None else None
            book.offer(str(body["id"]), url, body.get("note"), now)
            return {}
        if name == "lease":
            return {"serve": book.lease(str(body["id"]), now)}
        raise KeyError(f"no call {name!r}")

    def close(self) -> None:
        # lazily: only multi-node sessions serve the exchange
        from pytest_modelbench.running.router import stop_loop

        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None and thread is not None:
            stop_loop(loop, thread, self._shutdown)

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def _url(host: str, port: int, tls: bool) -> str:
    """A server's base URL at the address its worker called the exchange from (``tls``: it
    serves TLS from the session's CA)."""
    return f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}/v1"


class ExchangeClient:
    """A worker's calls to the exchange; a call that fails returns None (replicas only help).
    After ``FAILURES`` in a row every later one does too, without calling: the failure is kept
    in :attr:`failure` for the worker to report (an exchange that cannot be reached would
    otherwise cost a timeout per step)."""

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        server_key: str,
        *,
        local: bool = False,
        tls: SessionTls | None = None,
    ) -> None:
        """``local``: every node of the session is this one (servers stay on loopback).
        ``tls``: the workers' material from the session's CA (calls go over https)."""
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"
        self.tls = tls
        self._token = token
        self.server_key = server_key
        self.local = local
        self.failure: str | None = None
        self._failures = 0
        self.context = None  # calls, and servers of other nodes
        try:  # a full or read-only temp dir turns replicas across nodes off, never the items
            self.context = tls.client_context() if tls is not None else None
        except OSError as exc:  # ssl.SSLError is one
            self.failure = f"the session's TLS material could not be loaded ({exc})"

    def call(self, name: str, **body: Any) -> dict[str, Any] | None:
        if self.failure is not None:  # unreachable once: replicas across nodes are off
            return None
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"}
        try:  # direct, even when the user has HTTP(S)_PROXY set
            reply = blocking.request(
                f"{self.url}/{name}",
                method="POST",
                headers=headers,
                data=json.dumps(body).encode(),
                timeout_s=CALL_TIMEOUT_S,
                context=self.context,
            )
            if reply.status >= 400:
                raise OSError(f"HTTP Error {reply.status}: {reply.reason}")
            answer = json.loads(reply.body)
        except (OSError, ValueError) as exc:
            self._failures += 1
            if self._failures >= FAILURES:
                self.failure = f"the session's exchange at {self.url} did not answer ({exc})"
            return None
        self._failures = 0
        return answer if isinstance(answer, dict) else None

    def __repr__(self) -> str:
        return f"ExchangeClient({self.url})"
