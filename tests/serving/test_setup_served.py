"""The setup of a model modelbench serves: the engine's reported version, the serving args that
can change outputs (not ports or memory utilisation), NVML's GPU, driver and CUDA; written with
the baseline, compared before the next verdict (issue 42)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.serving.fakevllm import write_models

# nvidia-ml-py as the pytest run under test imports it: two H100s, driver 550.54.15, CUDA 12.4
FAKE_PYNVML = """
class NVMLError(Exception):
    pass

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return b"NVIDIA H100 80GB HBM3"
def nvmlDeviceGetUUID(h): return "GPU-%d" % h
def nvmlDeviceGetMigMode(h): return [0, 0]
class _Memory:
    used = 0
def nvmlDeviceGetMemoryInfo(h): return _Memory()
def nvmlSystemGetDriverVersion(): return "550.54.15"
def nvmlSystemGetCudaDriverVersion(): return 12040
"""


def _models(root: Path, gpus: int, memory: float) -> None:
    serve = {
        "engine": "vllm",
        "gpus": gpus,
        "startup_timeout": 60,
        "args": {"dtype": "bfloat16", "max_model_len": 2048, "gpu_memory_utilization": memory},
    }
    write_models(
        root, {"m1": {"model": "m1", "serve": serve, "max_concurrent": 4, "max_tokens": 512}}
    )


def _run(pytester: pytest.Pytester, run_id: str, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "--run-id", run_id, "-p", "no:randomly",
        "-p", "no:cacheprovider", "--mb-no-reports", *args,
    )  # fmt: skip


def _setup(run: Path) -> dict[str, Any]:
    (item,) = [p for p in run.iterdir() if (p / "result.json").exists()]
    setup: dict[str, Any] = json.loads((item / "result.json").read_text())["setup"]
    return setup


def test_served_setup_recorded_then_compared(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pytester.path
    (root / "fakevllm" / "pynvml.py").write_text(FAKE_PYNVML)
    (root / "configs" / "envs" / "qa.yaml").write_text(
        yaml.safe_dump([{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    )
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0")
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.32.0")
    _models(root, gpus=1, memory=0.5)
    _run(pytester, "r1", "--update-baselines").assert_outcomes(passed=1)

    recorded = _setup(root / "runs" / "r1")
    assert recorded["engine"] == "vllm"
    assert recorded["engine_version"] == "0.32.0"  # the server's GET /version
    assert recorded["gpu_model"] == "NVIDIA H100 80GB HBM3"  # NVML
    assert recorded["gpu_count"] == 1
    assert recorded["driver_version"] == "550.54.15"
    assert recorded["cuda_version"] == "12.4"
    assert recorded["serve_args"] == {"dtype": "bfloat16", "max_model_len": 2048}  # no memory
    assert recorded["max_tokens"] == 512
    assert recorded["prompt_format"] == "chat jsonl"
    assert recorded["modelbench_version"]
    baseline = yaml.safe_load((root / "configs" / "baselines" / "m1.yaml").read_text())
    assert baseline["qa"]["setup"] == recorded

    # another vLLM, two GPUs; memory utilisation changed too, but it cannot change an answer
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.33.0")
    _models(root, gpus=2, memory=0.9)
    line = (
        "setup differs (engine_version, serve.tensor_parallel_size, gpu_count): "
        "baseline: vllm 0.32.0, 1×H100, bfloat16, max_tokens 512; "
        "this run: vllm 0.33.0, 2×H100, TP2, bfloat16, max_tokens 512"
    )
    planned = pytester.runpytest_subprocess("benchmarks/", "--model", "m1", "--collect-only")
    planned.stdout.fnmatch_lines(
        [
            "1 item(s) planned under another setup than their baseline:",
            "  m1-qa-seed0: setup differs (serve.tensor_parallel_size, gpu_count): "
            "baseline: vllm 0.32.0, 1×H100, bfloat16, max_tokens 512; "
            "planned: vllm, 2×GPU, TP2, bfloat16, max_tokens 512",
        ]
    )
    shown = _run(pytester, "r2")
    shown.assert_outcomes(passed=1)
    shown.stdout.fnmatch_lines([f"m1-qa-seed0: {line}"])
    assert "gpu_memory_utilization" not in shown.stdout.str()

    failed = _run(pytester, "r3", "--mb-require-same-setup")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines([f"*fails under --mb-require-same-setup: {line}*"])

    (root / "pytest.ini").write_text("[pytest]\nmodelbench_require_same_setup = true\n")
    _run(pytester, "r4").assert_outcomes(failed=1)

    _models(root, gpus=1, memory=0.9)  # back to the baseline's setup but for the engine version
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.32.0")
    same = _run(pytester, "r5")
    same.assert_outcomes(passed=1)
    assert "setup differs" not in same.stdout.str()
