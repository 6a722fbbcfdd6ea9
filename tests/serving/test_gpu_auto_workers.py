"""``-n auto`` sizes xdist workers by free GPUs (issue 28): xdist asks before
``pytest_configure``, so the plugin answers from the parsed options then."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serving.fakevllm import models


def test_n_auto_is_one_worker_per_free_gpu(
    pytester: pytest.Pytester, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0,1:0,2:0,3:30000")  # GPU 3 is busy
    models(pytester.path, gpus=1, names=("m1",))
    result = pytester.runpytest_subprocess(
        "benchmarks/", "--model", "m1", "--seeds", "0", "-n", "auto", "-p", "no:randomly"
    )
    result.stdout.fnmatch_lines(["created: 3/3 workers"])
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "order",
    [
        ("pytest_modelbench.plugin", "xdist.plugin", "xdist.looponfail"),
        ("xdist.plugin", "xdist.looponfail", "pytest_modelbench.plugin"),
    ],
    ids=["modelbench-first", "xdist-first"],
)
def test_n_auto_counts_gpus_whatever_the_plugin_order(
    pytester: pytest.Pytester,
    fake_vllm: Path,
    monkeypatch: pytest.MonkeyPatch,
    order: tuple[str, ...],
) -> None:
    """xdist's own hook answers with the CPU count; modelbench's answers first either way."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("MODELBENCH_FAKE_GPUS", "0:0")
    models(pytester.path, gpus=1, names=("m1",))
    plugins = [arg for name in order for arg in ("-p", name)]
    result = pytester.runpytest_subprocess(
        *plugins, "benchmarks/", "--model", "m1", "--seeds", "0", "-n", "auto"
    )
    result.stdout.fnmatch_lines(["created: 1/1 worker"])
    result.assert_outcomes(passed=1)
