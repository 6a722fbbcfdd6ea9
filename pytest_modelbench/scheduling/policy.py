"""Model-affinity scheduling policy: which item each worker runs next (pure; no xdist objects).

Every model switch on a worker is a server restart, so a worker stays on the model it serves
and takes that model's most expensive pending item (longest processing time first). A worker
whose model has no pending work serves a model nobody serves yet, else joins the model with
the most remaining work per serving worker -- but only when that finishes the work sooner
despite the server start. At the end, queued-but-unstarted items move from a busy worker to an
idle one when that pays off, counting the switch cost.

An xdist worker starts an item only while it holds the next one too (or after shutdown), so
each worker is kept ``MIN_PENDING`` items deep: decisions are made as late as xdist allows.
Cheap items are sent in small batches (``batch_s`` of queued work) to save round trips.

Times are seconds on the caller's clock (``now``); costs are estimated seconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MIN_PENDING = 2  # the item being run and the next one (xdist's worker loop needs both)


@dataclass(frozen=True)
class Job:
    """The unit of scheduling: the collection indices of one benchmark item (or one plain test)."""

    indices: tuple[int, ...]
    model: str | None  # None: needs no server (plain tests, items already finished)
    cost: float  # estimated seconds on one worker


@dataclass(frozen=True)
class Send:
    worker: Hashable
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Steal:
    """Ask ``victim`` to give back these unstarted indices; they go to ``thief``."""

    victim: Hashable
    indices: tuple[int, ...]
    thief: Hashable


@dataclass(frozen=True)
class Shutdown:
    """Nothing more for this worker: it runs what it holds and exits."""

    worker: Hashable


Action = Send | Steal | Shutdown


@dataclass(frozen=True)
class PolicySettings:
    start_cost: float = 60.0  # seconds to start a model's server (what a model switch costs)
    start_costs: Mapping[str, float] = field(default_factory=dict)  # per model, overrides
    join_margin: float = 1.0  # joining must gain this many server starts beyond its own
    batch_s: float = 1.0  # queue cheap items until this much unstarted work is queued
    max_batch: int = 64  # indices per send at most

    def switch_cost(self, model: str | None) -> float:
        if model is None:
            return 0.0
        return self.start_costs.get(model, self.start_cost)


class _Pool:
    """Pending jobs of one model, cheapest first (the most expensive is popped from the end)."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: list[tuple[float, int, Job]] = []
        self.total = 0.0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, job: Job) -> None:
        # ties go to the earlier collection index (popped first)
        bisect.insort(self.entries, (job.cost, -job.indices[0], job), key=lambda e: e[:2])
        self.total += job.cost

    def top(self) -> Job | None:
        return self.entries[-1][2] if self.entries else None

    def pop(self) -> Job:
        return self.take(0)

    def peek(self, rank: int) -> Job | None:
        """The job ranked ``rank`` by cost (0: the most expensive), or None past the end."""
        return self.entries[-1 - rank][2] if rank < len(self.entries) else None

    def take(self, rank: int) -> Job:
        """Remove the job ranked ``rank`` (clamped to the cheapest)."""
        job = self.entries.pop(-1 - min(rank, len(self.entries) - 1))[2]
        self.total = self.total - job.cost if self.entries else 0.0
        return job

    def cheapest(self) -> float:
        return self.entries[0][0]


class _Queued:
    __slots__ = ("job", "remaining", "setup")

    def __init__(self, job: Job, setup: float) -> None:
        self.job = job
        self.remaining = list(job.indices)
        self.setup = setup  # server start paid before this job (0 when no switch)

    @property
    def cost(self) -> float:
        return self.job.cost + self.setup


class _Worker:
    __slots__ = ("key", "model", "no_steal", "node", "queue", "shut", "started_at", "waiting")

    def __init__(self, key: Hashable, now: float, node: Hashable = None) -> None:
        self.key = key
        self.node = node  # workers on one node share it (replicas stay on their node)
        self.model: str | None = None  # whose server it holds once its queue has run
        self.queue: list[_Queued] = []
        self.started_at = now  # when the head of the queue started (estimate)
        self.shut = False
        self.waiting = False  # a steal on its behalf is in flight
        self.no_steal = False  # a steal from it just failed; retry after its next completion

    @property
    def pending(self) -> int:
        return sum(len(q.remaining) for q in self.queue)

    def free_at(self, now: float) -> float:
        """Estimated time this worker finishes everything it holds."""
        if not self.queue:
            return now
        t = max(now, self.started_at + self.queue[0].cost)
        for queued in self.queue[1:]:
            t += queued.cost
        return t


