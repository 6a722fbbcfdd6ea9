"""``--mb-stop-early`` sends only a window past the first example its rule still waits for:
one slow reply early in the seeded order pauses sending instead of letting the rest of the item
go out while the rule waits for it. Without the flag nothing changes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_modelbench.backends.jsonl_suite import JsonlSuite
from pytest_modelbench.gating.early import EarlyStopper, value_rule
from pytest_modelbench.running.client import Completion
from pytest_modelbench.running.progress import NullProgress
from pytest_modelbench.running.runner import (
    LoopSettings,
    in_window,
    run_lanes,
    run_loop,
    send_ahead,
)
from pytest_modelbench.suites.contract import Example, Score
from pytest_modelbench.suites.selection import sample_order
from tests.conftest import Project
from tests.core.test_stop_early import _completions, _summary

N = 300
LANES = 4
SLOW_S = 3.0  # the slow reply: ample time for the other 299 to go out if nothing holds them


@pytest.fixture
def slow_third(project: Project, sim: Any) -> tuple[Project, Any]:
    """300 questions all answered wrong against a baseline of 0.65; the third of the sample's
    order takes ``SLOW_S`` to answer, the others 2 ms."""
    path = project.qa("qa", N)
    examples = JsonlSuite().examples({"path": str(path)}, 0)
    third = sample_order(examples)[2].last_user_text
    server = sim(
        accuracy=0.0,
        lookup=project.lookup("qa"),
        latency=0.002,
        latency_overrides={third: SLOW_S},
    )
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": LANES}}
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {value: 0.65}\n")
    return project, server


def test_one_slow_reply_pauses_sending_after_the_window(slow_third: tuple[Project, Any]) -> None:
    """The rule cannot read past the slow third example until it answers; meanwhile at most the
    window's units past it are sent (before the window, all 300 went out while it waited)."""
    project, server = slow_third
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    result.assert_outcomes(failed=1)
    stopped = _summary(project)["stopped_early"]
    used = stopped["n_used"]
    assert stopped["decision"] == "regression" and 3 <= used < N / 10
    window = send_ahead(LANES)
    assert window == 64  # the floor: 4 lanes × 4 is less
    sent = _completions(server)
    assert used < sent <= used + window  # positions sent stay below the frontier + window
    assert sent < N / 3


