"""Scheduling benchmark items over xdist workers, simulated: server starts and makespan.

Each scenario is a list of items with known costs (seconds) on 3 models, collected in plan
order (model, then variant, then seed) and run by 8 simulated workers. A worker behaves like
xdist's worker loop (``xdist/remote.py``): it starts an item only while it holds the next
one too (or after ``shutdown``), a ``steal`` takes back only items still in its queue, and
every change of model on a worker restarts the server (``START_S`` seconds). The schedulers
are the real classes: xdist's ``LoadScheduling`` (the default ``--dist load``: chunks in
collection order) and ``WorkStealingScheduling``, and modelbench's
``ModelAffinityScheduling``; the controller reacts to events as ``DSession`` does
(including its ``triggershutdown`` once ``tests_finished``).

Two lower bounds are reported. The fleet's, total / workers + one server start, is what a
schedule could reach if an item's requests could be spread over every GPU (replicas); the
item's, max(total / workers, largest item), is what any schedule that runs each item on one
worker can reach. The ratio is makespan / the fleet's bound: with one dominant item (the
shipped plan's mmlu) it shows how long the other GPUs idle.

The fleet scenarios are the shipped plan (``pytest benchmarks/ --model gpt-oss-20b
--collect-only``: 9 items, ~10.1M estimated tokens) on 8 GPUs at gpt-oss-20b's H100 serving
rate, and three models running it on 64 GPUs over 8 nodes.

Run ``python perf/scheduler_sim.py`` for the Markdown table (PERFORMANCE.md);
``tests/scheduler/test_simulation.py`` imports this module.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from xdist.remote import Producer
from xdist.scheduler import LoadScheduling, WorkStealingScheduling

from pytest_modelbench.scheduling.costs import TableCosts
from pytest_modelbench.scheduling.dist import ModelAffinityScheduling

WORKERS = 8
START_S = 90.0  # a vLLM server start
MODELS = ("llama-8b", "qwen-14b", "mistral-7b")
SPEED = {"llama-8b": 1.0, "qwen-14b": 1.7, "mistral-7b": 0.8}  # relative seconds per example
SHUTDOWN = object()
QUIET = Producer("sim", enabled=False)
Maker = Callable[[Any, Callable[[], float]], Any]  # (config, clock) -> scheduler


@dataclass(frozen=True)
class SimItem:
    nodeid: str
    model: str | None
    cost: float  # true seconds
    estimate: float  # what the scheduler is told


@dataclass(frozen=True)
class Scenario:
    name: str
    items: tuple[SimItem, ...]
    workers: int = WORKERS

    @property
    def total(self) -> float:
        return sum(item.cost for item in self.items)

    def bound(self, workers: int) -> float:
        """The fleet's: every GPU busy from one server start to the end."""
        start = START_S if any(item.model is not None for item in self.items) else 0.0
        return self.total / workers + start

    def item_bound(self, workers: int) -> float:
        """Any schedule that runs each item on one worker: max(total / workers, largest)."""
        return max(self.total / workers, max(item.cost for item in self.items))


@dataclass(frozen=True)
class Outcome:
    scenario: str
    scheduler: str
    starts: int
    makespan: float
    bound: float  # the fleet's (see the module docstring)
    item_bound: float  # max(total / workers, largest item)
    events: int
    controller_s: float  # wall time spent inside the scheduler

    @property
    def ratio(self) -> float:
        """Makespan over the fleet's bound."""
        return self.makespan / self.bound

    @property
    def item_ratio(self) -> float:
        """Makespan over the bound of schedules that keep each item on one worker."""
        return self.makespan / self.item_bound


# -- scenarios ---------------------------------------------------------------------------------
def _items(
    rng: random.Random,
    variants: dict[str, int],
    seeds: int,
    median_s: float,
    sigma: float,
    noise: float = 0.0,
) -> tuple[SimItem, ...]:
    base = {
        f"env{v}": rng.lognormvariate(math.log(median_s), sigma)
        for v in range(max(variants.values()))
    }
    items = []
    for model in MODELS:
        for v in range(variants[model]):
            for seed in range(seeds):
                cost = base[f"env{v}"] * SPEED[model] * rng.uniform(0.9, 1.1)
                estimate = cost * (rng.lognormvariate(0.0, noise) if noise else 1.0)
                nodeid = f"benchmarks/test_models.py::test_benchmark[{model}-env{v}-seed{seed}]"
                items.append(SimItem(nodeid, model, cost, estimate))
    return tuple(items)


