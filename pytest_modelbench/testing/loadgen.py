"""A small load generator for OpenAI-compatible endpoints (the simulated server or a real one).

``python -m pytest_modelbench.testing.loadgen URL --requests 4000 --concurrency 512``
sends chat requests with distinct prompts, ``concurrency`` at a time, and prints
wall time, throughput and latency percentiles as one JSON line. With
``--serve "--slots 512 --latency 0.05"`` it measures the simulator itself, run
in its own process, against the ideal ``requests × latency / slots``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from pytest_modelbench.testing.process import SimProcess, SimProcessError


@dataclass(frozen=True)
class LoadResult:
    """What a load run measured: wall seconds, outcomes, per-request latency percentiles."""

    requests: int
    concurrency: int
    wall_s: float
    outcomes: dict[str, int] = field(default_factory=dict)
    p50_s: float = 0.0
    p99_s: float = 0.0

    @property
    def throughput(self) -> float:
        """Requests per second over the whole run."""
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        """A JSON-serialisable dict (with throughput)."""
        return {**asdict(self), "throughput": round(self.throughput, 1)}


async def run_load(
    base_url: str,
    requests: int,
    concurrency: int,
    *,
    model: str = "sim-model",
    timeout: float = 60.0,
    prefix: str = "question",
) -> LoadResult:
    """Send ``requests`` chat requests, ``concurrency`` in flight at all times."""
    url = base_url.rstrip("/") + "/chat/completions"
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    queue = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    client_timeout = aiohttp.ClientTimeout(total=timeout)

    async def worker(session: aiohttp.ClientSession) -> None:
        for index in queue:
            body = {"model": model, "messages": [{"role": "user", "content": f"{prefix} {index}"}]}
            started = time.perf_counter()
            try:
                async with session.post(url, json=body) as response:
                    await response.read()
                    outcomes[str(response.status)] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcomes[type(exc).__name__] += 1
            latencies.append(time.perf_counter() - started)

    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    latencies.sort()
    return LoadResult(
        requests=requests,
        concurrency=concurrency,
        wall_s=wall,
        outcomes=dict(outcomes),
        p50_s=latencies[len(latencies) // 2] if latencies else 0.0,
        p99_s=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0,
    )


def _cpu_seconds(pid: int) -> float | None:
    """User+system CPU seconds of a process (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spawn_server(flags: str) -> tuple[SimProcess, float | None]:
    """Start the simulator CLI with ``flags``; return it and the ideal seconds per request."""
    # lazily: only with --serve
    from pytest_modelbench.testing.cli import build_parser

    args = build_parser().parse_args(shlex.split(flags))
    try:
        server = SimProcess(shlex.split(flags))
    except SimProcessError as exc:
        raise SystemExit(str(exc)) from None
    per_request = args.latency / args.slots if args.latency_dist == "fixed" else None
    return server, per_request


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the load ``--repeat`` times, one JSON line per run.

    With ``--serve "FLAGS"`` it first starts the simulator in its own process
    with those flags and adds ``ideal_s`` (requests × latency / slots), ``ratio``
    (wall / ideal) and ``server_cpu_us`` (server CPU per request) to each line.
    """
    parser = argparse.ArgumentParser(prog="python -m pytest_modelbench.testing.loadgen")
    parser.add_argument("base_url", nargs="?", help="OpenAI base URL (omit with --serve)")
    parser.add_argument("--serve", metavar="FLAGS", help='start the simulator: "--slots 512 ..."')
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--model", default="sim-model")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--warmup", type=int, default=0, help="requests sent first, not measured")
    parser.add_argument("--repeat", type=int, default=1, help="measured runs")
    args = parser.parse_args(argv)
    if (args.base_url is None) == (args.serve is None):
        parser.error("give either a base URL or --serve FLAGS")
    server: SimProcess | None = None
    per_request: float | None = None
    url = args.base_url
    if args.serve is not None:
        server, per_request = _spawn_server(args.serve)
        url = server.base_url

    async def go() -> None:
        if args.warmup:
            await run_load(url, args.warmup, args.concurrency, model=args.model, prefix="warmup")
        for _ in range(args.repeat):
            cpu_before = _cpu_seconds(server.pid) if server else None
            result = await run_load(
                url, args.requests, args.concurrency, model=args.model, timeout=args.timeout
            )
            line = result.to_json()
            if per_request is not None:
                ideal = args.requests * per_request
                line["ideal_s"] = round(ideal, 4)
                line["ratio"] = round(result.wall_s / ideal, 3) if ideal else None
            cpu_after = _cpu_seconds(server.pid) if server else None
            if cpu_before is not None and cpu_after is not None:
                line["server_cpu_us"] = round((cpu_after - cpu_before) / args.requests * 1e6, 1)
            print(json.dumps(line), flush=True)

    try:
        asyncio.run(go())
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
