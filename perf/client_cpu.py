"""Client CPU per request: the endpoint pool vs aiohttp used bare, with and without ``trust_env``.

The simulator runs in its own process (``--slots 64 --latency 0.02``), so the CPU measured
(``getrusage`` of this process, its threads included) is the client's alone. Each variant
sends the same chat request ``--requests`` times from 64 coroutines, one request after
another in each, after a warm-up; the best of ``--repeat`` runs counts (least disturbed by
other load), the median is shown beside it.

* **pool**: ``OpenAIClient.request`` (routing, retries, reading the completion);
* **aiohttp**: one ``ClientSession`` (``trust_env=False``) and ``json.loads`` of the body;
* **aiohttp trust_env**: the same with ``trust_env=True``, which looks proxies and
  ``~/.netrc`` up in a worker thread for every request (why the pool reads them once per
  base URL instead).

    python perf/client_cpu.py [--requests 3200] [--repeat 5] [--variants pool,aiohttp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pytest_modelbench.testing.process import SimProcess

CONCURRENCY = 64
PAYLOAD = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "q: what is 1 + 1?"}],
    "max_tokens": 16,
}
VARIANTS = ("pool", "aiohttp", "aiohttp-trust-env")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _drive(one: Callable[[], Awaitable[Any]], requests: int) -> tuple[float, float, int]:
    """(wall s, CPU s, requests) of ``requests`` calls of ``one`` from 64 coroutines."""
    per_worker = requests // CONCURRENCY

    async def worker(n: int) -> None:
        for _ in range(n):
            await one()

    await worker(5)  # warm: connections open, code paths taken
    started, cpu = time.perf_counter(), _cpu_s()
    await asyncio.gather(*(worker(per_worker) for _ in range(CONCURRENCY)))
    return time.perf_counter() - started, _cpu_s() - cpu, per_worker * CONCURRENCY


async def _pool(base_url: str, requests: int) -> tuple[float, float, int]:
    from pytest_modelbench.running.client import OpenAIClient

    async with OpenAIClient([base_url]) as client:
        return await _drive(lambda: client.request("/chat/completions", PAYLOAD), requests)


async def _aiohttp(base_url: str, requests: int, *, trust_env: bool) -> tuple[float, float, int]:
    import aiohttp

    body = json.dumps(PAYLOAD).encode()
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), trust_env=trust_env, headers=headers
    ) as session:

        async def one() -> None:
            async with session.post(f"{base_url}/chat/completions", data=body) as response:
                json.loads(await response.read())["choices"][0]

        return await _drive(one, requests)


def measure(variant: str, base_url: str, requests: int) -> tuple[float, float, int]:
    if variant == "pool":
        return asyncio.run(_pool(base_url, requests))
    return asyncio.run(_aiohttp(base_url, requests, trust_env=variant == "aiohttp-trust-env"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    flags = ["--slots", "64", "--latency", "0.02", "--latency-dist", "fixed"]
    with SimProcess([*flags, "--models", "sim-model"]) as server:
        runs: dict[str, list[tuple[float, float, int]]] = {v: [] for v in variants}
        for _ in range(args.repeat):  # interleaved, so load changes hit every variant alike
            for variant in variants:
                runs[variant].append(measure(variant, server.base_url, args.requests))
    print(f"# client CPU per request, {args.requests} requests x {args.repeat} runs, 64 at once")
    print("| variant | CPU µs / request (best) | (median) | req/s (best run) |")
    print("|---|---:|---:|---:|")
    for variant, done in runs.items():
        per_request = [1e6 * cpu / n for _, cpu, n in done]
        best = min(range(len(done)), key=per_request.__getitem__)
        wall, _, n = done[best]
        print(
            f"| {variant} | {per_request[best]:.0f} | {statistics.median(per_request):.0f} "
            f"| {n / wall:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