# The shipped plan's estimated tokens per item (pytest benchmarks/ --model gpt-oss-20b --co)
SHIPPED_TOKENS = {
    "humaneval": 82_000,
    "mbpp": 200_000,
    "gsm8k": 593_550,
    "math500": 600_000,
    "medmcqa": 1_464_050,
    "medqa": 763_800,
    "mmlu": 5_616_800,
    "mmlu-medical": 435_600,
    "pubmedqa": 350_000,
}
# tokens per second on one H100: gpt-oss-20b's serving rate, and two other models
FLEET_RATES = {"gpt-oss-20b": 16_700.0, "qwen3-8b": 25_000.0, "qwen3-32b": 7_000.0}


def _shipped(models: Sequence[str]) -> tuple[SimItem, ...]:
    return tuple(
        SimItem(
            f"benchmarks/test_models.py::test_benchmark[{model}-{env}-seed0]",
            model,
            tokens / FLEET_RATES[model],
            tokens / FLEET_RATES[model],
        )
        for model in models
        for env, tokens in SHIPPED_TOKENS.items()
    )


def fleet_scenarios() -> list[Scenario]:
    """The headline job: the shipped plan on an 8-GPU node, and 3 models on 8 such nodes."""
    mmlu = tuple(i for i in _shipped(["gpt-oss-20b"]) if "mmlu" in i.nodeid)  # as -k selects
    return [
        Scenario("shipped plan, gpt-oss-20b, 8 GPUs", _shipped(["gpt-oss-20b"]), 8),
        Scenario("-k mmlu (mmlu, mmlu-medical), gpt-oss-20b, 8 GPUs", mmlu, 8),
        Scenario("shipped plan, 3 models, 64 GPUs (8 nodes)", _shipped(list(FLEET_RATES)), 64),
    ]


def scenarios(seed: int = 0) -> list[Scenario]:
    rng = random.Random(seed)
    even = {m: 12 for m in MODELS}
    skewed = {"llama-8b": 24, "qwen-14b": 6, "mistral-7b": 4}
    heavy = list(_items(rng, even, 3, 240.0, 0.8))
    heavy[5] = SimItem(heavy[5].nodeid, heavy[5].model, 3.0 * 3600, 3.0 * 3600)  # one long item
    return [
        Scenario("3 models x 12 variants x 3 seeds", _items(rng, even, 3, 300.0, 1.0)),
        Scenario("skewed: 24 / 6 / 4 variants", _items(rng, skewed, 3, 300.0, 1.0)),
        Scenario("one 3 h item among 108", tuple(heavy)),
        Scenario("estimates off by x/÷ 1.6 (σ=0.5)", _items(rng, even, 3, 300.0, 1.0, noise=0.5)),
        Scenario(
            "10k short items (3 x 3334, ~20 s)",
            _items(rng, {m: 3334 for m in MODELS}, 1, 20.0, 0.6),
        ),
    ]


