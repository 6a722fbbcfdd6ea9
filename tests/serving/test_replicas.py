"""Replicas: GPUs that other workers of the session gave back serve the largest item's model.

Unit tests drive the decision (:func:`replicas_that_pay`), the rate, the replica set with
fake servers and the request lanes; the pytester run is the real thing on fake GPUs: two
xdist workers, a fake engine with fixed slots and latency, one item ten times the other.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from pytest_modelbench.running.runner import run_lanes
from pytest_modelbench.running.urls import UrlSet
from pytest_modelbench.serving.gpu_claims import claim, session_gpus
from pytest_modelbench.serving.replicas import RateMeter, ReplicaSet, Server, replicas_that_pay
from pytest_modelbench.testing import read_log
from tests.serving.fakevllm import serve_spec, starts, write_models

# -- the decision ------------------------------------------------------------------------------


def test_a_replica_starts_only_when_it_would_serve_half_its_start() -> None:
    # 1000 examples at 10/s on one server: 100 s of work; a 20 s start leaves 80 s to share
    assert replicas_that_pay(
        remaining=1000, rate_per_server=10, serving=1, starting=0, start_s=20, free=1
    )
    # 8 servers would each serve 10 s after the start: exactly half of it, still worth it
    assert (
        replicas_that_pay(
            remaining=1000, rate_per_server=10, serving=1, starting=0, start_s=20, free=16
        )
        == 7
    )
    # the work left is done before a replica could serve
    assert not replicas_that_pay(
        remaining=150, rate_per_server=10, serving=1, starting=0, start_s=20, free=1
    )
    # replicas already starting count: no second one for the same work
    assert not replicas_that_pay(
        remaining=300, rate_per_server=10, serving=1, starting=1, start_s=20, free=1
    )
    assert not replicas_that_pay(
        remaining=0, rate_per_server=10, serving=1, starting=0, start_s=20, free=4
    )


def test_the_rate_is_recent_and_restarts_with_a_new_item() -> None:
    meter = RateMeter(window_s=10, min_span_s=1)
    meter.add(0.0, 0)
    assert meter.rate() is None
    meter.add(0.5, 10)
    assert meter.rate() is None  # under min_span_s
    for t in range(1, 31):
        meter.add(float(t), 10 * t if t <= 20 else 200 + 40 * (t - 20))  # 10/s, then 40/s
    assert meter.rate() == pytest.approx(40 * 10 / 10, rel=0.25)
    meter.add(31.0, 3)  # a new item
    assert meter.rate() is None


# -- the replica set with fake servers ---------------------------------------------------------


class FakeServer:
    def __init__(self, url: str) -> None:
        self.base_url = url
        self.alive = True
        self.stopped = False

    def is_alive(self) -> bool:
        return self.alive and not self.stopped

    def stop(self) -> None:
        self.stopped = True

    def death_report(self) -> str | None:
        return None if self.is_alive() else "the server exited with code 1: boom"


class FakeClaim:
    def __init__(self, gpu: str, free: set[str]) -> None:
        self.gpus = (gpu,)
        self._free = free
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._free.add(self.gpus[0])


class Fleet:
    """Free GPUs, a launch that takes ``start_s``, and the servers it made."""

    def __init__(self, free: set[str], start_s: float = 0.0, fail: bool = False) -> None:
        self.free = free
        self.start_s = start_s
        self.fail = fail
        self.servers: list[FakeServer] = []
        self.claims: list[FakeClaim] = []

    def claim(self) -> FakeClaim | None:
        if not self.free:
            return None
        found = FakeClaim(sorted(self.free)[0], self.free)
        self.free.discard(found.gpus[0])
        self.claims.append(found)
        return found

    def launch(
        self, gpus: tuple[str, ...], index: int, launched: Callable[[Server], None]
    ) -> Server:
        server = FakeServer(f"http://127.0.0.1:{9000 + index}/v1")
        launched(server)
        time.sleep(self.start_s)
        if self.fail:
            raise RuntimeError("CUDA out of memory on GPU " + gpus[0])
        self.servers.append(server)
        return server


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def replica_set(
    fleet: Fleet, urls: UrlSet, progress: list[tuple[str, int, int] | None]
) -> ReplicaSet:
    clock = iter(float(t) for t in range(10_000))
    return ReplicaSet(
        model="m",
        urls=urls,
        launch=fleet.launch,
        claim=fleet.claim,
        progress=lambda: progress[0],
        start_s=2.0,
        poll_s=3600,  # the tests call step() themselves
        clock=lambda: next(clock),
    )


def test_replicas_join_the_url_set_and_leave_it_when_stopped() -> None:
    fleet = Fleet({"1", "2", "3"})
    urls = UrlSet(["http://127.0.0.1:8000/v1"])
    progress: list[tuple[str, int, int] | None] = [("i", 0, 1000)]
    replicas = replica_set(fleet, urls, progress)
    assert replicas.step() == 0  # no rate yet
    progress[0] = ("i", 10, 1000)  # 10 examples/s on one server, 99 s left, 2 s starts
    assert replicas.step() == 3  # every free GPU pays
    wait_for(lambda: len(urls.urls) == 4)
    assert replicas.serving == 4 and replicas.started == 3 and urls.replicas == 3
    assert not fleet.free
    replicas.stop()
    assert urls.urls == ("http://127.0.0.1:8000/v1",)
    assert all(s.stopped for s in fleet.servers)
    assert all(c.released for c in fleet.claims) and fleet.free == {"1", "2", "3"}


def test_while_the_own_server_starts_the_plan_decides() -> None:
    """Before any rate is measured the cost plan's estimate decides: replicas start alongside
    the worker's own server when the item pays for them, wait in a URL set of their own, and
    move to the item's when it starts. Once the server serves, nothing starts between items."""
    fleet = Fleet({"1", "2", "3"})
    waiting = UrlSet()
    progress: list[tuple[str, int, int] | None] = [None]
    estimates = {None: 2.5, "small": 5.0, "big": 100.0}  # seconds of work on one server
    replicas = ReplicaSet(
        model="m",
        urls=waiting,
        launch=fleet.launch,
        claim=fleet.claim,
        progress=lambda: progress[0],
        start_s=2.0,
        estimate=estimates.get,
        primary_ready=False,
        poll_s=3600,
    )
    # 2.5 s of work, all after the 2 s starts: two servers serve 1.25 s each, >= half a start;
    # three would serve 0.83 s
    assert replicas.step() == 1
    estimates[None] = 100.0  # a large item: every free GPU pays
    assert replicas.step() == 2
    wait_for(lambda: len(waiting.urls) == 3)
    item = UrlSet(["http://127.0.0.1:8000/v1"])
    replicas.primary_started(3.0)
    replicas.attach(item)
    assert len(item.urls) == 4 and item.replicas == 3 and replicas.serving == 4
    progress[0] = None  # between items: no estimate is consulted any more
    estimates[None] = 10_000.0
    fleet.free.add("4")
    assert replicas.step() == 0
    progress[0] = ("small", 0, 10)  # a small item of the same server, no rate yet
    assert replicas.step() == 0
    progress[0] = ("big", 0, 1000)  # a large one: its estimate pays for the free GPU
    assert replicas.step() == 1
    replicas.stop()
    assert fleet.free == {"1", "2", "3", "4"} and item.urls == ("http://127.0.0.1:8000/v1",)


