"""The tensor-parallel warning reaches the user from the xdist worker that claimed the GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serving.fakevllm import models, starts

TP_WARNING = (
    "*GpuWarning: models.small.serve.gpus: 2 runs every server with tensor parallel size 2.*"
)


@pytest.mark.parametrize("gpus", [2, 1])
def test_tensor_parallel_warning_only_when_a_server_spans_gpus(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch, gpus: int
) -> None:
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0,2:0,3:0")
    models(pytester.path, gpus=gpus, names=("small",))
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "small", "-n", "2", "-p", "no:cacheprovider", "--mb-no-reports"
    )
    result.assert_outcomes(passed=4)
    assert {len(s["gpus"].split(",")) for s in starts(fake_vllm)} == {gpus}
    if gpus > 1:
        result.stdout.fnmatch_lines(
            ["*= warnings summary =*", "*test_benchmark*small-qa-seed*", TP_WARNING]
        )
    else:
        result.stdout.no_fnmatch_line("*tensor parallel*")
