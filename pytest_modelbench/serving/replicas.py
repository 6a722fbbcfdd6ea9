"""Replicas: more servers for the model a worker serves, on GPUs its session gave back.

Items are the unit of parallelism, so near the end of a session the workers that have nothing
left to start exit while one large item may still have most of its work ahead, and their GPUs
idle. A worker running an item of a model it serves is told (by the session's exchange) of
GPUs of this node that other workers of the same pytest session claimed and gave back, and
starts a replica of its server on them when the
remaining work pays for the start (:func:`replicas_that_pay`). A replica joins the item's
:class:`~pytest_modelbench.running.urls.UrlSet`: requests spread over every server at once,
and the built-in suites raise their concurrency to ``max_concurrent`` per server.

A worker with nothing left to run whose server already holds that model lends it instead of
stopping it (``serving/replica_policy.py``): it joins at once, with no start to pay for.

The worker stays the only journal writer. A replica that dies costs only its requests in
flight (the endpoint pool retries them on the other servers) and is reported; its GPUs are
released. Replicas stop with the worker's server: on a model switch, at the end of the
session, on Ctrl-C (and by their watchdog if the worker is killed).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_modelbench.running.urls import UrlSet

POLL_S = 1.0  # how often a worker measures its item's rate (GPUs given back wake it at once)
START_GUESS_S = 60.0  # a server start, until this worker has timed its own
RATE_WINDOW_S = 20.0  # the item's recent rate is measured over this long ...
MIN_RATE_SPAN_S = 1.0  # ... and over at least this long before anything is decided
MIN_SERVE_FRACTION = 0.5  # a replica must serve at least this share of its own start time
MAX_REPLICAS = 256  # servers one item asks for at most


class Server(Protocol):
    """What a replica needs of a server (``serving.vllm.VllmServer`` is one)."""

    @property
    def base_url(self) -> str: ...

    def is_alive(self) -> bool: ...

    def stop(self) -> None: ...

    def death_report(self) -> str | None: ...


class Claim(Protocol):
    gpus: tuple[str, ...]

    def release(self) -> None: ...


class Cancelled(Exception):
    """The replica set stopped while this replica was being launched."""


Progress = tuple[str, int, int]  # the running item's (id, done, total)


def replicas_that_pay(
    *,
    remaining: int,
    rate_per_server: float,
    serving: int,
    starting: int,
    start_s: float,
    free: int,
    min_serve_fraction: float = MIN_SERVE_FRACTION,
) -> int:
    """How many replicas to start now, on at most ``free`` GPU groups.

    ``remaining`` examples at ``rate_per_server`` examples/s per server is the work left, in
    server-seconds. The ``serving`` servers work on while new ones start (``start_s``); the
    ``starting`` ones and the new ones join after about ``start_s``. The j-th new replica then
    serves about (work left at that moment) / (every server) seconds, and is started only when
    that is at least ``min_serve_fraction`` of its start time: a start that would serve for
    less than that is not worth the GPU.
    """
    if remaining <= 0 or rate_per_server <= 0 or start_s < 0 or free <= 0:
        return 0
    work_after_start = remaining / rate_per_server - serving * start_s
    if work_after_start <= 0:
        return 0
    floor_s = max(min_serve_fraction * start_s, 1e-9)
    most = int(work_after_start / floor_s) - serving - starting
    return max(0, min(free, most))


class RateMeter:
    """Examples per second over a sliding window of (time, done) samples."""

    def __init__(self, window_s: float = RATE_WINDOW_S, min_span_s: float = MIN_RATE_SPAN_S):
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> None:
        if self._samples and done < self._samples[-1][1]:  # another item started
            self._samples.clear()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        """None until the samples span ``min_span_s`` and something finished in them."""
        if len(self._samples) < 2:
            return None
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        if t1 - t0 < self.min_span_s or d1 <= d0:
            return None
        return (d1 - d0) / (t1 - t0)

    def reset(self) -> None:
        self._samples.clear()


class _Lent:
    """The claim of a borrowed server: its GPUs stay with the worker that lent it."""

    gpus: tuple[str, ...] = ()

    def release(self) -> None:
        pass


@dataclass(eq=False)
class _Replica:
    claim: Claim
    index: int
    server: Server | None = None  # set once launched (it may still be starting)
    ready: bool = False
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def where(self) -> str:
        if isinstance(self.claim, _Lent):
            return "the replica lent by another worker"
        return f"the replica on GPU {','.join(self.claim.gpus)}"


class ReplicaSet:
    """The replicas of one worker's server for one model; a daemon thread grows and reaps them.

    ``launch(gpus, index)`` builds a server on ``gpus``, calls ``on_launched(server)`` as soon
    as its process exists (so :meth:`stop` can kill a start in progress) and returns once it
    serves; ``claim()`` locks free GPUs of the session for one server, or None;
    ``progress()`` is the running item's ``(done, total)``, None between items;
    ``borrow()`` a live server of the same model that another worker lends, or None.

    ``want_more(n, lend)`` says that ``n`` servers from other nodes would pay, counting those
    they are starting already (every step, 0 included), and whether live ones are welcome
    (the item has work left); it returns how many other nodes are starting one for it
    (``serving/exchange.py``). Their servers arrive through ``borrow()``.
    :attr:`replica_seconds` is each item's serving time on replicas (counted every step), so
    that the item's work on one server is its wall time plus that.

    ``estimate(item_id)`` is an item's work in seconds on one server, from the session's cost
    plan (None when unknown; ``item_id`` None: the item the worker's own server is starting
    for). It decides while no rate is measured yet:
    while the worker's own server starts (``primary_ready=False`` until
    :meth:`primary_started`), replicas start alongside it, so that a large item is spread
    from its first request instead of after one start and a measurement.
    """

    def __init__(
        self,
        *,
        model: str,
        urls: UrlSet,
        launch: Callable[[tuple[str, ...], int, Callable[[Server], None]], Server],
        claim: Callable[[], Claim | None],
        progress: Callable[[], Progress | None],
        start_s: float,
        borrow: Callable[[], Server | None] = lambda: None,
        give_back: Callable[[Claim], None] = lambda claim: claim.release(),
        estimate: Callable[[str | None], float | None] = lambda _item: None,
        primary_ready: bool = True,
        want_more: Callable[[int, bool], int] = lambda _n, _lend: 0,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self._estimate = estimate
        self._primary_ready = primary_ready
        self._want_more = want_more
        self._remote_need = 0  # servers from other nodes that would pay (starting ones too)
        self._remote_lend = False  # live servers of other nodes are welcome (work is left)
        self._remote_starting = 0  # servers other nodes are starting for this one
        self._borrow = borrow
        self._give_back = give_back
        self.urls = urls
        self._launch = launch
        self._claim = claim
        self._progress = progress
        self.start_s = start_s
        self.poll_s = poll_s
        self._clock = clock
        self._meter = RateMeter()
        self._item: str | None = None  # the item the rate was measured on
        self._lock = threading.Lock()
        self._replicas: list[_Replica] = []
        self._notes: list[str] = []
        self._failed = False  # a replica failed to start: no more starts for this server
        self._serving_seen = 1
        self._stop = threading.Event()
        self._woken = threading.Event()  # look now (GPUs were given back), not after poll_s
        self._thread: threading.Thread | None = None
        self.started = 0  # replicas that served
        self.replica_seconds: dict[str, float] = {}  # item -> replicas' serving time on it
        self._sampled: float | None = None  # when replica time was last counted
        self._launches = 0  # replicas this set started (numbers their logs)

    # -- life ------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"modelbench-replicas-{self.model}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop looking, stop every replica (starting ones too, all at once) and give their
        GPUs back; a replica still being launched gives its GPUs back when its launch ends."""
        self._stop.set()
        self._woken.set()
        with self._lock:
            replicas, self._replicas = self._replicas, []
        stoppers = [threading.Thread(target=self._retire, args=(r,), daemon=True) for r in replicas]
        for thread in stoppers:
            thread.start()
        for thread in stoppers:
            thread.join(timeout=60)
        for replica in replicas:
            if replica.thread is not None and replica.thread is not threading.current_thread():
                replica.thread.join(timeout=30)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def primary_started(self, start_s: float) -> None:
        """The worker's own server serves now; it took ``start_s`` to start."""
        self.start_s = start_s
        self._primary_ready = True
        self._meter.reset()

    def attach(self, urls: UrlSet) -> None:
        """Serve a new URL set (the primary restarted on another port): replicas move to it."""
        with self._lock:
            old, self.urls = self.urls, urls
            for replica in self._replicas:
                if replica.ready and replica.server is not None:
                    old.remove(replica.server.base_url)
                    urls.add(replica.server.base_url, replica=True)

    # -- what the worker reads ---------------------------------------------------------------
    @property
    def serving(self) -> int:
        """Servers answering this model's requests: the worker's own and ready replicas."""
        with self._lock:
            return 1 + sum(r.ready for r in self._replicas)

    def drain_notes(self) -> list[str]:
        """What happened to replicas since the last call (deaths, failed starts)."""
        with self._lock:
            notes, self._notes = self._notes, []
        return notes

    # -- the thread ----------------------------------------------------------------------------
    def wake(self) -> None:
        """Look now: the session gave GPUs back (its exchange said so)."""
        self._woken.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._woken.wait(self.poll_s)
            self._woken.clear()
            if self._stop.is_set():
                return
            try:
                self._reap()
                self.step()
            except Exception as exc:  # replicas only help; never kill the worker
                self._note(f"{self.model}: replicas stopped after an unexpected error: {exc!r}")
                return

    def step(self) -> int:
        """One look: adopt lent servers, start the replicas that pay; returns how many
        replicas were launched here."""
        self._remote_need, self._remote_lend = 0, False
        try:
            return self._step()
        finally:
            self._remote_starting = self._want_more(self._remote_need, self._remote_lend)

    def _step(self) -> int:
        progress = self._progress()
        if not self._primary_ready:  # the worker's own server is starting (for this item)
            self._meter.reset()
            work_s = self._estimate(progress[0] if progress is not None else None)
            if work_s is None:
                return 0
            self._remote_lend = True
            self._adopt()
            return self._grow(work_s, serving=self.serving - 1)
        if progress is None:  # between items
            self._meter.reset()
            self._sampled = None
            return 0
        item, done, total = progress
        if item != self._item:  # another item: its own rate
            self._item = item
            self._meter.reset()
            self._sampled = None
        self._count_replica_seconds(item)
        if done < total:
            self._remote_lend = True
            self._adopt()
        if self._failed:
            return 0
        serving = self.serving
        if serving != self._serving_seen:  # the rate was measured with fewer servers
            self._serving_seen = serving
            self._meter.reset()
        self._meter.add(self._clock(), done)
        rate = self._meter.rate()
        if rate is not None:
            return self._grow((total - done) / (rate / serving), serving=serving)
        work_s = self._estimate(item)  # not measured yet: the plan's estimate of what is left
        if work_s is None or total <= 0:
            return 0
        return self._grow(work_s * (total - done) / total, serving=serving)

    def _count_replica_seconds(self, item: str) -> None:
        """Add the replicas' serving time since the last look to ``item``'s."""
        now = self._clock()
        if self._sampled is not None:
            extra = (self.serving - 1) * (now - self._sampled)
            self.replica_seconds[item] = self.replica_seconds.get(item, 0.0) + extra
        self._sampled = now

    def _grow(self, work_s: float, *, serving: int) -> int:
        """Start the replicas that pay for ``work_s`` seconds of work on one server left, with
        ``serving`` servers answering (0 while the worker's own server starts)."""
        if self._failed:
            return 0
        with self._lock:
            starting = sum(not r.ready for r in self._replicas)
        if not self._primary_ready:
            starting += 1  # the worker's own server joins when the starts do
        wanted = replicas_that_pay(
            remaining=math.ceil(work_s * 1000),
            rate_per_server=1000.0,
            serving=serving,
            starting=starting + self._remote_starting,
            start_s=self.start_s,
            free=MAX_REPLICAS,
        )
        launched = 0
        while launched < wanted and not self._stop.is_set() and not self._failed:
            claim = self._claim()
            if claim is None or not self._begin(claim):
                break
            launched += 1
        if not self._stop.is_set() and not self._failed:
            # from other nodes: what this node cannot give, and what they are starting already
            self._remote_need = wanted - launched + self._remote_starting
        return launched

    def _adopt(self) -> None:
        """Every server other workers lend: they serve already, so they always pay."""
        while not self._stop.is_set():
            server = self._borrow()
            if server is None:
                return
            with self._lock:
                stopped = self._stop.is_set()
                if not stopped:
                    self._replicas.append(_Replica(_Lent(), index=0, server=server, ready=True))
                    self.urls.add(server.base_url, replica=True)
                    self.started += 1
            if stopped:
                server.stop()
                return

    def _begin(self, claim: Claim) -> bool:
        """Launch a replica on ``claim`` in its own thread; False (claim given back) once
        stopped."""
        with self._lock:
            if self._stop.is_set():
                stopped = True
            else:
                stopped = False
                self._launches += 1
                replica = _Replica(claim, index=self._launches)
                self._replicas.append(replica)
        if stopped:
            self._give_back(claim)
            return False
        replica.thread = threading.Thread(
            target=self._start_one,
            args=(replica,),
            name=f"modelbench-replica-{self.model}-{replica.index}",
            daemon=True,
        )
        replica.thread.start()
        return True

    def _start_one(self, replica: _Replica) -> None:
        """The replica's launch thread; it owns the claim until the replica is ready."""

        def launched(server: Server) -> None:
            replica.server = server
            if self._stop.is_set():
                raise Cancelled

        gpus = ",".join(replica.claim.gpus)
        try:
            server = self._launch(replica.claim.gpus, replica.index, launched)
        except Exception as exc:  # a failed replica start never fails the item
            if not self._stop.is_set() and not isinstance(exc, Cancelled):
                self._failed = True
                self._note(f"{self.model}: a replica on GPU {gpus} did not start: {exc}")
            with self._lock:
                if replica in self._replicas:
                    self._replicas.remove(replica)
            self._shut(replica)
            return
        replica.server = server
        with self._lock:
            stopped = self._stop.is_set() or replica not in self._replicas
            if not stopped:
                self.urls.add(server.base_url, replica=True)
                replica.ready = True
                self.started += 1
        if stopped:
            self._shut(replica)

    def _reap(self) -> None:
        with self._lock:
            dead = [r for r in self._replicas if r.ready and r.server and not r.server.is_alive()]
            for replica in dead:
                self._replicas.remove(replica)
        for replica in dead:
            assert replica.server is not None
            why = replica.server.death_report() or "its process exited"
            self._retire(replica)
            self._note(
                f"{self.model}: {replica.where} died ({why}); its requests in flight were "
                "retried on the other servers"
            )

    def _retire(self, replica: _Replica) -> None:
        """A replica leaves: out of the URL set, its server stopped; its GPUs are given back
        here when it was ready, else by its launch thread when the launch ends."""
        server = replica.server
        if replica.ready and server is not None:
            self.urls.remove(server.base_url)
            self._shut(replica)
        elif server is not None:
            cancel = getattr(server, "cancel", None)
            with contextlib.suppress(Exception):
                (cancel or server.stop)()

    def _shut(self, replica: _Replica) -> None:
        """Stop the server (if any) and give the GPUs back, even when stopping fails."""
        try:
            if replica.server is not None:
                replica.server.stop()
        finally:
            if not isinstance(replica.claim, _Lent):
                self._give_back(replica.claim)

    def _note(self, message: str) -> None:
        with self._lock:
            self._notes.append(message)


def item_progress(sink: Any) -> Callable[[], Progress | None]:
    """``progress()`` for :class:`ReplicaSet` from a worker's progress sink: the running
    item's (id, done, total), None when nothing runs (or the sink keeps no counters)."""
    snapshot = getattr(sink, "snapshot", None)

    def progress() -> Progress | None:
        if snapshot is None:
            return None
        running = [s for s in snapshot() if not s.finished]
        if not running:
            return None
        return running[-1].item_id, running[-1].done, running[-1].total

    return progress
