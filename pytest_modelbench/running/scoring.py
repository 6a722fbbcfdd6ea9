"""Scoring off the event loop: heavy scorers run in a pool of worker processes.

A suite that sets ``score_in_process`` (math500: math-verify's symbolic comparison) is scored
in worker processes. Each call runs in a worker's main thread, where math-verify's time limits
(``SIGALRM``) hold, and the item's event loop keeps sending requests and reading replies in the
meantime; a slow comparison no longer stalls every response in flight. A suite's
``quick_score`` answers the cheap cases (math500: the reference answer verbatim, or two plain
integers) on the loop, so only the rest cross to a worker. Scorers that only wait
(the code suites, which wait on their sandbox) keep using threads.

Workers are started with ``spawn`` (never ``fork`` from a process that runs threads), look the
suite up by its registry name and keep it, so its data loads once per worker. The pool is one
per process, started on first use and warmed up when an item that needs it begins, so the
import of math-verify and sympy overlaps the first requests; it is shut down at exit.
``$MODELBENCH_SCORING_WORKERS`` sets its size (default: the CPU count, at most 4).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_modelbench.suites.contract import Example, Score, Suite

__all__ = [
    "WORKERS_ENV",
    "in_process_pool",
    "off_loop_scorer",
    "score_in_pool",
    "warm_up",
    "workers",
]

WORKERS_ENV = "MODELBENCH_SCORING_WORKERS"
MAX_DEFAULT_WORKERS = 4

_pool: ProcessPoolExecutor | None = None
_lock = threading.Lock()
_suites: dict[str, Suite] = {}  # in a worker: suites by name, loaded once
_warmed: set[str] = set()  # in the parent: suites whose workers were told to load them


def workers() -> int:
    """The pool's size: ``$MODELBENCH_SCORING_WORKERS``, else the CPU count (at most 4)."""
    value = os.environ.get(WORKERS_ENV, "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, min(MAX_DEFAULT_WORKERS, os.cpu_count() or 1))


def in_process_pool(suite: Suite) -> bool:
    """True when ``suite`` is scored in the pool: it asks for it and a worker can load it."""
    if not getattr(suite, "score_in_process", False):
        return False
    # lazily: the registry loads suite modules (pytest start-up)
    from pytest_modelbench.suites import BUILTIN_SUITES

    return BUILTIN_SUITES.get(suite.name) is type(suite)


def _executor() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(
                max_workers=workers(), mp_context=multiprocessing.get_context("spawn")
            )
            atexit.register(_shutdown)
        return _pool


def _shutdown() -> None:
    global _pool
    with _lock:
        pool, _pool = _pool, None
        _warmed.clear()
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_suite(name: str) -> Suite:
    suite = _suites.get(name)
    if suite is None:
        # lazily: only pool workers load suites by name
        from pytest_modelbench.suites import load_suite

        suite = _suites[name] = load_suite(name)
    return suite


def _score(name: str, example: Example, completion: str) -> Score:
    return _worker_suite(name).score(example, completion)


def _warm(name: str, example: Example) -> None:
    """Load the suite and its scorer's imports (a throw-away score of an empty reply)."""
    _worker_suite(name).score(example, "")


def warm_up(suite: Suite, example: Example) -> list[Future[None]]:
    """Start the pool and load ``suite`` in every worker, without waiting; once per suite and
    process (nothing to wait for later)."""
    pool = _executor()
    with _lock:
        if suite.name in _warmed:
            return []
        _warmed.add(suite.name)
    return [pool.submit(_warm, suite.name, example) for _ in range(workers())]


async def score_in_pool(suite: Suite, example: Example, completion: str) -> Score:
    """``suite.score(example, completion)`` in a worker process; the event loop stays free.
    A pool whose worker died (killed, out of memory) is replaced, and the reply scored again
    once in the new one."""
    loop = asyncio.get_running_loop()
    pool = _executor()
    try:
        return await loop.run_in_executor(pool, _score, suite.name, example, completion)
    except BrokenProcessPool:
        _discard(pool)
        return await loop.run_in_executor(_executor(), _score, suite.name, example, completion)


def _discard(pool: ProcessPoolExecutor) -> None:
    """Forget a broken pool: the next call starts a new one (whose workers load suites anew)."""
    global _pool
    with _lock:
        if _pool is pool:
            _pool = None
            _warmed.clear()
    pool.shutdown(wait=False, cancel_futures=True)


ScoreCall = Callable[["Example", str], Awaitable["Score"]]
Units = Iterator[tuple["Example", int]]


def off_loop_scorer(suite: Suite, units: Units) -> tuple[ScoreCall, Units]:
    """How the runner calls ``suite.score`` without blocking its loop, and the work units
    (unchanged). A pool suite's workers are warmed up on the first unit's example."""
    if in_process_pool(suite):
        first = next(units, None)
        if first is not None:
            warm_up(suite, first[0])  # workers import the scorer while the first requests run
            units = itertools.chain([first], units)

        quick: Callable[[Example, str], Score | None] | None = getattr(suite, "quick_score", None)

        async def pooled(example: Example, text: str) -> Score:
            score = quick(example, text) if quick is not None else None
            return score if score is not None else await score_in_pool(suite, example, text)

        return pooled, units
    if suite.blocking_score:

        def threaded(example: Example, text: str) -> Awaitable[Score]:
            return asyncio.to_thread(suite.score, example, text)

        return threaded, units

    async def inline(example: Example, text: str) -> Score:
        return suite.score(example, text)

    return inline, units
