"""The per-item evaluation loop: keep ``max_concurrent`` requests in flight, journal every example.

A pool of lanes (coroutines) pulls (example, rollout) work units from one
iterator, so memory stays flat for 100k-example items and each server always
has ``max_concurrent`` requests to batch: when a replica joins the model's URL
set the pool grows, when a server leaves it shrinks. Each finished example is one
journal row, appended to the item's ``RowSink`` (``store.item_rows``); failures after
retries are recorded as errors, never as wrong answers. Heavy scorers run in worker processes
(``running.scoring``), waiting ones in threads: the loop never waits on scoring.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_modelbench.running.client import Completion, OpenAIClient, RequestFailed
from pytest_modelbench.running.progress import ProgressSink
from pytest_modelbench.running.scoring import off_loop_scorer
from pytest_modelbench.store.item_rows import RowSink
from pytest_modelbench.store.records import JOURNAL_ROW_VERSION
from pytest_modelbench.suites.contract import Example, Suite

GROW_EVERY_S = 0.5  # how soon the lanes follow a server joining or leaving
# --mb-stop-early: how many units past the rule's first unfinished example may be sent: this
# many per lane of capacity, at least SEND_AHEAD_MIN (lanes seldom wait when nothing stops)
SEND_AHEAD_PER_LANE = 4
SEND_AHEAD_MIN = 64


def request_seed(item_seed: int, example_id: str, rollout: int) -> int:
    """A per-request sampling seed, stable across runs and independent of batching order."""
    digest = hashlib.sha256(f"{item_seed}\x00{example_id}\x00{rollout}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class EndpointGone(Exception):
    """The endpoint stopped accepting connections mid-item; finished examples are journalled."""


@dataclass
class LoopStats:
    """Counters of one evaluation loop (what this process did, not what the journal holds)."""

    requested: int = 0
    errors: int = 0
    retries: int = 0
    retry_reasons: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0

    def count_retries(self, attempts: int, reasons: Sequence[str]) -> None:
        """Add one request's retries, grouped by reason (``"timeout after 30 s"`` → ``timeout``)."""
        self.retries += max(0, attempts - 1)
        for reason in reasons:
            key = reason.split(" after ")[0]
            self.retry_reasons[key] = self.retry_reasons.get(key, 0) + 1


class SampleOrder(Protocol):
    """``--mb-stop-early``: the seeded order the stop rule reads, and how far it has read."""

    def position(self, example_id: str, rollout: int) -> int:
        """The unit's index in the ordered unit list (example index × rollouts + rollout)."""
        ...

    def frontier(self) -> int:
        """Units of the order up to the end of the first example the rule still waits for
        (journalled ones included); every unit once the rule reads no more."""
        ...


@dataclass(frozen=True)
class LoopSettings:
    api: str  # "chat" | "completions"
    model: str
    sampling_args: Mapping[str, Any]
    seed: int
    max_concurrent: int
    send_seed: bool = True


def work_units(
    examples: Iterable[Example], rollouts: int, done: AbstractSet[tuple[str, int]]
) -> Iterator[tuple[Example, int]]:
    """Every (example, rollout) whose journal line is missing or was an error."""
    for example in examples:
        for rollout in range(rollouts):
            if (example.id, rollout) not in done:
                yield example, rollout


def _payload(settings: LoopSettings, example: Example, rollout: int) -> tuple[str, dict[str, Any]]:
    payload: dict[str, Any] = {"model": settings.model, **settings.sampling_args}
    if settings.send_seed and "seed" not in settings.sampling_args:
        payload["seed"] = request_seed(settings.seed, example.id, rollout)
    if settings.api == "chat":
        payload["messages"] = [dict(m) for m in example.messages]
        return "/chat/completions", payload
    payload["prompt"] = example.prompt or example.last_user_text
    return "/completions", payload


def _prompt_text(example: Example) -> str:
    return example.last_user_text if example.messages else example.prompt


