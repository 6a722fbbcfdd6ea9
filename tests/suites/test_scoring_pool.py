"""Heavy scorers run in worker processes, in their main threads, and score as they would inline."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

from pytest_modelbench.running import scoring
from pytest_modelbench.suites import load_suite
from pytest_modelbench.suites.math500 import (
    _INTEGER,
    MATH500,
    TIMEOUT_SECONDS,
    _timeout,
    equivalent,
    parse_answer,
    parse_gold,
)


def test_only_suites_asking_for_it_and_loadable_by_name_use_the_pool() -> None:
    class Custom(MATH500):  # not in the registry: a worker could not load it by name
        pass

    assert scoring.in_process_pool(load_suite("math500"))
    assert not scoring.in_process_pool(load_suite("gsm8k"))
    assert not scoring.in_process_pool(load_suite("humaneval"))  # waits: a thread is enough
    assert not scoring.in_process_pool(Custom())


def test_pool_scores_equal_inline_scores() -> None:
    suite = load_suite("math500")
    examples = list(suite.examples({}, 0))[:12]
    replies = [
        suite.reference_completion(e) if i % 3 else suite.wrong_completion(e)
        for i, e in enumerate(examples)
    ]

    async def pooled() -> list[tuple[dict[str, float], object]]:
        scorer, _ = scoring.off_loop_scorer(suite, iter([(examples[0], 0)]))
        scores = await asyncio.gather(
            *(scorer(e, r) for e, r in zip(examples, replies, strict=True))
        )
        return [(dict(s.metrics), s.extracted) for s in scores]

    inline = [suite.score(e, r) for e, r in zip(examples, replies, strict=True)]
    assert asyncio.run(pooled()) == [(dict(s.metrics), s.extracted) for s in inline]
    assert sum(s.metrics["accuracy"] for s in inline) == 8  # a mix, so equality means something


def test_workers_score_in_their_main_thread_where_timeouts_hold() -> None:
    """math-verify's limits use SIGALRM: on in a worker (main thread), off in a thread here."""
    assert scoring._executor().submit(_timeout).result(timeout=120) == TIMEOUT_SECONDS
    seen: list[int | None] = []
    worker = threading.Thread(target=lambda: seen.append(_timeout()))
    worker.start()
    worker.join()
    assert seen == [None]
    assert scoring._executor().submit(os.getpid).result(timeout=60) != os.getpid()


@pytest.mark.parametrize(("value", "expected"), [("3", 3), ("0", None), ("x", None), ("", None)])
def test_pool_size_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: int | None
) -> None:
    monkeypatch.setenv(scoring.WORKERS_ENV, value)
    default = max(1, min(scoring.MAX_DEFAULT_WORKERS, os.cpu_count() or 1))
    assert scoring.workers() == (expected if expected is not None else default)


def test_verbatim_reference_answers_are_scored_on_the_loop_and_the_rest_in_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    suite = load_suite("math500")
    example = next(e for e in suite.examples({}, 0) if e.gold == "\\frac{14}{3}")
    sent: list[str] = []

    async def pool(_suite: object, _example: object, text: str) -> object:
        sent.append(text)
        return suite.score(example, text)

    monkeypatch.setattr(scoring, "score_in_pool", pool)
    verbatim = "Adding them up, the total is $\\boxed{\\frac{14}{3}}$."
    respelled = "Adding them up, the total is $\\boxed{\\frac{28}{6}}$."
    thought = "<think>maybe $\\boxed{\\frac{14}{3}}$</think> The total is $\\boxed{5}$."

    async def scores() -> list[float]:
        scorer, _ = scoring.off_loop_scorer(suite, iter([]))
        return [
            (await scorer(example, text)).metrics["accuracy"]
            for text in (verbatim, respelled, thought)
        ]

    assert asyncio.run(scores()) == [1.0, 1.0, 0.0]
    assert sent == [respelled, thought]  # only what needs math-verify crosses to a worker
    assert isinstance(suite, MATH500)
    quick = suite.quick_score(example, verbatim)
    assert quick is not None
    assert quick.extracted == "\\frac{14}{3}"
    assert equivalent(parse_gold(str(example.gold)), parse_answer(verbatim))  # math-verify agrees


@pytest.mark.parametrize(("reply", "right"), [("042", True), ("41", False), ("-42", False)])
def test_plain_integers_are_compared_without_math_verify_and_as_it_would(
    reply: str, right: bool
) -> None:
    suite = load_suite("math500")
    assert isinstance(suite, MATH500)
    example = next(e for e in suite.examples({}, 0) if e.gold == "42")
    text = f"So the answer is $\\boxed{{{reply}}}$."
    quick = suite.quick_score(example, text)
    assert quick is not None
    assert quick.metrics == {"accuracy": float(right), "boxed": 1.0}
    assert equivalent(parse_gold("42"), parse_answer(text)) is right


def _until_broken(pool: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            pool.submit(int).result(timeout=60)
        except BrokenProcessPool:
            return
        time.sleep(0.05)
    raise AssertionError("the pool never noticed its dead worker")


def test_a_pool_whose_worker_died_is_replaced_and_the_reply_scored() -> None:
    suite = load_suite("math500")
    example = next(e for e in suite.examples({}, 0) if e.gold == "\\frac{14}{3}")
    pool = scoring._executor()
    os.kill(pool.submit(os.getpid).result(timeout=120), signal.SIGKILL)  # killed, say by OOM
    _until_broken(pool)  # the executor notices in its own thread: another worker may answer first
    reply = "So it is $\\boxed{\\frac{28}{6}}$."  # needs math-verify: goes to a worker

    async def score() -> float:
        return (await scoring.score_in_pool(suite, example, reply)).metrics["accuracy"]

    assert asyncio.run(score()) == 1.0
    assert scoring._executor() is not pool


def test_parse_free_verdicts_agree_with_math_verify_on_the_golds() -> None:
    """Every fifth gold answer, written verbatim, and off by one when it is an integer."""
    suite = load_suite("math500")
    assert isinstance(suite, MATH500)
    checked = 0
    for example in list(suite.examples({}, 0))[::5]:
        gold = str(example.gold)
        replies = [gold] + ([str(int(gold) + 1)] if _INTEGER.fullmatch(gold) else [])
        for answer in replies:
            text = f"Therefore the answer is $\\boxed{{{answer}}}$."
            quick = suite.quick_score(example, text)
            assert quick is not None, answer
            verdict = equivalent(parse_gold(gold), parse_answer(text))
            assert quick.metrics["accuracy"] == float(verdict), (gold, answer)
            checked += 1
    assert checked > 150