def test_while_the_own_server_starts_its_item_counts_no_server_yet() -> None:
    """The built-in suites show the item's progress before its server is up: the server
    that is starting is not counted as serving, and the time it takes is not a rate."""
    fleet = Fleet({"1", "2", "3"})
    progress: list[tuple[str, int, int] | None] = [("big", 0, 1000)]
    clock = iter(float(t) for t in range(10_000))
    replicas = ReplicaSet(
        model="m",
        urls=UrlSet(),
        launch=fleet.launch,
        claim=fleet.claim,
        progress=lambda: progress[0],
        start_s=60.0,
        estimate={"big": 100.0}.get,
        primary_ready=False,
        poll_s=3600,
        clock=lambda: next(clock),
    )
    # 100 s of work, all after the 60 s starts: 3 servers serve 33 s each (>= 30 s), 4 do not
    assert replicas.step() == 2
    assert replicas.step() == 0  # the own server and two replicas are starting: enough
    replicas.primary_started(60.0)
    progress[0] = ("big", 10, 1000)
    assert replicas._meter.rate() is None  # no rate from the start's idle time
    replicas.stop()


def test_between_items_and_near_the_end_no_replica_starts() -> None:
    fleet = Fleet({"1"})
    urls = UrlSet(["http://127.0.0.1:8000/v1"])
    progress: list[tuple[str, int, int] | None] = [None]
    replicas = replica_set(fleet, urls, progress)
    assert replicas.step() == 0 and replicas.step() == 0  # no item runs
    progress[0] = ("i", 0, 12)
    replicas.step()
    progress[0] = ("i", 10, 12)  # 2 examples left at 10/s: done long before a 2 s start
    assert replicas.step() == 0
    assert fleet.free == {"1"}


