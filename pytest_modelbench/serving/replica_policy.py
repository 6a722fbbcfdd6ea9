"""A worker's replica policy: which servers help the item it runs, and which items its server
helps once it has nothing left to run.

Everything goes through the session's exchange (``serving/exchange.py``), whose events this
policy receives. While an item runs, GPUs of this node that other workers of the session gave
back (pushed by the exchange) serve the model as replicas when the remaining work pays for
their start (``serving/replicas.py``); servers that idle workers lend, and servers other
nodes start for it, join. At the worker's end its server is lent to a worker still running an
item of the same launch (of this node first), or its GPUs serve an item of another node;
failing that, they are given back.
"""

from __future__ import annotations

import ssl
import threading
import urllib.parse
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_modelbench.names import safe_component
from pytest_modelbench.serving.messages import (
    AskWork,
    GpusGiven,
    LeaseEnded,
    LeaseLost,
    LeaseReady,
    LiveServer,
    Message,
    NoWork,
    Offer,
    Release,
    SessionGpus,
    Wake,
    WantAnswer,
    WantServers,
    Work,
)
from pytest_modelbench.serving.slot import Launch, build_server

if TYPE_CHECKING:
    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.running.urls import UrlSet
    from pytest_modelbench.serving.channel import ExchangeClient
    from pytest_modelbench.serving.gpus import GpuClaimer
    from pytest_modelbench.serving.replicas import Claim, Progress, ReplicaSet, Server
    from pytest_modelbench.serving.slot import ServerSlot

__all__ = ["REMOTE_POLL_S", "RemoteServer", "ReplicaPolicy", "ReplicaWarning"]

REMOTE_POLL_S = 1.0  # a worker serving another node's item checks its server this often
WAKE_LIMIT_S = 30.0  # a helper told to wait asks again at least this often (unwoken)


class ReplicaWarning(UserWarning):
    """A replica of a served model died or did not start (the item goes on without it)."""


