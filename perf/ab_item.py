"""Before/after of one item's fixed costs: two commits of modelbench, interleaved, one server.

The throughput table's figures move by ±0.15 s from one run to the next on a small shared
machine, as much as a change to the fixed costs does. This script compares two commits
side by side instead: it checks each out (``git worktree``, in a temporary directory), then
runs the throughput table's modelbench item (``pytest benchmarks/ --model bench`` on a
generated ``jsonl`` variant, 64 slots × 100 ms by default) with each commit's package first
on ``PYTHONPATH``, ``--pairs`` pairs of old and new (old first in every other pair) against
one simulated server.
Both sides import through ``PYTHONPATH`` (which costs start-up time that an installed
package does not), so only the code differs. For each side it prints the median wall time,
start-up (process start to the first request the server saw), span and tail (last answer
to exit), and the new / old ratios of the medians. One run of each side before the pairs
compiles their byte-code and is not counted.

    python perf/ab_item.py --old REV [--new HEAD] [--pairs 8] [--requests 2000]
                           [--slots 64] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from throughput import (  # perf/ scripts import each other from their own directory
    Modelbench,
    Server,
    Setup,
    client_env,
    write_data,
)

PERF = Path(__file__).resolve().parent
SIDES = ("old", "new")


@dataclass(frozen=True)
class Timing:
    wall_s: float
    startup_s: float
    span_s: float
    tail_s: float


def checkout(revision: str, where: Path) -> Path:
    """A detached worktree of ``revision``; its package directory goes on ``PYTHONPATH``."""
    subprocess.run(
        ["git", "-C", str(PERF.parent), "worktree", "add", "--detach", "-f", str(where), revision],
        check=True,
        capture_output=True,
    )
    return where


def run_item(project: Path, package_root: Path, server: Server) -> Timing:
    """One session of the item with ``package_root``'s modelbench; times from the server log."""
    shutil.rmtree(project / "runs-ab", ignore_errors=True)
    env = client_env()
    env["PYTHONPATH"] = str(package_root)
    argv = [sys.executable, "-m", "pytest", "benchmarks/", "--model", "bench", "-q"]
    argv += ["--run-dir", "runs-ab", "-p", "no:hypothesispytest"]
    offset = server.offset()
    started = time.monotonic()
    subprocess.run(argv, cwd=project, env=env, stdout=subprocess.DEVNULL, check=True)
    ended = time.monotonic()
    records = server.since(offset)
    first = min(float(r["start"]) for r in records)
    last = max(float(r["end"]) for r in records)
    return Timing(ended - started, first - started, last - first, ended - last)


def median(timings: Sequence[Timing], field: str) -> float:
    return statistics.median(getattr(t, field) for t in timings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python perf/ab_item.py", description=__doc__)
    parser.add_argument("--old", required=True, help="the commit before the change")
    parser.add_argument("--new", default="HEAD", help="the commit after it")
    parser.add_argument("--pairs", type=int, default=8, help="old/new runs, interleaved")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args(argv)
    setup = Setup(args.slots, args.latency, args.requests)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="mb-ab-") as tmp:
        work = Path(tmp)
        roots = {"old": checkout(args.old, work / "old"), "new": checkout(args.new, work / "new")}
        try:
            data, lookup = write_data(work, args.requests)
            server = Server(setup, lookup, work / "server-log.jsonl")
            try:
                project = work / "project"
                project.mkdir()
                Modelbench().prepare(project, setup, server.base_url, data)
                for side in SIDES:  # byte-code compiled, caches warm: not counted
                    run_item(project, roots[side], server)
                results: dict[str, list[Timing]] = {side: [] for side in SIDES}
                for pair in range(args.pairs):
                    order = SIDES if pair % 2 == 0 else SIDES[::-1]  # ABBA: no side always first
                    for side in order:
                        timing = run_item(project, roots[side], server)
                        results[side].append(timing)
                        print(
                            f"  pair {pair + 1} {side}: wall {timing.wall_s:.2f} s, start-up "
                            f"{timing.startup_s:.2f}, span {timing.span_s:.2f}, "
                            f"tail {timing.tail_s:.3f}",
                            file=sys.stderr,
                            flush=True,
                        )
            finally:
                server.stop()
        finally:
            for root in roots.values():
                subprocess.run(
                    ["git", "-C", str(PERF.parent), "worktree", "remove", "--force", str(root)],
                    check=False,
                    capture_output=True,
                )
    print(
        f"{args.slots} slots × {args.latency * 1000:g} ms, {args.requests} requests; "
        f"{args.pairs} interleaved pairs; load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after\n"
    )
    print("| code | median wall s | median start-up s | median span s | median tail s | tails |")
    print("|---|---:|---:|---:|---:|---|")
    for side in SIDES:
        runs = results[side]
        tails = ", ".join(f"{t.tail_s:.2f}" for t in runs)
        label = f"{side} ({getattr(args, side)})"
        print(
            f"| {label} | {median(runs, 'wall_s'):.2f} | {median(runs, 'startup_s'):.2f} "
            f"| {median(runs, 'span_s'):.2f} | {median(runs, 'tail_s'):.3f} | {tails} |"
        )
    ratios = {
        f: median(results["new"], f) / median(results["old"], f) for f in ("wall_s", "tail_s")
    }
    print(f"\nnew / old: wall {ratios['wall_s']:.3f}×, tail {ratios['tail_s']:.3f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