def test_a_dying_replica_leaves_the_set_releases_its_gpu_and_is_reported() -> None:
    fleet = Fleet({"1", "2"})
    urls = UrlSet(["http://127.0.0.1:8000/v1"])
    progress: list[tuple[str, int, int] | None] = [("i", 0, 1000)]
    replicas = replica_set(fleet, urls, progress)
    replicas.step()
    progress[0] = ("i", 10, 1000)
    replicas.step()
    wait_for(lambda: len(urls.urls) == 3)
    fleet.servers[0].alive = False
    replicas._reap()
    assert fleet.servers[0].base_url not in urls.urls and len(urls.urls) == 2
    assert fleet.claims[0].released
    (note,) = replicas.drain_notes()
    assert note.startswith("m: the replica on GPU 1 died (the server exited with code 1: boom)")
    assert "retried on the other servers" in note
    replicas.stop()


def test_a_replica_that_fails_to_start_is_reported_once_and_not_retried() -> None:
    fleet = Fleet({"1", "2"}, fail=True)
    urls = UrlSet(["http://127.0.0.1:8000/v1"])
    progress: list[tuple[str, int, int] | None] = [("i", 0, 1000)]
    replicas = replica_set(fleet, urls, progress)
    replicas.step()
    progress[0] = ("i", 10, 1000)
    assert 1 <= replicas.step() <= 3  # the launches already under way when the first failed
    wait_for(lambda: fleet.free == {"1", "2"})
    notes = replicas.drain_notes()
    assert notes and "did not start: RuntimeError" not in notes[0]
    assert "did not start: CUDA out of memory on GPU" in notes[0]
    progress[0] = ("i", 20, 1000)
    assert replicas.step() == 0  # given up for this server
    assert urls.urls == ("http://127.0.0.1:8000/v1",)
    replicas.stop()


def test_stopping_during_a_start_stops_that_server_too() -> None:
    fleet = Fleet({"1"}, start_s=0.5)
    urls = UrlSet(["http://127.0.0.1:8000/v1"])
    progress: list[tuple[str, int, int] | None] = [("i", 0, 1000)]
    replicas = replica_set(fleet, urls, progress)
    replicas.step()
    progress[0] = ("i", 10, 1000)
    assert replicas.step() == 1
    replicas.stop()  # while it starts: its launch thread gives the GPU back when done
    wait_for(lambda: bool(fleet.servers) and fleet.servers[0].stopped)
    wait_for(lambda: fleet.free == {"1"})
    assert urls.urls == ("http://127.0.0.1:8000/v1",) and urls.replicas == 0
    assert not replicas.drain_notes()


# -- GPUs the session gave back --------------------------------------------------------------


def test_session_gpus_are_those_its_workers_gave_back(tmp_path: Path) -> None:
    env = {"MODELBENCH_FAKE_GPUS": "0:0,1:0,2:0,3:0"}
    locks = tmp_path / "locks"
    mine = claim(1, locks, option="0", environ=env)
    other = claim(1, locks, option="1", environ=env)
    held = claim(1, locks, option="2", environ=env)
    claim(1, locks, option="3", environ=env).release()  # tried, not given back
    assert session_gpus("s1", locks) == ()
    mine.give_back("s1")
    other.give_back("s2")
    assert session_gpus("s1", locks) == ("0",)
    assert session_gpus("s2", locks) == ("1",)
    assert session_gpus("s1", locks) == ("0",)  # looking does not rewrite the note
    held.give_back("s1")
    assert session_gpus("s1", locks) == ("0", "2")
    again = claim(1, locks, option="0", environ=env)  # someone claims it meanwhile ...
    assert session_gpus("s1", locks) == ("2",)
    again.release()  # ... and releases it without giving it back: no longer the session's
    assert session_gpus("s1", locks) == ("2",)


# -- lanes follow the servers ------------------------------------------------------------------


