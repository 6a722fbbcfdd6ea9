"""xdist workers bound to GPUs through the plugin, with a fake GPU inventory and a fake vLLM.

The fake ``vllm`` package (first on ``PYTHONPATH`` of the workers) answers
``python -m vllm.entrypoints.openai.api_server`` with a simulated server and
records the ``CUDA_VISIBLE_DEVICES`` it was started with, so the real launch
path (GPU claim, command line, environment, health wait, reuse, stop) runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

FAKE_SERVER = """
import argparse, json, os, sys, time
from pytest_modelbench.testing import SimConfig, SimServer

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--served-model-name")
parser.add_argument("--port", type=int)
parser.add_argument("--host", default="127.0.0.1")
args, _ = parser.parse_known_args()
with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
    log.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "model": args.served_model_name,
                          "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
with SimServer(SimConfig(models=(args.served_model_name,), port=args.port, host=args.host)):
    while True:
        time.sleep(3600)
"""

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"


@pytest.fixture
def fake_vllm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = pytester.path
    package = root / "fakevllm" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package.parents[1], package.parents[0], package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_SERVER)
    log = root / "servers.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(root / "fakevllm"))
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("TMPDIR", str(root))  # private GPU lock directory
    monkeypatch.setenv("MODELBENCH_CACHE", str(root / "cache"))
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    (root / "configs" / "envs").mkdir(parents=True)
    (root / "qa.jsonl").write_text(
        "".join(json.dumps({"id": i, "question": f"q{i}", "answer": "a"}) + "\n" for i in range(5))
    )
    (root / "configs" / "envs" / "qa.yaml").write_text(
        yaml.safe_dump(
            [
                {
                    "id": "qa",
                    "module": "jsonl",
                    "env_args": {"path": "qa.jsonl"},
                    "seeds": [0, 1, 2, 3],
                }
            ]
        )
    )
    return log


def models(root: Path, gpus: int) -> None:
    spec = {"serve": {"engine": "vllm", "gpus": gpus, "startup_timeout": 60}, "max_concurrent": 4}
    (root / "configs" / "models.yaml").write_text(
        yaml.safe_dump({"models": {"m1": {"model": "m1", **spec}, "m2": {"model": "m2", **spec}}})
    )


def starts(log: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_each_worker_gets_its_own_free_gpu(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0,2:40000,3:0,4:0")  # GPU 2 is busy
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    models(pytester.path, gpus=1)
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1,m2", "-n", "4")
    result.assert_outcomes(passed=8)
    servers = starts(fake_vllm)
    assert {s["gpus"] for s in servers} <= {"0", "1", "3", "4"}  # never the busy GPU
    by_worker: dict[str, set[str]] = {}
    for s in servers:  # the server's parent is the worker that claimed the GPU
        by_worker.setdefault(s["ppid"], set()).add(s["gpus"])
    assert all(len(g) == 1 for g in by_worker.values())  # a worker keeps its GPU
    gpus = [next(iter(g)) for g in by_worker.values()]
    assert len(gpus) == len(set(gpus))  # and no two workers share one
    assert len(servers) <= 4  # the model-affinity scheduler keeps workers on one model


def test_callers_visible_devices_and_tensor_parallel(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0,2:0,3:0,4:0,5:0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,4,5")
    models(pytester.path, gpus=2)
    result = pytester.runpytest_subprocess("benchmarks/", "--model", "m1,m2", "-n", "2")
    result.assert_outcomes(passed=8)
    servers = starts(fake_vllm)
    assert servers and all(len(s["gpus"].split(",")) == 2 for s in servers)
    used = {g for s in servers for g in s["gpus"].split(",")}
    assert used <= {"2", "3", "4", "5"}
    pairs = {s["ppid"]: s["gpus"] for s in servers}
    assert len(set(pairs.values())) == len(pairs)  # disjoint pairs per worker