def test_with_rollouts_the_window_counts_requests(slow_third: tuple[Project, Any]) -> None:
    """Three rollouts per example: a unit's place is its index in the ordered unit list, and
    the window is counted in requests past the example the rule waits for."""
    project, server = slow_third
    variant = {"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}
    project.env("qa", [{**variant, "rollouts_per_example": 3}])
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    result.assert_outcomes(failed=1)
    used = _summary(project)["stopped_early"]["n_used"]
    sent = _completions(server)
    assert 3 * used < sent <= 3 * used + send_ahead(LANES) < 3 * N / 3  # of 900 units


def test_without_the_flag_every_unit_is_sent_at_full_concurrency(
    slow_third: tuple[Project, Any],
) -> None:
    project, server = slow_third
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    result.assert_outcomes(failed=1)
    assert _completions(server) == N
    assert server.max_in_flight == LANES  # the slow reply held one lane, never the others


def test_with_the_flag_an_item_never_certain_still_sends_everything(
    slow_third: tuple[Project, Any],
) -> None:
    """The window follows the prefix to the end: no lane waits forever, every unit is sent."""
    project, server = slow_third
    (project.root / "configs" / "baselines" / "alpha.yaml").write_text("qa: {value: 0.0}\n")
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--mb-stop-early")
    result.assert_outcomes(passed=1)
    summary = _summary(project)
    assert "stop_rule" in summary  # a rule read the item all along: its window was in force
    assert "stopped_early" not in summary and _completions(server) == N


def _stopper(n: int, rollouts: int) -> EarlyStopper:
    rule = value_rule(0.5, 0.0, 0.05)
    assert rule is not None
    return EarlyStopper(rule, [f"q{i}" for i in range(n)], rollouts, "m")


def test_positions_count_rollouts_and_the_frontier_covers_the_waited_example() -> None:
    """With rollouts, a unit's position is its index in the ordered unit list; the frontier
    ends after every rollout of the first unfinished example (a window smaller than the
    rollouts cannot starve it), and rows read at resume count as done."""
    stopper = _stopper(10, 3)
    assert [stopper.position("q2", r) for r in range(3)] == [6, 7, 8]
    assert stopper.frontier() == 3
    for example in ("q0", "q1"):  # journalled by an earlier run, read before the loop
        for rollout in range(3):
            stopper.add({"example_id": example, "rollout": rollout, "metrics": {"m": 1.0}})
    assert stopper.used == 2 and stopper.frontier() == 9
    stopper.add({"example_id": "q2", "metrics": {"m": 200.0}})  # off the scale: reads no more
    assert stopper.disabled and stopper.frontier() == 30


class _Order:
    """A stop rule's order over plain integers: unit i is at position i."""

    def __init__(self) -> None:
        self.done: set[int] = set()

    def position(self, example_id: str, rollout: int) -> int:
        return int(example_id) + rollout  # one rollout: rollout is 0

    def frontier(self) -> int:
        first = 0
        while first in self.done:
            first += 1
        return first + 1


def _units(n: int) -> list[tuple[Example, int]]:
    return [(Example(id=str(i), messages=(), gold=""), 0) for i in range(n)]


def _blocked_loop(
    stopped: list[bool],
) -> tuple[_Order, list[int], asyncio.Event, Any]:
    """Lanes over 1000 units whose unit 0 waits on an event; the others answer at once."""
    order, started, release = _Order(), [], asyncio.Event()

    async def one(example: Example, rollout: int) -> None:
        started.append(int(example.id))
        if example.id == "0":
            await release.wait()
        else:
            await asyncio.sleep(0)
        order.done.add(int(example.id))

    sent = in_window(one, order, lambda: 8, lambda: stopped[0])
    lanes = run_lanes(iter(_units(1000)), sent, lambda: 8, lambda: stopped[0])
    return order, started, release, lanes


def test_waiting_lanes_wake_when_the_slow_unit_answers() -> None:
    async def main() -> list[int]:
        _, started, release, lanes = _blocked_loop([False])
        task = asyncio.ensure_future(lanes)
        for _ in range(200):
            await asyncio.sleep(0)
        assert max(started) == send_ahead(8) and len(started) == send_ahead(8) + 1
        release.set()
        await asyncio.wait_for(task, 5)
        return started

    assert sorted(asyncio.run(main())) == list(range(1000))


def test_waiting_lanes_end_when_the_endpoint_dies_or_the_loop_is_cancelled() -> None:
    async def dead() -> int:
        stopped = [False]
        _, started, release, lanes = _blocked_loop(stopped)
        task = asyncio.ensure_future(lanes)
        for _ in range(200):
            await asyncio.sleep(0)
        stopped[0] = True  # the endpoint is gone: the unit in flight fails and wakes the lanes
        release.set()
        await asyncio.wait_for(task, 5)
        return len(started)

    assert asyncio.run(dead()) == send_ahead(8) + 1

    async def cancelled() -> None:
        _, _, _, lanes = _blocked_loop([False])
        task = asyncio.ensure_future(lanes)
        for _ in range(200):
            await asyncio.sleep(0)
        task.cancel()  # Ctrl-C: nothing waits on the window any more
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

    asyncio.run(cancelled())


class _Suite:
    """A suite whose every answer scores 1 (scored inline)."""

    name = "ones"
    primary_metric = "exact_match"
    blocking_score = False

    def score(self, example: Example, text: str) -> Score:  # noqa: ARG002 - the protocol's
        return Score(metrics={"exact_match": 1.0})


class _Client:
    """Answers every request at once; never dies; no replicas."""

    dead = None
    urls = SimpleNamespace(replicas=0)

    async def request(self, path: str, payload: Any) -> Completion:  # noqa: ARG002
        await asyncio.sleep(0)
        return Completion(
            text="a",
            finish_reason="stop",
            prompt_tokens=1,
            completion_tokens=1,
            latency_s=0.0,
            attempts=1,
        )


class _SinkStoppingAfter:
    """A row sink whose item is certain after ``n`` rows (``--mb-stop-early``'s sink)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.appended: list[Any] = []

    def append(self, row: Any) -> None:
        self.appended.append(row)

    def stopped(self) -> bool:
        return len(self.appended) >= self.n


def test_a_loop_given_the_rules_order_stops_once_the_sink_says_so() -> None:
    """The order the rule reads is what makes a loop stoppable: no other flag is needed."""
    order, sink = _Order(), _SinkStoppingAfter(5)
    settings = LoopSettings(
        api="completions", model="m", sampling_args={}, seed=0, max_concurrent=2
    )

    async def main() -> None:
        await run_loop(
            _Suite(),  # type: ignore[arg-type]
            iter(_units(200)),
            _Client(),  # type: ignore[arg-type]
            sink,  # type: ignore[arg-type]
            settings,
            NullProgress(),
            order=order,
        )

    asyncio.run(asyncio.wait_for(main(), 10))
    assert 5 <= len(sink.appended) < 20  # without the order-as-switch, all 200 were answered