def test_lanes_grow_when_a_server_joins_and_shrink_when_it_leaves() -> None:
    urls = UrlSet(["http://a/v1"])
    in_flight = 0
    peak: list[int] = []

    async def one(example: object, rollout: int) -> None:
        nonlocal in_flight
        in_flight += 1
        peak.append(in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1

    async def main() -> None:
        units = iter([(object(), 0)] * 1200)

        async def change() -> None:
            await asyncio.sleep(0.1)
            urls.add("http://b/v1")
            await asyncio.sleep(0.8)
            urls.remove("http://b/v1")

        changing = asyncio.create_task(change())
        await run_lanes(units, one, lambda: 4 * len(urls.urls), lambda: False)  # type: ignore[arg-type]
        await changing

    asyncio.run(main())
    assert len(peak) == 1200  # every unit once
    assert max(peak[:20]) == 4
    assert max(peak) == 8
    assert max(peak[-20:]) == 4


# -- the real thing: two workers, fake GPUs, one item ten times the other -------------------------

BIG, SMALL = 400, 40


def write_project(root: Path, costs: dict[str, float] | None = None) -> None:
    """``m1`` served on 1 GPU; envs ``big`` (400 examples) and ``small`` (40), with these
    cost hints (which make the scheduler give each item its own worker)."""
    write_models(root, {"m1": {"model": "m1", **serve_spec(1)}})
    for name, n in (("big", BIG), ("small", SMALL)):
        (root / f"{name}.jsonl").write_text(
            "".join(
                json.dumps({"id": i, "question": f"{name} q{i}", "answer": "a"}) + "\n"
                for i in range(n)
            )
        )
    (root / "configs" / "envs" / "qa.yaml").unlink()
    (root / "configs" / "envs" / "sizes.yaml").write_text(
        yaml.safe_dump(
            [
                {
                    "id": name,
                    "module": "jsonl",
                    "env_args": {"path": f"{name}.jsonl"},
                    "seeds": [0],
                    **({"cost": costs[name]} if costs else {}),
                }
                for name in ("big", "small")
            ]
        )
    )


def test_a_worker_with_nothing_left_gives_its_gpu_to_the_largest_item(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The small item's worker exits; its GPU serves the big item's model as a replica, the
    big item's requests spread over both servers, and no process or claim is left behind."""
    root = pytester.path
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.2")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    monkeypatch.setenv("FAKE_VLLM_LOG_PER_SERVER", "1")
    write_project(root)
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "-n", "2", "--run-id", "r", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=2)
    servers = starts(fake_vllm)
    first: dict[str, dict[str, object]] = {}  # each worker's own server
    replicas = []
    for server in servers:
        own = first.setdefault(str(server["worker"]), server)
        if own is not server and server["gpus"] != own["gpus"]:
            replicas.append(server)
    assert len(replicas) == 1, servers
    (replica,) = replicas
    primary = first[str(replica["worker"])]
    assert {primary["gpus"], replica["gpus"]} == {"0", "1"}  # the GPU given back
    name = f"{replica['worker']}-m1-replica1.log"
    assert (root / "runs" / "r" / "servers" / name).exists()

    big = {
        gpu: [r for r in read_log(root / f"requests-gpu{gpu}.jsonl") if "big" in r.key]
        for gpu in ("0", "1")
    }
    assert len(big[str(replica["gpus"])]) >= BIG // 5, big  # a real share of the big item
    assert sum(map(len, big.values())) == BIG  # every example once, whichever server answered

    for server in servers:  # no orphans
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)
    locks = sorted((root / "modelbench-gpu-locks").glob("gpu-*.lock"))
    assert len(locks) == 2
    for path in locks:
        with open(path) as fd:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds it


def test_replicas_start_alongside_the_server_of_a_large_item(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-k big -n 2``: one item, two GPUs. The idle worker gives its GPU back at once and the
    item's worker starts a replica on it while its own server is still starting (the plan says
    the item pays for it), so both servers answer from the item's first requests."""
    root = pytester.path
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.1")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    monkeypatch.setenv("FAKE_VLLM_START_S", "4")
    monkeypatch.setenv("FAKE_VLLM_LOG_PER_SERVER", "1")
    write_project(root, costs={"big": 1000, "small": 200})
    result = pytester.runpytest_subprocess(  # with the cache: the duration memory is checked
        "benchmarks/", "--model", "m1", "-k", "big", "-n", "2", "--run-id", "r"
    )
    result.assert_outcomes(passed=1)
    servers = starts(fake_vllm)
    assert sorted(s["gpus"] for s in servers) == ["0", "1"], servers
    assert len({s["worker"] for s in servers}) == 1  # the item's worker started both
    primary, replica = servers
    assert replica["t"] < primary["t"] + 4.0  # launched before its own server served
    logs = {
        gpu: [r for r in read_log(root / f"requests-gpu{gpu}.jsonl") if "big" in r.key]
        for gpu in ("0", "1")
    }
    assert sum(map(len, logs.values())) == BIG
    first = min(r.start for log in logs.values() for r in log)
    on_replica = logs[str(replica["gpus"])]
    assert len(on_replica) >= BIG // 3, {g: len(v) for g, v in logs.items()}
    assert min(r.start for r in on_replica) < first + 2.0  # there from the start
    summary = json.loads((root / "runs" / "r" / "m1-big-seed0" / "summary.json").read_text())
    assert summary["server_s"] > 1.3 * summary["duration_s"]  # its work on one server
    remembered = json.loads((root / ".pytest_cache/v/modelbench/durations").read_text())
    assert remembered == {"m1-big-seed0": summary["server_s"]}  # what the next plan uses
    for server in servers:  # no orphans
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)


