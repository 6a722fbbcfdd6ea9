"""Memory of one huge item: RSS growth of the pytest process over a 100,000-example item.

Builds a throw-away project with one jsonl environment whose generated dataset has
``--examples`` questions, starts the simulated server in its own process
(``python -m pytest_modelbench.testing``, many slots, no latency, a lookup
that answers 70% of the questions right) and runs the item through a real
``python -m pytest`` subprocess.

The project's ``conftest.py`` imports the HTTP client stack and pyarrow at start-up (the
plugin imports them lazily, when the first item runs: pyarrow in a background thread for the
session-end ``results.parquet``, about 50 MB whatever the item's size) and writes the process's ``VmRSS`` and
``VmHWM`` (peak RSS so far) from ``/proc/self/status`` to ``memory.json`` at two
moments: when pytest starts setting the item up (start-up and imports done, nothing of
the item loaded yet) and when the test body is called (the ``mb_eval`` fixture has
evaluated the item: dataset read, requests made, journal written, summary computed).

* **growth over the item** = ``VmHWM`` after the item − ``VmRSS`` before it: the target
  (≤ 200 MB for 100,000 examples) applies to this figure.
* The script also samples ``VmRSS`` of the process from outside every ``--interval``
  seconds, for the session's peak, which includes what runs after the item (the
  run-directory reports written at session end).
* **against a small item**: the same figures for a ``--small``-example dataset
  (``--small 0`` skips it), to tell the fixed cost from what grows with the item.

The script checks that the summary counts every example (n + errors = examples).

    python perf/item_memory.py [--examples 100000] [--small 100] [--slots 256] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from _harness import Sim  # perf/ scripts import each other from their own directory

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
CONFTEST = """\
import json
from pathlib import Path

import pytest

import pytest_modelbench.running.client  # noqa: F401 - the HTTP stack, loaded before the baseline
import pytest_modelbench.running.runner  # noqa: F401
try:  # what the runner's prefetch imports in the background when an item starts (for the
    import pyarrow.json  # noqa: F401 - session-end results.parquet): a fixed cost, not growth
except ImportError:
    pass

MARKS = {}


def _status():
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


def _mark(name):
    MARKS[name] = _status()
    Path("memory.json").write_text(json.dumps(MARKS))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _mark("before_item")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    _mark("after_item")
"""
LEAN = ["-p", "no:html", "-p", "no:metadata", "-p", "no:hypothesispytest", "-p", "no:randomly"]
TARGET_EXAMPLES, TARGET_GROWTH_MB = 100_000, 200


@dataclass
class Sampler:
    """Samples ``VmRSS`` of one process from outside until it exits."""

    pid: int
    interval: float
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds, kB)

    def run(self) -> None:
        started = time.perf_counter()
        status = Path(f"/proc/{self.pid}/status")
        while True:
            try:
                text = status.read_text()
            except OSError:
                return
            kb = next(
                (int(line.split()[1]) for line in text.splitlines() if line.startswith("VmRSS:")), 0
            )
            if kb == 0:  # a zombie: the process has exited
                return
            self.samples.append((time.perf_counter() - started, kb))
            time.sleep(self.interval)

    @property
    def peak_kb(self) -> int:
        return max((kb for _, kb in self.samples), default=0)


@dataclass(frozen=True)
class Outcome:
    examples: int
    n: int
    errors: int
    completed: bool  # n + errors == examples
    score: float | None
    session_wall_s: float
    item_wall_s: float
    requests_per_s: float
    before_item_mb: float  # VmRSS when the item's setup starts
    after_item_mb: float  # VmRSS when the test body is called
    item_peak_mb: float  # VmHWM when the test body is called
    growth_mb: float  # item_peak_mb - before_item_mb
    session_peak_mb: float  # highest VmRSS sampled from outside, session end included
    samples: int


def write_dataset(path: Path, n: int) -> None:
    with path.open("w") as handle:
        for i in range(n):
            row = {"id": f"q{i}", "question": f"q{i}: what is {i} + 1?", "answer": str(i + 1)}
            handle.write(json.dumps(row) + "\n")


def write_lookup(dataset: Path, out: Path) -> None:
    """The simulator's answers for every question of ``dataset`` (right or wrong by accuracy)."""
    from pytest_modelbench.backends.jsonl_suite import JsonlSuite
    from pytest_modelbench.testing import lookup_from_examples

    suite = JsonlSuite()
    examples = suite.examples({"path": str(dataset)}, 0)
    lookup = lookup_from_examples(examples, suite.reference_completion, suite.wrong_completion)
    out.write_text(json.dumps({k: list(v) for k, v in lookup.items()}))