# -- simulated xdist -----------------------------------------------------------------------------
class SimNode:
    """A worker as xdist's controller sees it, running xdist's worker loop in simulated time."""

    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim = sim
        self.gateway = SimpleNamespace(id=name)
        self.torun: deque[Any] = deque()
        self.next: Any = None  # pulled from the queue: the item to run after the current one
        self.running: int | None = None
        self.done = False
        self.shutdown_sent = False
        self.server: str | None = None
        self.starts = 0
        self.steals = [0, 0]  # asked, granted
        self.sends = 0
        self.ran: list[tuple[float, int]] = []
        # replicas (Simulation(replicas=True)): the running item's servers and work left
        self.host = 0
        self.work_left = 0.0  # seconds of the running item's work on one server
        self.serving = 1  # servers answering it: its own, replicas, lent ones
        self.starting = 0  # replicas starting for it
        self.serve_from = 0.0  # when its own server is ready
        self.updated = 0.0
        self.version = 0  # bumps when its completion moves: older events are stale
        self.replicas: list[int] = []  # the hosts of the replicas serving it (kept across items
        # of one model)
        self.borrowed: list[SimNode] = []  # idle workers whose servers it uses
        self.lent_to: SimNode | None = None

    def __repr__(self) -> str:
        return f"<SimNode {self.gateway.id}>"

    @property
    def shutting_down(self) -> bool:
        return self.shutdown_sent or self.done

    # commands from the controller
    def send_runtest_some(self, indices: Sequence[int]) -> None:
        self.sends += 1
        self.torun.extend(indices)
        self.advance()

    def send_steal(self, indices: Sequence[int]) -> None:
        wanted = set(indices)
        stolen = [i for i in self.torun if i in wanted]
        self.steals[0] += 1
        if len(stolen) == len(wanted):
            self.torun = deque(i for i in self.torun if i not in wanted)
            self.steals[1] += 1
        else:
            stolen = []
        self.sim.post(0.0, "unscheduled", self, stolen)

    def shutdown(self) -> None:
        if not self.done:
            self.torun.append(SHUTDOWN)
            self.shutdown_sent = True
            self.advance()

    # the worker loop (xdist/remote.py: pytest_runtestloop + run_one_test)
    def advance(self) -> None:
        if self.running is not None or self.done:
            return
        if self.next is None:
            if not self.torun:
                return
            self.next = self.torun.popleft()
        if self.next is SHUTDOWN:
            self.done = True
            self.sim.post(0.0, "finished", self, None)
            return
        if not self.torun:
            return  # holds one item: waits for the next one (or shutdown) before running it
        index, self.next = self.next, self.torun.popleft()
        item = self.sim.items[index]
        duration = item.cost
        switch = item.model is not None and item.model != self.server
        if switch:
            self.sim.release_replicas(self)
            self.server = item.model
            self.starts += 1
            duration += START_S
        self.running = index
        self.ran.append((self.sim.now, index))
        if self.sim.replicas and item.model is not None:
            self.work_left = item.cost
            self.serve_from = self.sim.now + (START_S if switch else 0.0)
            self.updated = self.serve_from
            self.serving = 1 + len(self.replicas) + len(self.borrowed)
            self.sim.reschedule(self)
            # replicas may start with its own server, on the plan's estimate (``early``)
            delay = 0.0 if self.sim.early else self.serve_from - self.sim.now
            self.sim.post(delay, "check", self, self.host)
            return
        self.sim.post(duration, "complete", self, (index, duration, self.version))

    def complete(self) -> None:
        self.running = None


