"""What the mutual-TLS front (``serving/tls_front.py``) adds to a request.

The simulated server runs in its own process (64 slots, no latency of its own), the front in
another (as in a worker: its own thread and event loop), and this process sends the same chat
completions to both, ``--concurrency`` at a time, with the session's client certificate and
key to the front and nothing to the simulator. Rounds alternate (direct, front, direct, front
...) so that a change in the machine's load falls on both. Prints the median and p95 latency
of each path and their difference::

    python perf/tls_front_latency.py --requests 1000 --concurrency 64 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import _harness

from pytest_modelbench.serving.tls import SessionTls, session_tls

KEY = "k" * 32
BODY = json.dumps(
    {"model": _harness.MODEL, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 8}
).encode()


def serve_front(upstream: str) -> None:
    """``--serve-front``: the front before ``upstream``, its TLS material read from stdin; prints
    its port and serves until stdin closes."""
    from pytest_modelbench.serving.tls_front import TlsFront

    tls = SessionTls.of(json.loads(sys.stdin.readline()))
    front = TlsFront(upstream, tls, KEY, host="127.0.0.1")
    front.start()
    print(front.port, flush=True)
    sys.stdin.read()
    front.stop()


async def load(
    url: str, headers: dict[str, str], context: object, n: int, at_once: int
) -> list[float]:
    import aiohttp

    seconds: list[float] = []
    gate = asyncio.Semaphore(at_once)
    connector = aiohttp.TCPConnector(limit=at_once, ssl=context if context is not None else False)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:

        async def one() -> None:
            async with gate:
                began = time.perf_counter()
                async with session.post(url, data=BODY, headers=headers) as answer:
                    await answer.read()
                    assert answer.status == 200, answer.status
                seconds.append(time.perf_counter() - began)

        await asyncio.gather(*(one() for _ in range(at_once)))  # connections opened, warm
        seconds.clear()
        await asyncio.gather(*(one() for _ in range(n)))
    return seconds


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-front", metavar="UPSTREAM", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_front:
        serve_front(args.serve_front)
        return
    worker = session_tls()[1]
    with _harness.Sim(slots=args.concurrency, latency=0.0, quiet=True) as sim:
        root = sim.base_url.removesuffix("/v1")
        front = subprocess.Popen(
            [sys.executable, __file__, "--serve-front", root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert front.stdin is not None and front.stdout is not None
        front.stdin.write(json.dumps(worker.fields()) + "\n")
        front.stdin.flush()
        port = int(front.stdout.readline())
        paths = {
            "direct": (f"{root}/v1/chat/completions", {}, None),
            "front": (
                f"https://127.0.0.1:{port}/v1/chat/completions",
                {"Authorization": f"Bearer {KEY}"},
                worker.client_context(),
            ),
        }
        seconds: dict[str, list[float]] = {name: [] for name in paths}
        walls: dict[str, float] = {name: 0.0 for name in paths}
        try:
            for _ in range(args.rounds):
                for name, (url, headers, context) in paths.items():
                    began = time.perf_counter()
                    seconds[name] += asyncio.run(
                        load(url, headers, context, args.requests, args.concurrency)
                    )
                    walls[name] += time.perf_counter() - began
        finally:
            front.stdin.close()
            front.wait(timeout=30)
    print(
        f"{args.requests} requests x {args.rounds} rounds, {args.concurrency} at once; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for name, values in seconds.items():
        rate = len(values) / walls[name]
        print(
            f"{name:>6}: median {statistics.median(values) * 1e3:.2f} ms, "
            f"p95 {p95(values) * 1e3:.2f} ms, {rate:.0f} requests/s"
        )
    median = statistics.median(seconds["front"]) - statistics.median(seconds["direct"])
    tail = p95(seconds["front"]) - p95(seconds["direct"])
    print(f" added: median {median * 1e3:+.2f} ms, p95 {tail * 1e3:+.2f} ms")


if __name__ == "__main__":
    main()