def test_a_server_that_fails_to_start_takes_its_early_replicas_down_too(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The item's own server fails while a replica starts alongside it: the item fails with the
    server's own cause, the replica is stopped, and no process or GPU claim is left."""
    root = pytester.path
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setenv("FAKE_VLLM_START_S", "3")
    monkeypatch.setenv("FAKE_VLLM_FAIL_START", "1")
    write_project(root, costs={"big": 1000, "small": 200})
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "-k", "big", "-n", "2", "--run-id", "r",
    )  # fmt: skip
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*m1: vLLM server for 'm1' on GPU * exited with code 1*", "*CUDA out of memory*"]
    )
    servers = starts(fake_vllm)
    assert sorted(s["gpus"] for s in servers) == ["0", "1"], servers  # the replica was launched
    for server in servers:
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)
    for path in sorted((root / "modelbench-gpu-locks").glob("gpu-*.lock")):
        with open(path) as fd:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds it


def test_a_worker_with_nothing_left_lends_its_running_server(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both items on their own worker, one model: when the small one ends, its worker's server
    (already serving the model) answers the big item's requests at once, without a start, and
    is stopped once the big item's worker lets it go."""
    root = pytester.path
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.2")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    monkeypatch.setenv("FAKE_VLLM_LOG_PER_SERVER", "1")
    write_project(root, costs={"big": 1000, "small": 200})
    result = pytester.runpytest_subprocess(  # -q: no live display, replicas all the same
        "benchmarks/", "--model", "m1", "-n", "2", "--run-id", "r", "-p", "no:cacheprovider", "-q"
    )
    result.assert_outcomes(passed=2)
    servers = starts(fake_vllm)
    assert sorted(s["gpus"] for s in servers) == ["0", "1"], servers  # no third start
    assert len({s["worker"] for s in servers}) == 2
    logs = {gpu: read_log(root / f"requests-gpu{gpu}.jsonl") for gpu in ("0", "1")}
    (small_gpu,) = [gpu for gpu, log in logs.items() if any("small" in r.key for r in log)]
    lent = [r for r in logs[small_gpu] if "big" in r.key]
    assert len(lent) >= BIG // 5  # the lent server did a real share of the big item
    last_small = max(r.end for r in logs[small_gpu] if "small" in r.key)
    assert min(r.start for r in lent) >= last_small - 1.0  # lent once its own item was done
    assert sum(1 for log in logs.values() for r in log if "big" in r.key) == BIG
    for server in servers:  # no orphans
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)
    assert not list((root / "modelbench-gpu-locks").glob("session-*"))  # nothing on disk


def test_without_xdist_no_replica_is_started(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single process never takes GPUs it was not given: replicas use only what workers of
    the same session gave back."""
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setenv("FAKE_VLLM_LATENCY", "0.05")
    monkeypatch.setenv("FAKE_VLLM_SLOTS", "4")
    write_project(pytester.path)
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "-k", "big", "--run-id", "r", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
    assert [s["gpus"] for s in starts(fake_vllm)] == ["0"]


def test_only_replicas_raise_the_requests_in_flight() -> None:
    """A configured list of URLs shares one max_concurrent (a gateway's rate limit is not
    multiplied); each replica modelbench adds brings its own."""
    urls = UrlSet(["http://a/v1", "http://b/v1"])
    assert urls.replicas == 0
    urls.add("http://127.0.0.1:9001/v1", replica=True)
    urls.add("http://a/v1", replica=True)  # already configured: not a replica
    assert urls.replicas == 1
    urls.remove("http://127.0.0.1:9001/v1")
    assert urls.replicas == 0