class AffinityPolicy:
    """Decides sends, steals and shutdowns; the caller reports completions and steal answers."""

    def __init__(self, settings: PolicySettings | None = None) -> None:
        self.settings = settings or PolicySettings()
        self._pools: dict[str | None, _Pool] = {}
        self._workers: dict[Hashable, _Worker] = {}
        self._steals: dict[Hashable, Hashable | None] = {}  # victim -> thief (None: thief gone)

    # -- state the caller reports ------------------------------------------------------------
    def add_worker(self, worker: Hashable, now: float = 0.0, node: Hashable = None) -> None:
        """``node``: what the worker's node is known by (its ``--tx`` group); first jobs go
        to the node with the fewest busy workers, so that the idle GPUs of every node can
        serve replicas of the items running there."""
        self._workers[worker] = _Worker(worker, now, node)

    def add_jobs(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            if job.indices:
                self._pools.setdefault(job.model, _Pool()).add(job)

    def mark_shutdown(self, worker: Hashable) -> None:
        """The worker was told to shut down by someone else (e.g. ``-x``): send it nothing more."""
        if worker in self._workers:
            self._workers[worker].shut = True

    def complete(self, worker: Hashable, index: int, now: float) -> None:
        state = self._workers.get(worker)
        if state is None:
            return
        state.no_steal = False
        for position, queued in enumerate(state.queue):
            if index in queued.remaining:
                queued.remaining.remove(index)
                if not queued.remaining:
                    del state.queue[position]
                    if position == 0:
                        state.started_at = now
                return

    def remove_worker(self, worker: Hashable) -> int | None:
        """Forget a worker; its unfinished jobs go back to the pools. Returns the index it ran."""
        state = self._workers.pop(worker, None)
        if state is None:
            return None
        crashed: int | None = None
        for position, queued in enumerate(state.queue):
            remaining = queued.remaining
            if position == 0 and remaining:
                crashed, remaining = remaining[0], remaining[1:]
            if remaining:
                self.add_jobs([Job(tuple(remaining), queued.job.model, queued.job.cost)])
        thief = self._steals.pop(worker, None)
        if thief is not None and thief in self._workers:
            self._workers[thief].waiting = False
        for victim, waiting_thief in self._steals.items():
            if waiting_thief == worker:
                self._steals[victim] = None
        return crashed

    def drain_if_unrunnable(self) -> list[int]:
        """When no worker can take work any more (every one gone or told to shut down), empty
        the pools and return their indices: nobody will run them."""
        if any(not state.shut for state in self._workers.values()):
            return []
        indices = sorted(
            i for pool in self._pools.values() for *_, job in pool.entries for i in job.indices
        )
        self._pools.clear()
        return indices

    def stolen(self, victim: Hashable, indices: Sequence[int], now: float) -> list[Action]:
        """The victim answered a steal (``indices`` empty when it had started some of them)."""
        thief_key = self._steals.pop(victim, None)
        thief = self._workers.get(thief_key) if thief_key is not None else None
        returned = set(indices)
        jobs: list[Job] = []
        state = self._workers.get(victim)
        if state is not None:
            if not returned:
                state.no_steal = True
            kept = []
            for queued in state.queue:
                give = [i for i in queued.remaining if i in returned]
                if give:
                    jobs.append(Job(tuple(give), queued.job.model, queued.job.cost))
                    queued.remaining = [i for i in queued.remaining if i not in returned]
                if queued.remaining:
                    kept.append(queued)
            state.queue = kept
        actions: list[Action] = []
        if thief is not None:
            thief.waiting = False
            if jobs and not thief.shut:
                sent: list[int] = []
                for job in sorted(jobs, key=lambda j: -j.cost):
                    sent.extend(self._assign(thief, job, now))
                actions.append(Send(thief.key, tuple(sent)))
                jobs = []
        self.add_jobs(jobs)
        return actions + self.step(now)

    # -- queries -------------------------------------------------------------------------------
    def pending_indices(self, worker: Hashable) -> list[int]:
        return [i for queued in self._workers[worker].queue for i in queued.remaining]

    @property
    def workers(self) -> list[Hashable]:
        return list(self._workers)

    def model_of(self, worker: Hashable) -> str | None:
        return self._workers[worker].model

    @property
    def unassigned(self) -> int:
        return sum(len(pool) for pool in self._pools.values())

    @property
    def has_pending(self) -> bool:
        return self.unassigned > 0 or any(state.queue for state in self._workers.values())

    @property
    def finished(self) -> bool:
        """No job left to hand out and no worker holding enough to be still running by itself."""
        return (
            self.unassigned == 0
            and not self._steals
            and all(state.pending < MIN_PENDING for state in self._workers.values())
        )

    # -- decisions -----------------------------------------------------------------------------
    def step(self, now: float) -> list[Action]:
        """Feed every worker that is short of work (fewer than ``MIN_PENDING`` indices).

        Workers holding nothing get their first job before anyone gets a next one; next jobs
        go to the worker that will start it soonest, as list scheduling would.
        """
        actions: list[Action] = []
        while True:
            starved = [
                w
                for w in self._workers.values()
                if not w.shut and not w.waiting and w.pending < MIN_PENDING
            ]
            if not starved:
                return actions
            empty = [w for w in starved if not w.queue]
            state = (
                self._least_busy_node(empty)
                if empty
                else min(starved, key=lambda w: w.free_at(now))
            )
            actions.append(self._decide(state, now))

    def _least_busy_node(self, empty: list[_Worker]) -> _Worker:
        """The first empty worker on the node with the fewest workers holding work."""
        if len({w.node for w in empty}) < 2:
            return empty[0]
        busy: dict[Hashable, int] = {}
        for worker in self._workers.values():
            if worker.queue:
                busy[worker.node] = busy.get(worker.node, 0) + 1
        return min(empty, key=lambda w: busy.get(w.node, 0))

    def _decide(self, state: _Worker, now: float) -> Action:
        free = state.free_at(now)
        # a worker without a server picks a model before filling in with plain tests
        job = self._pick_compatible(state, free, now) if state.model is not None else None
        if job is None:
            model = self._choose_model(state, free, now)
            if model is not None:
                start = free + self.settings.switch_cost(model)
                job = self._pools[model].take(self._rank(state, model, start, now))
        plain = self._pools.get(None)
        if job is None and plain is not None and len(plain):
            job = plain.pop()
        if job is not None:
            first = self._assign(state, job, now)
            return Send(state.key, tuple(first + self._fill(state, now)))
        steal = self._plan_steal(state, free, now)
        if steal is not None:
            return steal
        state.shut = True
        return Shutdown(state.key)

    def _rank(self, state: _Worker, model: str, start: float, now: float) -> int:
        """How many other workers on ``model`` start their next job before ``start``.

        In longest-first list scheduling those take the largest jobs; this worker, which
        must choose now (one job ahead), takes the one after them.
        """
        return sum(
            1
            for other in self._workers.values()
            if other is not state
            and not other.shut
            and other.model == model
            and other.free_at(now) < start
        )

    def _pick_compatible(self, state: _Worker, free: float, now: float) -> Job | None:
        """The most expensive job this worker runs without a switch (its model's or a plain one)."""
        model = state.model
        own = self._pools.get(model) if model is not None else None
        own_job: Job | None = None
        rank = 0
        if model is not None and own is not None and len(own):
            rank = self._rank(state, model, free, now) if state.queue else 0
            own_job = own.peek(rank)
        plain = self._pools.get(None)
        plain_job = plain.top() if plain is not None else None
        if (
            own is not None
            and own_job is not None
            and (plain_job is None or own_job.cost >= plain_job.cost)
        ):
            return own.take(rank)
        if plain is not None and plain_job is not None:
            return plain.pop()
        return None

    def _fill(self, state: _Worker, now: float) -> list[int]:
        """Batch cheap compatible jobs: queue more while little unstarted work is queued."""
        sent: list[int] = []
        while True:
            job = self._peek_compatible(state)
            if job is None:
                return sent
            unstarted = sum(q.cost for q in state.queue[1:])
            if (
                unstarted + job.cost > self.settings.batch_s
                or len(sent) + len(job.indices) > self.settings.max_batch
            ):
                return sent
            pool = self._pools[job.model]
            sent.extend(self._assign(state, pool.pop(), now))

    def _peek_compatible(self, state: _Worker) -> Job | None:
        best: Job | None = None
        for model in (state.model, None) if state.model is not None else (None,):
            pool = self._pools.get(model)
            top = pool.top() if pool is not None else None
            if top is not None and (best is None or top.cost > best.cost):
                best = top
        return best

    def _assign(self, state: _Worker, job: Job, now: float) -> list[int]:
        setup = 0.0
        if job.model is not None and job.model != state.model:
            setup = self.settings.switch_cost(job.model)
            state.model = job.model
        if not state.queue:
            state.started_at = now
        state.queue.append(_Queued(job, setup))
        return list(job.indices)

    def _choose_model(self, state: _Worker, free: float, now: float) -> str | None:
        """A model nobody serves (most work first), else the best model to join, if joining pays.

        Joining model m (k servers finishing together at about T = (sum of their free times
        + remaining work) / k) pays when this worker, after its server start, can finish at
        least the cheapest pending item of m before T, by a margin of ``join_margin`` starts.
        """
        servers: dict[str, list[float]] = {}
        for other in self._workers.values():
            if other is not state and not other.shut and other.model is not None:
                servers.setdefault(other.model, []).append(other.free_at(now))
        best: str | None = None
        best_key: tuple[int, float] | None = None
        for model, pool in self._pools.items():
            if model is None or not len(pool):
                continue
            free_times = servers.get(model)
            if not free_times:
                key = (1, pool.total)
            else:
                finish = (sum(free_times) + pool.total) / len(free_times)
                start = free + (1 + self.settings.join_margin) * self.settings.switch_cost(model)
                if start + pool.cheapest() >= finish:
                    continue
                key = (0, finish)
            if best_key is None or key > best_key:
                best, best_key = model, key
        return best

    def _plan_steal(self, state: _Worker, free: float, now: float) -> Steal | None:
        """Take unstarted jobs from the tail of the worker that finishes last, when moving helps.

        A job moves only when this worker (after a server start, if the job's model differs)
        would finish it before the victim would have; only jobs of one model move at a time.
        """
        best: Steal | None = None
        best_finish = free
        for victim in self._workers.values():
            if victim is state or victim.waiting or victim.no_steal or victim.key in self._steals:
                continue
            victim_finish = victim.free_at(now)
            if victim_finish <= best_finish:
                continue
            taken = self._stealable_tail(state, victim, free, victim_finish)
            if taken:
                best, best_finish = Steal(victim.key, tuple(taken), state.key), victim_finish
        if best is not None:
            self._steals[best.victim] = state.key
            state.waiting = True
        return best

    def _stealable_tail(
        self, state: _Worker, victim: _Worker, free: float, victim_finish: float
    ) -> list[int]:
        # the first MIN_PENDING indices are running or already pulled by the worker's loop
        skip = MIN_PENDING
        stealable: list[_Queued] = []
        for queued in victim.queue:
            if skip >= len(queued.remaining):
                skip -= len(queued.remaining)
                continue
            if skip == 0:
                stealable.append(queued)
            skip = 0
        taken: list[int] = []
        model: str | None = None
        moved = 0.0
        for queued in reversed(stealable):
            job = queued.job
            if job.model is not None:
                if model is not None and job.model != model:
                    break
                model = job.model
            same = model is None or model == state.model
            setup = 0.0 if same else self.settings.switch_cost(model)
            if free + setup + moved + job.cost >= victim_finish - moved:
                break
            moved += job.cost
            taken.extend(queued.remaining)
        return taken