class ReplicaPolicy:
    """Replicas, lending and cross-node leases for one worker's :class:`ServerSlot`."""

    def __init__(
        self,
        slot: ServerSlot,
        claimer: GpuClaimer,
        *,
        cache_dir: Path,
        progress: Callable[[], Progress | None] | None = None,
        estimate: Callable[[PlannedItem], float | None] | None = None,
        exchange: ExchangeClient | None = None,
    ) -> None:
        """``progress`` (the running item's id, done and total) with the slot's session: this
        worker may start replicas on GPUs other workers of the session gave back, and lend its
        server; without them it never does. ``estimate``: an item's work in seconds on one
        server (the session's cost plan), so that replicas start alongside the worker's own
        server when the item pays for them. ``exchange``: the session's exchange when it spans
        several nodes: servers of other nodes join this worker's items, and this worker serves
        theirs at its end."""
        self.slot = slot
        self.claimer = claimer
        self.cache_dir = cache_dir
        self.worker = slot.worker
        self.session = slot.session
        self.run_dir = slot.run_dir
        self._progress = progress
        self._estimate = estimate
        self.exchange = exchange
        self.remote_ready: list[Server] = []  # servers other nodes started for this worker
        self.remote_dead: dict[str, str] = {}  # their lease -> why it ended
        self._exchange_reported = False
        self._replicas: ReplicaSet | None = None
        self.served_items: set[str] = set()  # items the slot's current server serves
        self._planned: dict[str, PlannedItem] = {}  # items this worker served
        self._estimates: dict[str, float | None] = {}  # their work, seconds on one server
        self._estimate_lock = threading.Lock()
        self._replica_s: dict[str, float] = {}  # item -> replicas' serving time, past sets
        self._remote_lock = threading.Lock()
        self._remote_closed = False  # replicas stopped: no more wants until the next set
        self.starting: str | None = None  # the item whose server is starting
        self._want_lock = threading.Lock()
        self._pushed = threading.Condition()  # events of the exchange: leases ended, wakes
        self._ended: set[str] = set()  # leases this worker served that their keeper released
        self._woken = False
        self._given: set[str] = set()  # GPUs of this node the session gave back (exchange)
        self._given_lock = threading.Lock()
        if exchange is not None:
            exchange.listen(self._on_event)
            exchange.when_failed(self._exchange_failed)
            claimer.on_give_back = self._gave_back

    # -- while this worker's items run --------------------------------------------------------
    def plan(self, item: PlannedItem) -> None:
        """Note an item this worker serves (its work is estimated when replicas ask)."""
        if self._estimate is not None and self.session is not None:
            self._planned.setdefault(item.item_id, item)

    def share(self, urls: UrlSet) -> None:
        """The URL set the current server's requests go through: replicas join it. Starts
        watching for GPUs the session gave back (once per server)."""
        if self.slot.server is None or self.slot.launch is None:
            return
        if self._replicas is not None:
            if self._replicas.urls is not urls:
                self._replicas.attach(urls)
            return
        self.watch(urls)

    def watch(self, urls: UrlSet | None) -> None:
        """Watch for GPUs the session gave back, for replicas of the current launch. Without
        ``urls``, while this worker's own server starts (:attr:`starting`): its replicas wait
        in a URL set of their own until :meth:`share` hands them the item's."""
        if (
            self.session is None
            or self._progress is None
            or self.claimer.held is None
            or self.claimer.cpu
            or self.exchange is None
        ):
            return  # no session (or exchange) to share GPUs with, or serving on the CPU
        launch = self.slot.launch
        assert launch is not None
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.running.urls import UrlSet
        from pytest_modelbench.serving.replicas import START_GUESS_S, ReplicaSet

        with self._remote_lock:
            self._remote_closed = False
        self._replicas = ReplicaSet(
            model=launch.model_name,
            urls=urls if urls is not None else UrlSet(),
            launch=self._launch_replica,
            claim=self._claim_replica,
            progress=self._served_progress,
            start_s=self.slot.start_s if urls is not None else START_GUESS_S,
            borrow=self._take_remote,
            give_back=self._give_back,
            estimate=self._estimate_of,
            primary_ready=urls is not None,
            want_more=self._want_remote,
        )
        self._replicas.start()

    def primary_started(self) -> None:
        """The worker's own server is up: replicas now pay against its measured start."""
        if self._replicas is not None:
            self._replicas.primary_started(self.slot.start_s)

    def listen(self) -> dict[str, Any]:
        """Where this worker's servers listen: with an exchange, on this node's network with
        the session's key and TLS from its CA, so that it can lend them to another node's
        item at its end (on loopback, in clear, when every node is this one)."""
        if self.exchange is None or self.exchange.failure is not None:
            return {}  # no exchange (or it is off): nothing is lent, the server stays local
        if self.exchange.local:
            return {"host": "127.0.0.1", "api_key": self.exchange.server_key}
        # keyed, and only clients with the session's certificate get past the handshake
        return {"host": "0.0.0.0", "api_key": self.exchange.server_key, "tls": self.exchange.tls}

    @property
    def tls_context(self) -> ssl.SSLContext | None:
        """How this worker reaches the session's servers over https (None without an
        exchange): the session's CA trusted, this worker's certificate shown."""
        return self.exchange.context if self.exchange is not None else None

    @property
    def server_key(self) -> str | None:
        """The key servers of other nodes require (None without an exchange)."""
        return self.exchange.server_key if self.exchange is not None else None

    @property
    def node(self) -> str:
        """This node, as the exchange tells nodes apart (host name and GPU claim directory)."""
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.channel import this_node

        return this_node()

    def _want_remote(self, need: int, lend: bool) -> int:
        """Tell the exchange how many servers of the current launch from other nodes would
        pay, counting those they are starting (0: none), and whether live ones are welcome
        (``lend``: the item has work left); collect the servers other nodes made ready and
        the deaths. Returns how many other nodes are starting one for this worker."""
        client, launch = self.exchange, self.slot.launch
        if client is None or launch is None:
            return 0
        with self._remote_lock:  # never after stop() released everything
            if self._remote_closed:
                return 0
            want = WantServers(self.worker, self.node, launch.key, launch.fields(), need, lend)
            answer = client.call(want)
        if not isinstance(answer, WantAnswer):
            return 0
        with self._given_lock:
            new = set(answer.given) - self._given
            self._given.update(new)
        if new and self._replicas is not None:  # given back before this worker wanted any
            self._replicas.wake()
        return answer.starting

    def _on_event(self, event: Message) -> None:
        """An event the exchange pushed (in its channel's thread)."""
        if isinstance(event, LeaseReady):
            self.remote_ready.append(RemoteServer(event.lease, event.url, self))
        elif isinstance(event, LeaseLost):
            self.remote_dead[event.lease] = event.note
        elif isinstance(event, GpusGiven):
            with self._given_lock:
                self._given.update(event.gpus)
            replicas = self._replicas
            if replicas is not None:
                replicas.wake()
        elif isinstance(event, (LeaseEnded, Wake)):
            with self._pushed:
                if isinstance(event, LeaseEnded):
                    self._ended.add(event.lease)
                else:
                    self._woken = True
                self._pushed.notify_all()

    def _exchange_failed(self) -> None:
        """The exchange is gone (in its channel's thread): a helper waiting for an event
        notices now, not after ``WAKE_LIMIT_S``."""
        with self._pushed:
            self._pushed.notify_all()

    def _take_remote(self) -> Server | None:
        return self.remote_ready.pop(0) if self.remote_ready else None

    def _estimate_of(self, item_id: str | None) -> float | None:
        """The cost plan's work of an item this server serves (None: the one it starts for),
        computed when the replica thread first asks (never before a server start)."""
        key = item_id if item_id is not None else self.starting
        if key is None or self._estimate is None or key not in self._planned:
            return None
        item = self._planned[key]
        with self._estimate_lock:
            if key not in self._estimates:
                try:
                    self._estimates[key] = self._estimate(item)
                except Exception:  # an estimate only helps replicas start early
                    self._estimates[key] = None
            return self._estimates[key]

    def replica_seconds(self, item_id: str) -> float:
        """How long replicas served ``item_id`` (summed over their number): its work on one
        server is its wall time plus this."""
        current = self._replicas.replica_seconds if self._replicas is not None else {}
        return self._replica_s.get(item_id, 0.0) + current.get(item_id, 0.0)

    def _served_progress(self) -> Progress | None:
        """The running item's progress while it is one this server serves (not an API item
        run in between); other workers may lend servers of this model just as long."""
        found = self._progress() if self._progress is not None else None
        serving = found is not None and found[0] in self.served_items
        return found if serving else None

    def _claim_replica(self) -> Claim | None:
        """GPUs of this node the session gave back (the exchange says which) for one more
        server, or None. Their lock notes decide: one that another session claimed since,
        or a replica took, is no longer given (and the exchange is told)."""
        assert self.session is not None and self.slot.launch is not None
        with self._given_lock:
            candidates = set(self._given)
        n = self.slot.launch.gpus
        if len(candidates) < n:
            return None
        # lazily: serving loads only when a worker starts a server (pytest start-up)
        from pytest_modelbench.serving.gpu_claims import session_gpus

        given_back = set(session_gpus(self.session)) & candidates
        found = self.claimer.spare(n, given_back) if len(given_back) >= n else None
        taken = (candidates - given_back) | set(found.gpus if found is not None else ())
        with self._given_lock:
            self._given -= taken
        if taken and self.exchange is not None:
            self.exchange.call(SessionGpus(self.node, tuple(sorted(taken)), free=False))
        return found

    def _give_back(self, claim: Claim) -> None:
        """A replica's GPUs go back to the session, and its exchange says so."""
        assert self.session is not None
        claim.give_back(self.session)  # type: ignore[attr-defined]
        self._gave_back(tuple(claim.gpus))

    def _gave_back(self, gpus: tuple[str, ...]) -> None:
        if self.exchange is not None and gpus:
            self.exchange.call(SessionGpus(self.node, gpus))

    def _launch_replica(
        self, gpus: tuple[str, ...], index: int, launched: Callable[[Server], None]
    ) -> Server:
        spec = self.slot.launch
        assert spec is not None
        name = f"{self.worker}-{safe_component(spec.model_name)}-replica{index}.log"
        server = build_server(spec, gpus, self.run_dir / "servers" / name, self.cache_dir)
        launched(server)
        server.start(spec.timeout_s)
        return server

    def report(self) -> None:
        """Warn (in the calling thread: the running test) what happened to replicas."""
        if self._replicas is not None:
            for note in self._replicas.drain_notes():
                warnings.warn(ReplicaWarning(note), stacklevel=3)
        failure = self.exchange.failure if self.exchange is not None else None
        if failure is not None and not self._exchange_reported:
            self._exchange_reported = True
            warnings.warn(
                ReplicaWarning(
                    f"replicas across nodes are off: {failure}; set MODELBENCH_EXCHANGE_HOST "
                    "(//env: in the --tx spec) to an address of the controller this node reaches"
                ),
                stacklevel=3,
            )

    def stop(self) -> None:
        """Stop the replicas of the current server and let go of other nodes' servers."""
        if self._replicas is not None:
            with self._remote_lock:
                self._remote_closed = True
            self._replicas.stop()  # its thread no longer says "wanted" after this
            self.report()
            for item_id, seconds in self._replicas.replica_seconds.items():
                self._replica_s[item_id] = self._replica_s.get(item_id, 0.0) + seconds
            self._replicas = None
            if self.exchange is not None:  # servers of other nodes: no longer wanted
                with self._remote_lock:  # after any want in flight
                    self.exchange.call(Release(self.worker))
                for server in self.remote_ready:
                    server.stop()
                self.remote_ready.clear()

    # -- at this worker's end -----------------------------------------------------------------
    def help_others(self, stop_server: Callable[[], None]) -> None:
        """Nothing left to run here: lend this worker's server as it is to a worker running an
        item of its launch (of this node or another), or, while an item on
        another node wants servers of a launch that fits this worker's GPUs (and none on this
        node does), serve it on them. ``stop_server`` stops the slot's server (with its
        replicas and sharers)."""
        client, claim = self.exchange, self.claimer.held
        if client is None or claim is None or claim.cpu or not claim.gpus:
            return
        gpus = tuple(claim.gpus)
        while True:
            with self._pushed:
                self._woken = False
            job = client.call(AskWork(self.worker, self.node, len(gpus), self._live()))
            if isinstance(job, NoWork) and job.wait:
                with self._pushed:  # until a want opens or a worker ends (or the exchange left)
                    self._pushed.wait_for(
                        lambda: self._woken or client.failure is not None, WAKE_LIMIT_S
                    )
                continue
            if not isinstance(job, Work):
                return  # nobody will want it, or a keeper of this node does (GPUs go back)
            if job.lent:  # this worker's own server, as it is
                assert self.slot.server is not None
                served = self._hold_lease(client, job.lease, self.slot.server)
                stop_server()
                if not served:
                    return
                continue
            stop_server()  # its own server holds another launch
            if not self._serve_lease(client, job.lease, job.launch, gpus):
                return

    def _live(self) -> LiveServer | None:
        """This worker's own server while it runs (other nodes reach any engine's: vLLM
        serves TLS itself, the others behind their TLS front)."""
        server, launch = self.slot.server, self.slot.launch
        if server is None or launch is None or not server.is_alive():
            return None
        port = urllib.parse.urlsplit(lend_url(server)).port
        if port is None:
            return None
        return LiveServer(launch.key, port, is_https(server), remote=True)

    def _serve_lease(
        self, client: ExchangeClient, lease: str, launch: dict[str, Any], gpus: tuple[str, ...]
    ) -> bool:
        """Start ``launch`` on ``gpus`` for another node's item and serve until released;
        False when it did not start or died (this worker then stops serving others)."""
        name = safe_component(str(launch["model_name"]))
        try:
            server = build_server(
                Launch.of(launch),
                gpus,
                self.run_dir / "servers" / f"{self.worker}-{name}-for-another-node.log",
                self.cache_dir,
                self.listen(),
            )
        except (ValueError, KeyError) as exc:
            client.call(Offer(lease, note=f"{self.worker} on {self.node}: {exc}"))
            return False
        try:
            try:
                server.start(float(launch["timeout_s"]))
            except Exception as exc:
                client.call(Offer(lease, note=f"did not start on {self.node}: {exc}"))
                return False
            port = urllib.parse.urlsplit(lend_url(server)).port  # its TLS front's, if any
            client.call(Offer(lease, port=port, tls=is_https(server)))
            return self._hold_lease(client, lease, server)
        finally:
            server.stop()

    def _hold_lease(self, client: ExchangeClient, lease: str, server: Server) -> bool:
        """Serve until the keeper releases ``lease`` (pushed) or leaves; True then, False
        (reported) when ``server`` died."""
        while True:
            with self._pushed:
                if self._pushed.wait_for(
                    lambda: lease in self._ended or client.failure is not None, REMOTE_POLL_S
                ):
                    self._ended.discard(lease)
                    return True
            if not server.is_alive():
                why = server.death_report() or "its process exited"
                client.call(Offer(lease, note=f"on {self.node}: {why}"))
                return False


def lend_url(server: Server) -> str:
    """Where other nodes reach ``server``: its TLS front's URL for an engine behind one,
    else its own (vLLM serves TLS itself)."""
    return str(getattr(server, "lend_url", None) or server.base_url)


def is_https(server: Server) -> bool:
    """Whether other nodes reach ``server`` over TLS (its lent URL says so)."""
    return lend_url(server).startswith("https://")


class RemoteServer:
    """A server another node started for this worker (``serving/exchange.py``)."""

    def __init__(self, lease: str, base_url: str, policy: ReplicaPolicy) -> None:
        self.lease = lease
        self.base_url = base_url
        self._policy = policy

    def is_alive(self) -> bool:
        exchange = self._policy.exchange
        lost = exchange is not None and exchange.failure is not None  # nobody says any more
        return not lost and self.lease not in self._policy.remote_dead

    def stop(self) -> None:
        if self._policy.exchange is not None:
            self._policy.exchange.call(Release(self.worker, self.lease))

    @property
    def worker(self) -> str:
        return self._policy.worker

    def death_report(self) -> str | None:
        exchange = self._policy.exchange
        if exchange is not None and exchange.failure is not None:
            return exchange.failure
        return self._policy.remote_dead.get(self.lease)
