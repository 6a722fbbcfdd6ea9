"""How long Ctrl-C takes to end a served run, at each moment, and whether anything is left.

A fresh project with fake GPUs (``MODELBENCH_FAKE_GPUS``) and the fake vLLM of the tests
(``pytest_modelbench.testing.fakevllm``: the real launch path serving the simulated server). pytest
runs in its own process group, and Ctrl-C is sent as a terminal sends it: SIGINT to the whole
group (pytest and its xdist workers; engines run in groups of their own). Phases:

* ``starting``: the engine takes 60 s to start; Ctrl-C 0.5 s after it was launched;
* ``serving``: an item of 400 examples at 0.2 s each; Ctrl-C after 8 answers;
* ``serving-n2``: the same with ``-n 2`` on two fake GPUs (two items, two servers);
* ``shared-n2``: ``-n 2`` on one fake GPU, one worker sharing the other's server;
* ``reports``: Ctrl-C as soon as the last answer is written (reports, summary, stops).

For each it prints the seconds from the signal to pytest's exit (the goal is 2 s), the exit
status, and the engine processes still alive afterwards (the goal is none).

    python perf/ctrl_c.py [--rounds 3] [--phase serving ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from pytest_modelbench.testing.fakevllm import BENCHMARK, write_fake_vllm

EXTRA: list[str] = []  # --pytest-args: more pytest arguments, e.g. -p no:hypothesispytest
PHASES = ("starting", "serving", "serving-n2", "shared-n2", "reports")


def project(root: Path, examples: int, seeds: list[int]) -> None:
    write_fake_vllm(root)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    (root / "configs" / "envs").mkdir(parents=True)
    serve = {"engine": "vllm", "gpus": 1, "startup_timeout": 120}
    (root / "configs" / "models.yaml").write_text(
        yaml.safe_dump({"models": {"m1": {"model": "m1", "serve": serve, "max_concurrent": 4}}})
    )
    (root / "qa.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "question": f"q{i}", "answer": "a"}) + "\n"
            for i in range(examples)
        )
    )
    variant = {"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}, "seeds": seeds}
    (root / "configs" / "envs" / "qa.yaml").write_text(yaml.safe_dump([variant]))


def lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def engine_pids(root: Path) -> list[int]:
    path = root / "servers.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["pid"] for line in path.read_text().splitlines() if line.strip()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def one(phase: str) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="mb-ctrl-c-"))
    workers = phase.endswith("-n2")
    examples = 12 if phase == "reports" else 400
    project(root, examples, [0, 1] if workers else [0])
    env = {
        **os.environ,
        "PYTHONPATH": str(root / "fakevllm"),
        "FAKE_VLLM_LOG": str(root / "servers.jsonl"),
        "FAKE_VLLM_REQUESTS": str(root / "requests.jsonl"),
        "FAKE_VLLM_LATENCY": "0.05" if phase == "reports" else "0.2",
        "FAKE_VLLM_START_S": "60" if phase == "starting" else "0",
        "MODELBENCH_FAKE_GPUS": "0:0" if phase in ("shared-n2", "starting") else "0:0,1:0",
        "MODELBENCH_GPU_LOCK_DIR": str(root / "locks"),
        "MODELBENCH_CACHE": str(root / "cache"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-m", "pytest", "benchmarks/", "--model", "m1", "--run-id", "r"]
    argv += ["-p", "no:randomly", "-p", "no:cacheprovider", *EXTRA]
    if workers:
        argv += ["-n", "2", "--mb-dist", "off"]
    log = root / "pytest.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while not ready(phase, root, workers):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{phase}: never reached the moment\n{log.read_text()}")
            time.sleep(0.01)
        if phase == "starting":
            time.sleep(0.5)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)
    left = [pid for pid in engine_pids(root) if alive(pid)]
    for pid in left:  # tidy up after reporting them
        os.killpg(pid, signal.SIGKILL)
    return {"phase": phase, "seconds": took, "rc": proc.returncode, "left": left}


def ready(phase: str, root: Path, workers: bool) -> bool:
    if phase == "starting":
        return bool(engine_pids(root))
    if phase == "reports":
        return lines(root / "requests.jsonl") >= 12
    return lines(root / "requests.jsonl") >= (16 if workers else 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phase", action="append", choices=PHASES)
    parser.add_argument("--pytest-args", default="", help="more pytest arguments, one string")
    args = parser.parse_args()
    EXTRA.extend(args.pytest_args.split())
    for phase in args.phase or PHASES:
        runs = [one(phase) for _ in range(args.rounds)]
        times = [r["seconds"] for r in runs]
        left = sorted({pid for r in runs for pid in r["left"]})
        print(
            f"{phase:11s} signal->exit median {statistics.median(times):.2f} s "
            f"(max {max(times):.2f}, n={len(times)}); exit status {sorted({r['rc'] for r in runs})}; "
            f"engines left alive: {left or 'none'}",
            flush=True,
        )


if __name__ == "__main__":
    main()
