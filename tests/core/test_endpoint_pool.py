"""The endpoint pool over several URLs: least-busy routing, a refused URL rests while the
others serve, ``Retry-After`` moves requests to another URL, replicas join and leave while
requests run, and the whole set refusing is one dead-endpoint error naming every URL."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from pytest_modelbench.running.client import Completion, OpenAIClient, RequestFailed, RetryPolicy
from pytest_modelbench.running.urls import UrlSet
from tests.core.test_client_transport import CHAT, RawServer, Seen, chat, client, echo, http


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A URL whose port is bound but not listening: every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


async def slow_echo(seen: Seen) -> bytes:
    await asyncio.sleep(0.01)
    return echo(seen)


def test_a_refused_url_rests_and_the_other_serves_without_spending_attempts(
    refused_url: str,
) -> None:
    async def go() -> tuple[list[Completion], RawServer]:
        async with RawServer(slow_echo) as up, client(refused_url, up.url(), retries=0) as c:
            first = await asyncio.gather(*(c.request(CHAT, chat(f"a{i}")) for i in range(10)))
            later = [await c.request(CHAT, chat(f"b{i}")) for i in range(10)]
            return [*first, *later], up

    done, up = asyncio.run(go())
    assert [c.text for c in done] == [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
    assert all((c.attempts, c.retry_reasons) == (1, []) for c in done)  # max_retries 0 holds
    assert len(up.requests) == 20


def test_retry_after_sends_the_retry_to_another_url_at_once() -> None:
    def busy(_seen: Seen) -> bytes:
        return http(b'{"error": "busy"}', 429, headers=[("Retry-After", "30")])

    async def go() -> tuple[list[Completion], RawServer, RawServer, float]:
        async with (
            RawServer(busy) as tired,
            RawServer(echo) as fresh,
            client(tired.url(), fresh.url(), retries=2) as c,
        ):
            started = time.monotonic()
            done = [await c.request(CHAT, chat(f"q{i}")) for i in range(6)]
            return done, tired, fresh, time.monotonic() - started

    done, tired, fresh, took = asyncio.run(go())
    assert [c.text for c in done] == [f"q{i}" for i in range(6)]
    assert took < 10  # nobody waited the 30 s the busy URL asked for
    assert len(tired.requests) == 1  # it rests for its Retry-After; the others went elsewhere
    assert done[0].retry_reasons == ["HTTP 429"] and len(fresh.requests) == 6


def test_a_replica_that_joins_mid_run_takes_requests_and_one_that_leaves_stops() -> None:
    async def go() -> tuple[RawServer, RawServer, int, int]:
        async with RawServer(slow_echo) as one, RawServer(slow_echo) as two:
            urls = UrlSet([one.url()])
            async with client(urls) as c:

                async def worker(n: int) -> None:  # as the runner does: one after another
                    for i in range(10):
                        assert (await c.request(CHAT, chat(f"w{n}-{i}"))).text == f"w{n}-{i}"

                running = asyncio.gather(*(worker(n) for n in range(4)))
                while len(one.requests) < 8:
                    await asyncio.sleep(0.001)
                urls.add(two.url())  # a replica joins while the requests run
                await running
                joined = len(two.requests)
                assert urls.remove(one.url())  # and the first one leaves
                before = len(one.requests)
                await asyncio.gather(*(c.request(CHAT, chat(f"x{i}")) for i in range(10)))
                return one, two, joined, before

    one, two, joined, before = asyncio.run(go())
    assert joined >= 10  # the joiner took a fair share of the 32 requests still to go
    assert len(one.requests) == before  # nothing more went to the one that left
    assert len(two.requests) == joined + 10


def test_every_url_refusing_is_one_dead_endpoint_error_naming_them() -> None:
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        urls = [f"http://127.0.0.1:{s.getsockname()[1]}/v1" for s in (a, b)]

        async def go() -> tuple[list[BaseException | Completion], str | None]:
            patient = RetryPolicy(max_retries=1000, backoff_s=0.05, max_backoff_s=0.1)
            async with OpenAIClient(urls, retry=patient) as c:
                done = await asyncio.gather(
                    *(c.request(CHAT, chat(f"q{i}")) for i in range(4)), return_exceptions=True
                )
                return done, c.dead

        started = time.monotonic()
        done, dead = asyncio.run(go())
    assert time.monotonic() - started < 30  # not 4 × 1000 retries with backoff
    assert all(isinstance(d, RequestFailed) for d in done)
    assert dead is not None
    assert dead.startswith(f"endpoints {urls[0]}, {urls[1]} are not accepting connections")
    assert "ConnectionRefusedError" in dead and "failed connection attempts in a row" in dead