async def run_loop(
    suite: Suite,
    units: Iterator[tuple[Example, int]],
    client: OpenAIClient,
    sink: RowSink,
    settings: LoopSettings,
    progress: ProgressSink,
    *,
    order: SampleOrder | None = None,
) -> LoopStats:
    """Evaluate every unit; returns this loop's counters. Journal rows are the source of truth.

    With ``order`` (``--mb-stop-early``: the units' order the stop rule reads), the item may
    stop: the sink is asked after each row whether it is ``stopped()`` (the verdict is
    certain); once it is, no unit is started any more and the requests in flight are
    cancelled (their rows are never written). A unit is sent only within :func:`send_ahead`
    units of ``order.frontier()``: one slow reply early in the order pauses sending, instead
    of the rest of the item going out while the rule waits."""
    stats = LoopStats()
    stop = asyncio.Event()

    def journalled(row: dict[str, Any]) -> None:
        sink.append(row)
        if order is not None and sink.stopped():
            stop.set()

    started = time.perf_counter()
    scorer, units = off_loop_scorer(suite, units)

    async def score(example: Example, text: str) -> tuple[dict[str, float], Any, Mapping[str, Any]]:
        result = await scorer(example, text)
        return dict(result.metrics), result.extracted, result.detail

    async def one(example: Example, rollout: int) -> None:
        path, payload = _payload(settings, example, rollout)
        row: dict[str, Any] = {
            "v": JOURNAL_ROW_VERSION,
            "example_id": example.id,
            "rollout": rollout,
            "prompt": _prompt_text(example),
            "gold": example.gold,
        }
        stats.requested += 1
        try:
            completion = await client.request(path, payload)
        except RequestFailed as exc:
            stats.errors += 1
            stats.count_retries(exc.attempts, exc.retry_reasons)
            row.update(
                completion=None, error=exc.reason, attempts=exc.attempts, metrics={}, score=None
            )
            journalled(row)
            progress.advance(error=True)
            return
        stats.count_retries(completion.attempts, completion.retry_reasons)
        stats.prompt_tokens += completion.prompt_tokens or 0
        stats.completion_tokens += completion.completion_tokens or 0
        try:
            metrics, extracted, detail = await score(example, completion.text)
        except Exception as exc:  # a scorer bug must not kill the item; record it
            metrics, extracted, detail = {}, None, {}
            row["error"] = f"scorer raised {type(exc).__name__}: {exc}"
            stats.errors += 1
        _complete_row(row, completion, metrics, extracted, detail, suite.primary_metric)
        journalled(row)
        progress.advance(
            error=row["error"] is not None,
            prompt_tokens=completion.prompt_tokens or 0,
            completion_tokens=completion.completion_tokens or 0,
        )

    def capacity() -> int:
        """``max_concurrent`` requests in flight, and as many again per replica that joins
        (a configured list of URLs shares one ``max_concurrent``)."""
        return max(1, settings.max_concurrent) * (1 + client.urls.replicas)

    def stopped() -> bool:
        return client.dead is not None or stop.is_set()

    try:
        if order is None:
            await run_lanes(units, one, capacity, stopped)
        else:
            sent = in_window(one, order, capacity, stopped)
            await _until_stopped(run_lanes(units, sent, capacity, stopped), stop)
    finally:
        stats.wall_s = time.perf_counter() - started
    if client.dead is not None:
        raise EndpointGone(client.dead)
    return stats


def send_ahead(capacity: int) -> int:
    """``--mb-stop-early``: how many units past the rule's frontier may be sent."""
    return max(SEND_AHEAD_MIN, SEND_AHEAD_PER_LANE * capacity)