def make_project(root: Path, url: str, dataset: Path) -> None:
    (root / "configs" / "envs").mkdir(parents=True)
    (root / "configs" / "baselines").mkdir()
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    (root / "benchmarks" / "conftest.py").write_text(CONFTEST)
    models = {"alpha": {"model": "sim-model", "api_base_url": url, "max_concurrent": 64}}
    (root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": models}))
    env = [{"id": "qa", "module": "jsonl", "env_args": {"path": str(dataset)}}]
    (root / "configs" / "envs" / "qa.yaml").write_text(yaml.safe_dump(env))


def run_item(root: Path, examples: int, interval: float) -> Outcome:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    command = [sys.executable, "-m", "pytest", "benchmarks/", "--model", "alpha", "-q", *LEAN]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
        sampler = Sampler(proc.pid, interval)
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        code = proc.wait()
        thread.join()
        wall = time.perf_counter() - started
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    if code != 0:
        sys.exit(f"pytest failed ({code}):\n{text[-3000:]}")
    summary_path = next((root / "runs").glob("*/*/summary.json"))
    summary = json.loads(summary_path.read_text())
    metric = summary["metrics"][summary["primary_metric"]]
    n, errors = int(metric["n"]), int(summary["errors"])
    if n + errors != examples:
        sys.exit(f"summary counts {n} + {errors} errors, expected {examples}")
    marks = json.loads((root / "memory.json").read_text())
    before, after = marks["before_item"], marks["after_item"]
    item_wall = float(summary["wall_s"])
    return Outcome(
        examples=examples,
        n=n,
        errors=errors,
        completed=n + errors == examples,
        score=metric["value"],
        session_wall_s=wall,
        item_wall_s=item_wall,
        requests_per_s=examples / item_wall if item_wall else 0.0,
        before_item_mb=before["VmRSS"] / 1024,
        after_item_mb=after["VmRSS"] / 1024,
        item_peak_mb=after["VmHWM"] / 1024,
        growth_mb=(after["VmHWM"] - before["VmRSS"]) / 1024,
        session_peak_mb=max(sampler.peak_kb, after["VmHWM"]) / 1024,
        samples=len(sampler.samples),
    )


def measure(tmp: Path, examples: int, slots: int, interval: float) -> Outcome:
    root = tmp / f"project-{examples}"
    root.mkdir()
    dataset = root / "qa.jsonl"
    write_dataset(dataset, examples)
    lookup = root / "lookup.json"
    write_lookup(dataset, lookup)
    with Sim(slots=slots, latency=0, accuracy=0.7, lookup=lookup) as server:
        make_project(root, server.base_url, dataset)
        return run_item(root, examples, interval)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=TARGET_EXAMPLES)
    parser.add_argument(
        "--small", type=int, default=100, help="examples of the reference item (0: none)"
    )
    parser.add_argument("--slots", type=int, default=256, help="simulated server slots")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON here")
    opts = parser.parse_args()
    if opts.examples < 1 or opts.small < 0:
        sys.exit(f"--examples {opts.examples} / --small {opts.small}: give counts >= 1 / >= 0")
    load_before = _load()
    with tempfile.TemporaryDirectory() as tmp:
        small = measure(Path(tmp), opts.small, opts.slots, opts.interval) if opts.small else None
        big = measure(Path(tmp), opts.examples, opts.slots, opts.interval)
    load_after = _load()
    print(
        f"load average (1/5/15 min) before: {' '.join(map(str, load_before))}, "
        f"after: {' '.join(map(str, load_after))}; cpus: {os.cpu_count()}"
    )
    print(
        "| examples | session wall (s) | item wall (s) | requests/s | RSS before item (MB) | "
        "peak RSS over item (MB) | growth over item (MB) | session peak RSS (MB) | score | errors |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for o in (small, big):
        if o is None:
            continue
        score = "-" if o.score is None else f"{o.score:.3f}"
        print(
            f"| {o.examples:,} | {o.session_wall_s:.1f} | {o.item_wall_s:.1f} | "
            f"{o.requests_per_s:,.0f} | {o.before_item_mb:.0f} | {o.item_peak_mb:.0f} | "
            f"{o.growth_mb:.0f} | {o.session_peak_mb:.0f} | {score} | {o.errors} |"
        )
    if small is not None:
        print(
            f"\ngrowth over the {big.examples:,}-example item minus that over the "
            f"{small.examples}-example item: {big.growth_mb - small.growth_mb:.0f} MB"
        )
    if big.examples == TARGET_EXAMPLES:
        met = big.growth_mb <= TARGET_GROWTH_MB
        print(
            f"target: a {TARGET_EXAMPLES:,}-example item grows RSS by <= {TARGET_GROWTH_MB} MB: "
            f"{big.growth_mb:.0f} MB ({'met' if met else 'NOT met'})"
        )
    if opts.json:
        report = {
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": load_after,
            "small": asdict(small) if small else None,
            "big": asdict(big),
        }
        Path(opts.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
