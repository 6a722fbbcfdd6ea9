"""Item identity is exact: one item, one run-store directory; two models never share an id."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_modelbench.names import safe_component
from tests.conftest import Project, configure, manifest


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("med:x", "med_x"),
        ("ü", "é"),
        ("m-" + "v" * 300 + "-seed0", "m-" + "v" * 300 + "-seed1"),
        ("a/b", "a_b"),
        ("..", "_"),
    ],
)
def test_different_ids_never_share_a_directory(a: str, b: str) -> None:
    assert safe_component(a) != safe_component(b)
    for name in (a, b):
        component = safe_component(name)
        assert "/" not in component and component not in ("", ".", "..")
        assert len(component) <= 120


def test_safe_ids_are_kept_as_they_are() -> None:
    assert safe_component("alpha-gsm8k-seed0") == "alpha-gsm8k-seed0"


def test_items_whose_ids_sanitise_alike_keep_their_own_results(project: Project, sim: Any) -> None:
    server = sim(accuracy=0.7, lookup={}, latency=0.001)
    configure(project, server.base_url, n=10)
    project.env(
        "qa",
        [
            {"id": "med:x", "module": "jsonl", "env_args": {"path": "qa.jsonl"}},
            {
                "id": "med_x",
                "module": "jsonl",
                "env_args": {"path": "qa.jsonl"},
                "sampling_args": {"temperature": 0.5},
            },
        ],
    )
    first = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    first.assert_outcomes(passed=2)

    def completions() -> int:
        return sum(1 for r in server.requests if r.path.endswith("completions"))

    assert completions() == 20
    second = project.pytester.runpytest("benchmarks/", "--model", "alpha")
    second.assert_outcomes(passed=2)
    assert completions() == 20  # both read back from the store
    second.stdout.fnmatch_lines(
        ["from store (2 of 2 items, *", "  alpha-med:x-seed0: run-*, finished 20*"]
    )
    (run_dir,) = project.run_dirs()
    paths = {entry["path"] for entry in manifest(run_dir)["items"].values()}
    assert len(paths) == 2
    assert all((run_dir / path / "summary.json").is_file() for path in paths)


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        ("orgA/llama-7b,orgB/llama-7b", ["orgA-llama-7b", "orgB-llama-7b"]),
        ("/ckpt/run1/final,/ckpt/run2/final", ["run1-final", "run2-final"]),
    ],
)
def test_same_basename_models_get_distinct_ids(
    project: Project, models: str, expected: list[str]
) -> None:
    project.qa("qa", 3)
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    result = project.pytester.runpytest(
        "benchmarks/", "--collect-only", "-q", "--model", models,
        "--api-base-url", "http://127.0.0.1:9/v1",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    for model in expected:
        result.stdout.fnmatch_lines([f"*test_benchmark?{model}-qa-seed0?*"])


def test_the_same_model_twice_is_one_model(project: Project) -> None:
    project.qa("qa", 3)
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    result = project.pytester.runpytest(
        "benchmarks/", "--collect-only", "-q", "--model", "org/m,org/m",
        "--api-base-url", "http://127.0.0.1:9/v1",
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.OK
    assert result.stdout.str().count("test_benchmark[") == 1


def test_a_configured_name_clashing_with_an_ad_hoc_model_is_refused(project: Project) -> None:
    project.qa("qa", 3)
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    project.models({"final": {"model": "org/one", "api_base_url": "http://127.0.0.1:9/v1"}})
    result = project.pytester.runpytest(
        "benchmarks/", "--collect-only", "--model", "final,/ckpt/run2/final"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--model: 'org/one' and '/ckpt/run2/final' would both be evaluated as 'final'*"]
    )
