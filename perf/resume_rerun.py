"""Re-running a finished run: milliseconds per item when every item comes from the run store.

Builds a throw-away project (one model at a simulated server, one jsonl env with
``--items`` seeds of 2 examples each), runs it once to fill the run store, then
re-runs the same command ``--repeat`` times and prints, as Markdown:

* wall time of the whole re-run session (``python -m pytest ...``, process start included);
* that wall time minus a ``--collect-only`` session of the same command (pytest and
  plugin start-up, collection, planning), divided by the number of items: the cost of
  reporting one item from the store (fingerprint, summary read, gate, report);
* the mean per-item test time pytest itself measured (setup + call + teardown, from JUnit XML).

The re-run must send no completion request; the script checks it. What it may ask is the
endpoint's identity (``GET /v1/models``, once per endpoint and session, so a stored result is
reused only for the model that made it); the table counts those apart.

    python perf/resume_rerun.py [--items 200] [--repeat 3] [-n 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from pytest_modelbench.testing import SimConfig, SimServer

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
LEAN = ["-p", "no:html", "-p", "no:metadata", "-p", "no:hypothesispytest", "-p", "no:randomly"]


def make_project(root: Path, url: str, items: int) -> None:
    (root / "configs" / "envs").mkdir(parents=True)
    (root / "configs" / "baselines").mkdir()
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    with (root / "qa.jsonl").open("w") as handle:
        for i in range(2):
            handle.write(
                json.dumps({"id": f"q{i}", "question": f"what is {i} + 1?", "answer": str(i + 1)})
                + "\n"
            )
    models = {"alpha": {"model": "sim-model", "api_base_url": url, "max_concurrent": 8}}
    (root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": models}))
    env = [
        {
            "id": "qa",
            "module": "jsonl",
            "env_args": {"path": "qa.jsonl"},
            "seeds": list(range(items)),
        }
    ]
    (root / "configs" / "envs" / "qa.yaml").write_text(yaml.safe_dump(env))


def pytest_run(root: Path, *args: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks/", "--model", "alpha", "-q", *LEAN, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(
            f"pytest failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return elapsed


def junit_mean_ms(path: Path) -> float:
    cases = ET.parse(path).getroot().iter("testcase")
    times = [float(case.get("time", "0")) for case in cases]
    return 1000 * statistics.mean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "-n", dest="workers", default="0", help="xdist workers for the re-run (0: none)"
    )
    opts = parser.parse_args()
    xdist = ["-n", opts.workers] if opts.workers != "0" else []
    with tempfile.TemporaryDirectory() as tmp, SimServer(SimConfig(accuracy=0.8)) as server:
        root = Path(tmp)
        make_project(root, server.base_url, opts.items)
        first = pytest_run(root)
        server.clear_log()
        walls, collects, junit = [], [], []
        for n in range(opts.repeat):
            collects.append(pytest_run(root, "--collect-only", *xdist))
            report = root / f"junit-{n}.xml"
            walls.append(pytest_run(root, f"--junitxml={report}", *xdist))
            junit.append(junit_mean_ms(report))
        requests = sum(1 for r in server.requests if r.path.endswith("completions"))
        identity = len(server.requests) - requests
    if requests:
        sys.exit(f"the re-run made {requests} completion requests; expected none")
    wall, collect = statistics.median(walls), statistics.median(collects)
    per_item = 1000 * (wall - collect) / opts.items
    print(
        "| items | first run (s) | re-run wall (s) | collect-only (s) | re-run ms/item "
        "(wall - collect) | pytest ms/item (JUnit) | completion requests | "
        "identity requests (GET /v1/models) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    label = f"{opts.items} (-n {opts.workers})" if xdist else str(opts.items)
    junit_ms = statistics.median(junit)
    print(
        f"| {label} | {first:.1f} | {wall:.2f} | {collect:.2f} | {per_item:.1f} | "
        f"{junit_ms:.1f} | {requests} | {identity} ({identity // opts.repeat} per re-run) |"
    )


if __name__ == "__main__":
    main()
