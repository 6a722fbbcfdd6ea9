"""xdist workers bound to GPUs through the plugin, with a fake GPU inventory and a fake vLLM.

The fake ``vllm`` package (``fake_vllm`` fixture, tests/serving/fakevllm.py) answers
``python -m vllm.entrypoints.openai.api_server`` with a simulated server and
records the ``CUDA_VISIBLE_DEVICES`` it was started with, so the real launch
path (GPU claim, command line, environment, health wait, reuse, stop) runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serving.fakevllm import models, starts


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
    claimed: dict[str, str] = {}  # worker -> the GPU its own server got (its first start)
    for s in servers:  # the server's parent is the worker that claimed the GPU
        claimed.setdefault(s["ppid"], s["gpus"])
    assert len(set(claimed.values())) == len(claimed)  # no two workers share one
    own = [s for s in servers if s["gpus"] == claimed[s["ppid"]]]  # a worker keeps its GPU
    assert len(own) <= 4  # the model-affinity scheduler keeps workers on one model
    for replica in (s for s in servers if s["gpus"] != claimed[s["ppid"]]):
        # a replica, on a GPU another worker claimed first and gave back at its end
        assert replica["gpus"] in set(claimed.values()) - {claimed[replica["ppid"]]}


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