class Simulation:
    """``replicas``: GPUs that workers give back serve the running items' models, through
    the real decision (``serving.replicas.replicas_that_pay``): a worker with nothing left
    lends its server to a running item of the same model (no start), else its GPU starts a
    replica (``START_S``) for the item whose keeper asks first (random order, as the real
    keepers race for the lock), when it pays. ``early``: replicas start with the item's own
    server, on the plan's estimate (else once it serves). ``cross_node``: as the session's
    exchange does (``serving/exchange.py``), items of the worker's own node come first,
    then other nodes' (lent servers and replicas alike). ``per_host`` workers share a node."""

    def __init__(
        self,
        items: Sequence[SimItem],
        make: Maker,
        workers: int,
        *,
        replicas: bool = False,
        early: bool = True,
        cross_node: bool = True,
        per_host: int = 8,
        seed: int = 0,
    ) -> None:
        self.items = list(items)
        self.replicas = replicas
        self.early = early
        self.cross_node = cross_node
        self.free: dict[int, int] = {}  # host -> GPUs given back, unclaimed
        self.rng = random.Random(seed)
        self.replica_starts = 0
        self.lends = 0
        self.now = 0.0
        self._events: list[tuple[float, int, str, SimNode, Any]] = []
        self._seq = 0
        config = SimpleNamespace(
            getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None,
            getoption=lambda _name, _default=None: None,
            # hooks are called with keyword arguments, so the stand-in keeps the hookspec name
            hook=SimpleNamespace(pytest_collectreport=lambda report: None),  # noqa: ARG005
        )
        self.sched = make(config, lambda: self.now)
        self.nodes = [SimNode(self, f"gw{i}") for i in range(workers)]
        for i, node in enumerate(self.nodes):
            node.host = i // per_host  # one --tx group per host, as xdist names their specs
            node.gateway.spec = f"popen//id={node.gateway.id}//python=remote host{node.host}"
        self.controller_s = 0.0
        self.events = 0

    def post(self, delay: float, kind: str, node: SimNode, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + delay, self._seq, kind, node, payload))

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        started = time.perf_counter()
        result = method(*args)
        self.controller_s += time.perf_counter() - started
        self.events += 1
        return result

    def run(self) -> float:
        collection = [item.nodeid for item in self.items]
        for node in self.nodes:
            self._call(self.sched.add_node, node)
        for node in self.nodes:
            self._call(self.sched.add_node_collection, node, collection)
        self._call(self.sched.schedule)
        shutting_down = False
        makespan = 0.0
        while self._events:
            self.now, _, kind, node, payload = heapq.heappop(self._events)
            if kind == "complete":
                index, duration, version = payload
                if version != node.version:
                    continue  # its completion moved (a replica joined)
                makespan = max(makespan, self.now)
                node.complete()
                self._call(self.sched.mark_test_complete, node, index, duration)
                node.advance()
            elif kind == "unscheduled":
                self._call(self.sched.remove_pending_tests_from_node, node, payload)
            elif kind == "finished" and node in self.sched.nodes:
                assert self._call(self.sched.remove_node, node) is None
                if self.replicas:
                    self.give_back(node)
            else:
                self._replica_event(kind, node, payload)
            if not shutting_down and self.sched.tests_finished:  # DSession.triggershutdown
                shutting_down = True
                for other in list(self.sched.nodes):
                    other.shutdown()
        ran = sorted(index for node in self.nodes for _, index in node.ran)
        assert ran == list(range(len(self.items))), "every item runs exactly once"
        return makespan

    # -- replicas ----------------------------------------------------------------------------
    def _replica_event(self, kind: str, node: SimNode, payload: Any) -> None:
        if kind == "replica":
            self.replica_ready(node, payload)
        elif kind == "check":
            self.grow(payload)

    def _update(self, node: SimNode) -> None:
        if self.now > node.updated:
            node.work_left = max(0.0, node.work_left - (self.now - node.updated) * node.serving)
            node.updated = self.now

    def reschedule(self, node: SimNode) -> None:
        """Post the running item's completion for its servers now."""
        assert node.running is not None
        self._update(node)
        node.version += 1
        begin = max(self.now, node.serve_from)
        end = begin + node.work_left / node.serving
        duration = end - self.now
        self.post(duration, "complete", node, (node.running, duration, node.version))

    def _running(self, host: int) -> list[SimNode]:
        return [
            n
            for n in self.nodes
            if n.host == host
            and n.running is not None
            and n.server is not None
            and self.items[n.running].model is not None
        ]

    def give_back(self, node: SimNode) -> None:
        """A worker with nothing left: lend its server, else free its GPU."""
        self.release_replicas(node)
        takers = [n for n in self._running(node.host) if n.server == node.server]
        if self.cross_node and not takers:  # lent to another node's item (exchange)
            takers = [n for n in self._running_anywhere() if n.server == node.server]
        if node.server is not None and takers:
            taker = self.rng.choice(takers)
            self._update(taker)
            taker.borrowed.append(node)
            node.lent_to = taker
            taker.serving += 1
            self.lends += 1
            self.reschedule(taker)
            return
        self.free[node.host] = self.free.get(node.host, 0) + 1
        self.grow(node.host)

    def release_replicas(self, node: SimNode) -> None:
        """A model switch or the end: replicas stop, lent servers go back."""
        hosts, node.replicas = node.replicas, []
        for host in hosts:
            self.free[host] = self.free.get(host, 0) + 1
        lenders, node.borrowed = node.borrowed, []
        for lender in lenders:
            lender.lent_to = None
            self.give_back(lender)
        if node.starting:
            node.starting = 0  # their GPUs come back when the starts would have finished
        self.post(0.0, "check", node, node.host)

    def grow(self, host: int) -> None:
        """Running items ask for the free GPUs they pay to use (random order: the real keepers
        race): first the items of ``host``, then, across nodes (``serving/exchange.py``),
        other nodes' items for the GPUs free here, and this node's items for GPUs free on
        other nodes."""
        self._grow_on(host, self._running(host))
        if not self.cross_node:
            return
        self._grow_on(host, [n for n in self._running_anywhere() if n.host != host])
        for other in sorted(self.free):
            if other != host and self.free[other] > 0:
                self._grow_on(other, self._running(host))

    def _running_anywhere(self) -> list[SimNode]:
        return [n for h in sorted({n.host for n in self.nodes}) for n in self._running(h)]

    def _grow_on(self, gpu_host: int, keepers: list[SimNode]) -> None:
        # lazily: the simulation without replicas does not need the serving package
        from pytest_modelbench.serving.replicas import replicas_that_pay

        self.rng.shuffle(keepers)
        for node in keepers:
            if self.free.get(gpu_host, 0) <= 0:
                return
            starting = self.now < node.serve_from  # its own server is still starting
            if starting and not self.early:
                continue
            self._update(node)
            # before its server serves, the keeper knows only the plan's estimate
            assert node.running is not None
            work = self.items[node.running].estimate if starting else node.work_left
            wanted = replicas_that_pay(
                remaining=math.ceil(work * 1000),
                rate_per_server=1000.0,
                serving=node.serving - starting,
                starting=node.starting + starting,
                start_s=START_S,
                free=self.free[gpu_host],
            )
            if wanted:
                self.free[gpu_host] -= wanted
                node.starting += wanted
                self.replica_starts += wanted
                for _ in range(wanted):
                    self.post(START_S, "replica", node, (node.running, node.server, gpu_host))

    def replica_ready(self, node: SimNode, payload: tuple[int | None, str | None, int]) -> None:
        index, model, gpu_host = payload
        if node.starting <= 0 or node.server != model:  # released while starting
            self.free[gpu_host] = self.free.get(gpu_host, 0) + 1
            self.grow(gpu_host)
            return
        node.starting -= 1
        node.replicas.append(gpu_host)
        if node.running is not None and (
            node.running == index or self.items[node.running].model == model
        ):
            self._update(node)
            node.serving += 1
            self.reschedule(node)


