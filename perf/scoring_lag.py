"""Event-loop lag and item wall time: math500 scored in worker processes vs on the loop thread.

math500 is scored by math-verify (LaTeX parsing and a symbolic comparison in sympy:
milliseconds of CPU per answer, up to hundreds for some). The runner used to call it on the item's event-loop thread, so every
slow comparison stalled every response in flight; it now sends it to a pool of worker
processes (``running.scoring``). This script measures both behaviours in one run, with gsm8k
(a regex and a number comparison on the loop) as the yardstick, for the same number of
examples N against one simulated server:

* the server is ``python -m pytest_modelbench.testing.simserver`` in its own process (a real
  server does not share the client's GIL): ``--slots`` slots, a fixed ``--latency``, accuracy
  0.7 on a lookup of both suites' prompts built from each suite's ``reference_completion`` /
  ``wrong_completion``, so math500 replies are real LaTeX solutions (or a wrong boxed answer);
* each measurement runs in a fresh Python process (this script again, with ``--child``), which
  loads the suite's first N examples and calls ``runner.run_loop`` directly in a fresh asyncio
  loop (chat API, ``max_concurrent`` = slots, journal in a temporary directory);
* **wall** is the time ``run_loop`` takes. The process is fresh, so for math500 in pool mode it
  includes starting the pool (spawning the workers), the workers' import of math-verify and
  sympy and their first, slowest parses: the first math500 item of a pytest process pays that too, and it is part of what
  a user waits for. Later items of the same process reuse the pool. In loop mode the wall
  includes the import of math-verify and sympy on the loop thread (the first score);
* **lag**: a task on the same loop sleeps 5 ms again and again and records how late it woke
  (actual wake-up − intended, ``loop.time()``); max and p99 over the whole item, in ms. A
  loop that is never blocked wakes within about a millisecond. A blocked loop takes few
  samples (one per stall), so its p99 is close to its max; "late % of wall" (the sum of the
  lags over the wall time) weighs each stall by its length. On a loaded machine the lag also
  counts time the process waited for a core, which gsm8k's rows show;
* **modes**: ``pool`` is the current code from a cold pool; ``warm`` the same with the pool's
  workers started and loaded before the item (as for every later item of a process). ``loop``
  is the behaviour before scoring left the loop: the same code with
  ``running.scoring.in_process_pool`` patched to return False and ``MATH500.quick_score`` to
  return None (``unittest.mock.patch``), so math-verify reads every math500 reply inline on
  the loop thread. gsm8k takes the same path in every mode (it never used the pool): its
  rows show the run-to-run noise.

Each (suite, mode) runs ``--repeat`` times, interleaved; the table shows the run with the
median wall time (and every run's wall). Under it: math500 wall / gsm8k wall per mode, and the
old/new ratio of math500's lag p99, with the targets (pool mode: math500 wall ≤ 1.15× gsm8k's,
lag p99 ≤ 20 ms). The load average before and after is printed: on a small shared machine the
pool's workers, the server and the loop compete for the same cores.

    python perf/scoring_lag.py [--examples 500] [--slots 64] [--latency 0.1] [--repeat 3]
                               [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from _harness import Sim  # perf/ scripts import each other from their own directory

MODEL = "sim-model"
ACCURACY = 0.7
SUITES = ("math500", "gsm8k")
# current code from a cold pool (the first such item of a process); the same with the pool
# already warm (every later item of a process); the old behaviour (scoring on the loop thread)
MODES = ("pool", "warm", "loop")
MONITOR_INTERVAL_S = 0.005
TARGET_WALL_RATIO = 1.15  # pool mode: math500 wall / gsm8k wall
TARGET_LAG_P99_MS = 20.0  # pool mode: math500's event-loop lag p99


@dataclass
class Run:
    """One item: ``run_loop`` over N examples of one suite in one mode, in a fresh process."""

    suite: str
    mode: str
    repetition: int
    examples: int
    wall_s: float
    lag_max_ms: float
    lag_p99_ms: float
    lag_p50_ms: float
    lag_samples: int
    late_s: float  # sum of the lags: time the loop was late to wake (blocked or starved)
    requested: int
    errors: int
    accuracy: float | None
    pool_workers: int | None  # scoring pool size in the child (pool mode, math500), else None
    pool_calls: int  # replies sent to a worker process (the rest were scored on the loop)
    load_before: float
    load_after: float

    @property
    def late_share(self) -> float:
        """Share of the wall time the loop was late (a blocked loop gives few samples, so its
        p99 is its max; this weighs each stall by how long it lasted)."""
        return self.late_s / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def throughput(self) -> float:
        return self.requested / self.wall_s if self.wall_s > 0 else float("nan")


# -- the measured process ---------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by the nearest-rank method; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


@contextlib.contextmanager
def scoring_mode(mode: str) -> Iterator[None]:
    """``pool``/``warm``: the code as it is; ``loop``: the behaviour before scoring left the
    loop: the pool disabled and no parse-free verdicts, so math-verify reads every reply inline."""
    if mode == "loop":
        with (
            mock.patch("pytest_modelbench.running.scoring.in_process_pool", return_value=False),
            mock.patch("pytest_modelbench.suites.math500.MATH500.quick_score", return_value=None),
        ):
            yield
    else:
        yield


async def measure_item(
    suite_name: str, n: int, base_url: str, slots: int, *, warm: bool
) -> dict[str, Any]:
    """Run one item through ``run_loop`` with a lag monitor on the same loop."""
    from pytest_modelbench.running import scoring
    from pytest_modelbench.running.client import OpenAIClient, RetryPolicy
    from pytest_modelbench.running.progress import NullProgress
    from pytest_modelbench.running.runner import LoopSettings, run_loop, work_units
    from pytest_modelbench.store.item_rows import ItemRows
    from pytest_modelbench.store.journal import Journal
    from pytest_modelbench.suites import load_suite
    from pytest_modelbench.suites.selection import select_examples

    suite = load_suite(suite_name)
    examples = select_examples(suite.examples({}, 0), n)
    pooled = scoring.in_process_pool(suite)  # False in loop mode (patched)
    if warm and pooled:  # as after an earlier item of the process: every worker started
        for future in scoring.warm_up(suite, examples[0]):
            future.result(timeout=120)
    settings = LoopSettings(
        api="chat",
        model=MODEL,
        sampling_args={"temperature": 0.0},
        seed=0,
        max_concurrent=slots,
    )
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    sent = 0
    to_pool = scoring.score_in_pool

    async def counted(*args: Any) -> Any:
        nonlocal sent
        sent += 1
        return await to_pool(*args)

    scoring.score_in_pool = counted  # type: ignore[assignment]  # counts what crosses to a worker
    running = True

    async def monitor() -> None:
        while running:
            intended = loop.time() + MONITOR_INTERVAL_S
            await asyncio.sleep(MONITOR_INTERVAL_S)
            lags.append(loop.time() - intended)

    with tempfile.TemporaryDirectory(prefix="mb-scoring-lag-") as tmp:
        journal = Journal(Path(tmp) / "results.jsonl")
        sink = ItemRows.open(journal)
        try:
            async with OpenAIClient([base_url], retry=RetryPolicy(), timeout_s=120.0) as client:
                watcher = asyncio.create_task(monitor())
                await asyncio.sleep(0)  # the monitor is sleeping before the item starts
                started = time.perf_counter()
                stats = await run_loop(
                    suite, work_units(examples, 1, set()), client, sink, settings, NullProgress()
                )
                wall_s = time.perf_counter() - started
                running = False
                await watcher
        finally:
            sink.close()
        rows = list(journal.rows())
    scores = [row["score"] for row in rows if row.get("score") is not None]
    return {
        "examples": len(examples),
        "wall_s": wall_s,
        "lags_ms": [1000 * lag for lag in lags],
        "requested": stats.requested,
        "errors": sum(1 for row in rows if row.get("error")),
        "accuracy": sum(scores) / len(scores) if scores else None,
        "pool_workers": scoring.workers() if pooled else None,
        "pool_calls": sent,
    }


def child_main(suite_name: str, mode: str, n: int, base_url: str, slots: int) -> int:
    """Measure one item in this (fresh) process and print its figures as one JSON line."""
    with scoring_mode(mode):
        result = asyncio.run(measure_item(suite_name, n, base_url, slots, warm=mode == "warm"))
    lags = result.pop("lags_ms")
    result.update(
        lag_max_ms=max(lags, default=float("nan")),
        lag_p99_ms=percentile(lags, 0.99),
        lag_p50_ms=percentile(lags, 0.50),
        lag_samples=len(lags),
        late_s=sum(lags) / 1000,
    )
    print(json.dumps(result), flush=True)
    return 0


# -- the server and the driver ----------------------------------------------------------------


def write_lookup(path: Path, n: int) -> dict[str, int]:
    """Both suites' first ``n`` prompts → (reference solution, wrong answer); examples per suite."""
    from pytest_modelbench.suites import load_suite
    from pytest_modelbench.suites.selection import select_examples
    from pytest_modelbench.testing import lookup_from_examples

    lookup: dict[str, tuple[str, str]] = {}
    counts: dict[str, int] = {}
    for name in SUITES:
        suite = load_suite(name)
        examples = select_examples(suite.examples({}, 0), n)
        counts[name] = len(examples)
        lookup.update(
            lookup_from_examples(examples, suite.reference_completion, suite.wrong_completion)
        )
    path.write_text(json.dumps({key: list(pair) for key, pair in lookup.items()}))
    return counts