def in_window(
    one: Callable[[Example, int], Awaitable[None]],
    order: SampleOrder,
    capacity: Callable[[], int],
    stopped: Callable[[], bool],
) -> Callable[[Example, int], Awaitable[None]]:
    """``one``, run once the unit is within :func:`send_ahead` of ``order.frontier()`` (or not
    at all once ``stopped()``). A lane waiting here holds no request; some unit before the
    frontier is always in flight, and its reply, moving the frontier, wakes the lanes."""
    moved = asyncio.Condition()
    seen = order.frontier()

    def inside(position: int) -> bool:
        return stopped() or position < order.frontier() + send_ahead(capacity())

    async def sent(example: Example, rollout: int) -> None:
        nonlocal seen
        position = order.position(example.id, rollout)
        if not inside(position):
            async with moved:
                await moved.wait_for(lambda: inside(position))
            if stopped():
                return
        await one(example, rollout)
        if order.frontier() != seen or stopped():
            seen = order.frontier()
            async with moved:
                moved.notify_all()

    return sent


async def _until_stopped(lanes: Awaitable[None], stop: asyncio.Event) -> None:
    """Await ``lanes``, or cancel them (and the requests in flight) once ``stop`` is set."""
    running = asyncio.ensure_future(lanes)
    waiting = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        if not running.done():
            running.cancel()
        try:
            await running  # a lane's own error still ends the loop
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and getattr(task, "cancelling", lambda: 0)():
                raise  # this loop itself is being cancelled (Ctrl-C): not the stop's cancel


async def run_lanes(
    units: Iterator[tuple[Example, int]],
    one: Callable[[Example, int], Awaitable[None]],
    capacity: Callable[[], int],
    stopped: Callable[[], bool],
) -> None:
    """Run ``one`` on every unit with ``capacity()`` lanes, followed as it changes: lanes are
    added within ``GROW_EVERY_S`` when it grows, and lanes over it end after their current
    unit when it shrinks. ``stopped()``: take no more units (the endpoint is gone).

    A lane is started with the unit it runs first, so there are never more lanes than units
    left: a ``max_concurrent`` far above an item's examples costs nothing."""
    lanes: set[asyncio.Task[None]] = set()
    running = 0  # lanes still taking units
    exhausted = False

    async def lane(unit: tuple[Example, int]) -> None:
        nonlocal running, exhausted
        try:
            while True:
                await one(*unit)
                if stopped() or running > capacity():
                    return
                following = next(units, None)  # shared iterator: each unit is taken once
                if following is None:
                    exhausted = True
                    return
                unit = following
        finally:
            running -= 1

    def grow() -> None:
        nonlocal running, exhausted
        while not exhausted and not stopped() and running < capacity():
            unit = next(units, None)
            if unit is None:
                exhausted = True
                return
            running += 1
            lanes.add(asyncio.create_task(lane(unit)))

    grow()
    try:
        while lanes:
            done, _ = await asyncio.wait(lanes, timeout=GROW_EVERY_S)
            for task in done:
                lanes.discard(task)
                task.result()  # a lane's error ends the loop, as it always did
            grow()
    finally:
        for task in lanes:
            task.cancel()


def _complete_row(
    row: dict[str, Any],
    completion: Completion,
    metrics: dict[str, float],
    extracted: Any,
    detail: Mapping[str, Any],
    primary_metric: str,
) -> None:
    """Fill an answered example's journal row (``row`` already has its id, prompt and gold);
    the thinking and its token count only when the server sent them."""
    row.update(
        completion=completion.text,
        finish_reason=completion.finish_reason,
        extracted=extracted,
        metrics=metrics,
        score=metrics.get(primary_metric),
        tokens={"prompt": completion.prompt_tokens, "completion": completion.completion_tokens},
        latency_s=round(completion.latency_s, 4),
        attempts=completion.attempts,
    )
    row.setdefault("error", None)
    if completion.reasoning is not None:
        row["reasoning"] = completion.reasoning
    if completion.reasoning_tokens is not None:
        row["reasoning_tokens"] = completion.reasoning_tokens
    if completion.system_fingerprint is not None:
        row["system_fingerprint"] = completion.system_fingerprint
    if detail:
        row["detail"] = dict(detail)
