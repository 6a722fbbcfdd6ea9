"""A real two-worker run with replicas: fake GPUs, a fake engine, one item ten times the other.

``pytest benchmarks/ --model m1 -n 2`` in a fresh project, with two fake GPUs
(``MODELBENCH_FAKE_GPUS``) and a fake vLLM (``pytest_modelbench.testing.fakevllm``: the real launch
path serving the simulated server) with fixed batch slots and latency per request. The
variants ``big`` and ``small`` have 10:1 examples and cost hints that give each its own
worker. Three runs, side by side: replicas off (``MODELBENCH_NO_REPLICAS=1``: the big item
on one server), replicas on (the small item's worker lends its running server to the big
item when it is done), and replicas on without cost hints (the scheduler puts both items on
one worker; the other worker's GPU, given back, starts a replica). Then ``-k big`` alone,
replicas off and on: the idle worker gives its GPU back at once and a replica starts with
the big item's own server (``--start-s``: the fake engine's start time, in every run).

For each it prints the big item's wall time (``wall_s`` in its ``summary.json``), the whole
run's, the share of the big item's requests the second GPU answered, and the two-server
ideal: both items' work spread over both servers from the start, (big + small) / 2 at the
engine's rate, plus the rate's own measure from the replicas-off run.

    python perf/replicas_run.py [--big 1000] [--slots 8] [--latency 0.1] [--start-s 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pytest_modelbench.testing.fakevllm import BENCHMARK, write_fake_vllm


def project(root: Path, big: int, hints: bool) -> None:
    write_fake_vllm(root)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    (root / "configs" / "envs").mkdir(parents=True)
    serve = {"engine": "vllm", "gpus": 1, "startup_timeout": 60}
    (root / "configs" / "models.yaml").write_text(
        yaml.safe_dump({"models": {"m1": {"model": "m1", "serve": serve, "max_concurrent": 8}}})
    )
    sizes = {"big": big, "small": big // 10}
    variants = []
    for name, n in sizes.items():
        (root / f"{name}.jsonl").write_text(
            "".join(
                json.dumps({"id": i, "question": f"{name} q{i}", "answer": "a"}) + "\n"
                for i in range(n)
            )
        )
        variant = {"id": name, "module": "jsonl", "env_args": {"path": f"{name}.jsonl"}}
        if hints:
            variant["cost"] = n
        variants.append({**variant, "seeds": [0]})
    (root / "configs" / "envs" / "sizes.yaml").write_text(yaml.safe_dump(variants))


def run(
    label: str,
    big: int,
    slots: int,
    latency: float,
    *,
    replicas: bool,
    hints: bool,
    start_s: float = 0.0,
    select: str | None = None,
) -> dict:
    root = Path(tempfile.mkdtemp(prefix="mb-replicas-"))
    project(root, big, hints)
    env = {
        **os.environ,
        "PYTHONPATH": str(root / "fakevllm"),
        "FAKE_VLLM_LOG": str(root / "servers.jsonl"),
        "FAKE_VLLM_REQUESTS": str(root / "requests.jsonl"),
        "FAKE_VLLM_LOG_PER_SERVER": "1",
        "FAKE_VLLM_LATENCY": str(latency),
        "FAKE_VLLM_SLOTS": str(slots),
        "FAKE_VLLM_START_S": str(start_s),
        "MODELBENCH_FAKE_GPUS": "0:0,1:0",
        "MODELBENCH_GPU_LOCK_DIR": str(root / "locks"),
        "MODELBENCH_CACHE": str(root / "cache"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("MODELBENCH_NO_REPLICAS", None)
    if not replicas:
        env["MODELBENCH_NO_REPLICAS"] = "1"
    began = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "benchmarks/",
            "--model",
            "m1",
            "-n",
            "2",
            "--run-id",
            "r",
            "-p",
            "no:cacheprovider",
            "-q",
            "--mb-no-reports",
            *(["-k", select] if select else []),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - began
    if done.returncode != 0:
        sys.exit(f"{label}: pytest exited {done.returncode}\n{done.stdout[-3000:]}")
    summary = json.loads((root / "runs" / "r" / "m1-big-seed0" / "summary.json").read_text())
    servers = [json.loads(x) for x in (root / "servers.jsonl").read_text().splitlines()]
    on_gpu = {}
    for gpu in ("0", "1"):
        path = root / f"requests-gpu{gpu}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        on_gpu[gpu] = sum(1 for x in lines if "big q" in json.loads(x)["key"])
    first = next(s["gpus"] for s in servers if on_gpu[s["gpus"]])  # the big item's own GPU
    other = "1" if first == "0" else "0"
    return {
        "label": label,
        "big_wall": summary["wall_s"],
        "run_wall": wall,
        "second_gpu_share": on_gpu[other] / max(1, sum(on_gpu.values())),
        "starts": len(servers),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--start-s", type=float, default=3.0)
    args = parser.parse_args()
    rate = args.slots / args.latency  # requests per second on one server
    ideal = (args.big + args.big // 10) / rate / 2 + args.start_s
    common = {"big": args.big, "slots": args.slots, "latency": args.latency}
    common["start_s"] = args.start_s
    rows = [
        run("replicas off", **common, replicas=False, hints=True),
        run("replicas on (server lent)", **common, replicas=True, hints=True),
        run("replicas on (replica started)", **common, replicas=True, hints=False),
    ]
    alone_rows = [
        run("-k big, replicas off", **common, replicas=False, hints=True, select="big"),
        run("-k big, replicas on", **common, replicas=True, hints=True, select="big"),
    ]
    print(
        f"big {args.big} / small {args.big // 10} examples, {args.slots} slots x "
        f"{args.latency * 1000:.0f} ms per server ({rate:.0f} req/s), server start "
        f"{args.start_s:.0f} s; one server alone: {args.big / rate + args.start_s:.1f} s; "
        f"two-server ideal for the big item: {ideal:.1f} s (both items), "
        f"{args.big / rate / 2 + args.start_s:.1f} s (-k big)\n"
    )
    print(
        "| run | server starts | big item wall | vs replicas off | vs two-server ideal "
        "| big item's requests on the 2nd GPU | whole run wall |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for group, best in ((rows, ideal), (alone_rows, args.big / rate / 2 + args.start_s)):
        alone = group[0]["big_wall"]
        for row in group:
            print(
                f"| {row['label']} | {row['starts']} | {row['big_wall']:.1f} s | "
                f"{row['big_wall'] / alone:.2f}x | {row['big_wall'] / best:.2f}x | "
                f"{row['second_gpu_share']:.0%} | {row['run_wall']:.1f} s |"
            )


if __name__ == "__main__":
    main()