def measure_run(suite: str, mode: str, repetition: int, n: int, server: Sim, slots: int) -> Run:
    """One child process: ``run_loop`` over ``n`` examples of ``suite`` in ``mode``."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        suite,
        "--mode",
        mode,
        "--examples",
        str(n),
        "--slots",
        str(slots),
        "--base-url",
        server.base_url,
    ]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    load_after = os.getloadavg()[0]
    if proc.returncode != 0:
        raise SystemExit(
            f"{suite} {mode}: the measuring process exited with {proc.returncode}:\n"
            + proc.stderr[-4000:]
        )
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    run = Run(
        suite=suite,
        mode=mode,
        repetition=repetition,
        load_before=load_before,
        load_after=load_after,
        **figures,
    )
    print(
        f"  {suite:<7} {mode:<4} run {repetition + 1}: wall {run.wall_s:6.3f}s "
        f"lag max {run.lag_max_ms:7.1f} ms p99 {run.lag_p99_ms:6.1f} ms "
        f"accuracy {run.accuracy} errors {run.errors} load {load_before:.2f}",
        file=sys.stderr,
        flush=True,
    )
    return run


# -- reporting ----------------------------------------------------------------------------------


def median_run(runs: Sequence[Run]) -> Run:
    """The run with the median wall time (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r.wall_s)
    return ordered[(len(ordered) - 1) // 2]


def chosen(runs: Sequence[Run]) -> dict[tuple[str, str], Run]:
    return {
        (suite, mode): median_run([r for r in runs if r.suite == suite and r.mode == mode])
        for suite in SUITES
        for mode in MODES
    }


def ratios(best: dict[tuple[str, str], Run]) -> dict[str, float]:
    out = {
        f"wall_math500_over_gsm8k_{mode}": best["math500", mode].wall_s / best["gsm8k", mode].wall_s
        for mode in MODES
    }
    out["lag_p99_math500_loop_over_pool"] = (
        best["math500", "loop"].lag_p99_ms / best["math500", "pool"].lag_p99_ms
    )
    out["lag_max_math500_loop_over_pool"] = (
        best["math500", "loop"].lag_max_ms / best["math500", "pool"].lag_max_ms
    )
    return out


def report(runs: Sequence[Run], args: argparse.Namespace) -> str:
    best = chosen(runs)
    lines = [
        f"{args.slots} slots × {args.latency * 1000:g} ms fixed latency, accuracy {ACCURACY}, "
        f"median of {args.repeat} runs by wall time; lag = how late a 5 ms sleep on the "
        "item's loop woke",
        "",
        "| suite | mode | N | wall s | req/s | lag max ms | lag p99 ms | lag p50 ms "
        "| lag samples | late % of wall | accuracy | errors | replies scored in a worker "
        "| walls of all runs (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (suite, mode), run in best.items():
        walls = ", ".join(f"{r.wall_s:.2f}" for r in runs if r.suite == suite and r.mode == mode)
        accuracy = "" if run.accuracy is None else f"{run.accuracy:.3f}"
        lines.append(
            f"| {suite} | {mode} | {run.examples} | {run.wall_s:.2f} | {run.throughput:.0f} "
            f"| {run.lag_max_ms:.1f} | {run.lag_p99_ms:.1f} | {run.lag_p50_ms:.1f} "
            f"| {run.lag_samples} | {run.late_share:.1%} | {accuracy} | {run.errors} "
            f"| {run.pool_calls} | {walls} |"
        )
    r = ratios(best)
    wall_pool = r["wall_math500_over_gsm8k_pool"]
    lag_pool = best["math500", "pool"].lag_p99_ms
    workers = best["math500", "pool"].pool_workers
    lines += [
        "",
        f"* math500 wall / gsm8k wall, pool (current): **{wall_pool:.2f}×** "
        f"(target ≤ {TARGET_WALL_RATIO:g}×: {'met' if wall_pool <= TARGET_WALL_RATIO else 'MISSED'}"
        f"; {workers} scoring workers, their start-up included)",
        f"* math500 wall / gsm8k wall, pool already warm (every item after a process's first "
        f"math500 item): {r['wall_math500_over_gsm8k_warm']:.2f}×",
        f"* math500 wall / gsm8k wall, loop (old): {r['wall_math500_over_gsm8k_loop']:.2f}×",
        f"* math500 event-loop lag p99, pool: **{lag_pool:.1f} ms** "
        f"(target ≤ {TARGET_LAG_P99_MS:g} ms: {'met' if lag_pool <= TARGET_LAG_P99_MS else 'MISSED'})",
        f"* math500 lag p99 old/new (loop/pool): {r['lag_p99_math500_loop_over_pool']:.1f}×; "
        f"lag max old/new: {r['lag_max_math500_loop_over_pool']:.1f}×",
        f"* ideal wall: ceil(N / slots) rounds of the latency = "
        f"{-(-best['gsm8k', 'pool'].examples // args.slots) * args.latency:.2f} s",
        f"* load average (1 min) before the runs: {min(x.load_before for x in runs):.2f}–"
        f"{max(x.load_before for x in runs):.2f}, after: "
        f"{min(x.load_after for x in runs):.2f}–{max(x.load_after for x in runs):.2f}; "
        f"{os.cpu_count()} CPUs",
    ]
    return "\n".join(lines)


def to_json(runs: Sequence[Run], args: argparse.Namespace) -> dict[str, Any]:
    best = chosen(runs)
    return {
        "schema_version": 1,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "setup": {
            "examples": args.examples,
            "slots": args.slots,
            "latency_s": args.latency,
            "accuracy": ACCURACY,
            "repeat": args.repeat,
            "monitor_interval_s": MONITOR_INTERVAL_S,
        },
        "chosen": {f"{suite}/{mode}": asdict(run) for (suite, mode), run in best.items()},
        "ratios": ratios(best),
        "targets": {
            "wall_math500_over_gsm8k_pool_max": TARGET_WALL_RATIO,
            "lag_p99_ms_pool_max": TARGET_LAG_P99_MS,
        },
        "runs": [asdict(run) for run in runs],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python perf/scoring_lag.py", description=__doc__)
    parser.add_argument("--examples", type=int, default=500, help="examples per suite (N)")
    parser.add_argument("--slots", type=int, default=64, help="server slots = max_concurrent")
    parser.add_argument("--latency", type=float, default=0.1, help="fixed seconds per request")
    parser.add_argument("--repeat", type=int, default=3, help="runs per suite and mode (median)")
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON")
    parser.add_argument("--child", choices=SUITES, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="pool", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.examples < 1 or args.slots < 1 or args.repeat < 1 or not args.latency > 0:
        parser.error("--examples, --slots and --repeat must be ≥ 1 and --latency > 0")
    if args.child:
        return child_main(args.child, args.mode, args.examples, args.base_url, args.slots)
    print(
        f"# scoring lag: Python {platform.python_version()} on {platform.platform()}, "
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="mb-scoring-lag-") as tmp:
        lookup = Path(tmp) / "lookup.json"
        counts = write_lookup(lookup, args.examples)
        if len(set(counts.values())) != 1:
            print(f"  note: examples per suite differ: {counts}", file=sys.stderr)
        server = Sim(
            slots=args.slots,
            latency=args.latency,
            accuracy=ACCURACY,
            lookup=lookup,
            model=MODEL,
            quiet=True,
        )
        try:
            runs = [
                measure_run(suite, mode, repetition, args.examples, server, args.slots)
                for repetition in range(args.repeat)
                for suite in SUITES
                for mode in MODES
            ]
        finally:
            server.stop()
    print(report(runs, args))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(runs, args), indent=2) + "\n")
    failed = [r for r in runs if r.errors or r.requested != r.examples]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