def _modelbench(items: Sequence[SimItem]) -> Maker:
    table = {item.nodeid: (item.model, item.estimate) for item in items}
    starts = {item.model: START_S for item in items if item.model is not None}
    return lambda config, clock: ModelAffinityScheduling(
        config, QUIET, jobs=TableCosts(table, starts), clock=clock
    )


SCHEDULERS: dict[str, Callable[[Sequence[SimItem]], Maker]] = {
    "xdist load": lambda _items: lambda config, _clock: LoadScheduling(config, QUIET),
    "xdist worksteal": lambda _items: lambda config, _clock: WorkStealingScheduling(config, QUIET),
    "modelbench": _modelbench,
}


REPLICAS = "modelbench + replicas"  # modelbench's scheduler with replicas on given-back GPUs
LATE = "modelbench + node-local replicas after a measured rate"  # the previous round's
LOCAL = "modelbench + node-local replicas"  # without the exchange (one node's GPUs only)
VARIANTS = (*SCHEDULERS, LATE, LOCAL, REPLICAS)


def simulate(
    scenario: Scenario, scheduler: str, workers: int | None = None, seed: int = 0
) -> Outcome:
    workers = workers or scenario.workers
    replicas = scheduler in (REPLICAS, LATE, LOCAL)
    make = SCHEDULERS["modelbench" if replicas else scheduler](scenario.items)
    sim = Simulation(
        scenario.items,
        make,
        workers,
        replicas=replicas,
        early=scheduler != LATE,
        cross_node=scheduler == REPLICAS,
        seed=seed,
    )
    makespan = sim.run()
    return Outcome(
        scenario.name,
        scheduler,
        sum(n.starts for n in sim.nodes) + sim.replica_starts,
        makespan,
        scenario.bound(workers),
        scenario.item_bound(workers),
        sim.events,
        sim.controller_s,
    )


def _hours(seconds: float) -> str:
    return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"


def table(outcomes: Sequence[Outcome]) -> str:
    lines = [
        "| scenario | scheduler | server starts | makespan | fleet bound | makespan / fleet bound "
        "| makespan / item bound | controller µs/event |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.scenario} | {o.scheduler} | {o.starts} | {_hours(o.makespan)} | "
            f"{_hours(o.bound)} | {o.ratio:.3f} | {o.item_ratio:.3f} | "
            f"{1e6 * o.controller_s / max(o.events, 1):.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    outcomes = [simulate(s, name) for s in scenarios(args.seed) for name in SCHEDULERS]
    print(
        f"{WORKERS} workers, 3 models, server start {START_S:.0f} s; fleet bound = total / "
        "workers + one start; item bound = max(total / workers, largest item)\n"
    )
    print(table(outcomes))
    print(
        "\nThe headline job (fleet scenarios; per-GPU rates "
        + ", ".join(f"{m} {r / 1000:.1f}k tok/s" for m, r in FLEET_RATES.items())
        + ")\n"
    )
    print(table([simulate(s, name) for s in fleet_scenarios() for name in VARIANTS]))


if __name__ == "__main__":
    main()
