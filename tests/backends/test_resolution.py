"""``module:`` resolution of the prefixed backends: clear messages, nothing heavy imported early."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Project


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("nosuch:thing", "*unknown module 'nosuch:thing'*accepted:*verifiers:<env_id>*"),
        ("lm_eval:", "*module 'lm_eval:': give the task name or task YAML path after the colon*"),
        ("verifiers: ", "*module 'verifiers: ': give the environment id after the colon*"),
    ],
)
def test_bad_module_is_a_usage_error(project: Project, module: str, message: str) -> None:
    project.models({"m": {"model": "x", "api_base_url": "http://127.0.0.1:9/v1"}})
    project.env("e", [{"id": "e", "module": module}])
    result = project.pytester.runpytest("benchmarks/", "--model", "m")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_missing_extra_stops_the_run_before_anything_starts(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_modelbench.backends import registry, verifiers_common

    monkeypatch.setattr(verifiers_common.importlib.util, "find_spec", lambda _name: None)
    registry._BACKEND_CACHE.pop("verifiers:my-env", None)
    project.models({"m": {"model": "x", "api_base_url": "http://127.0.0.1:9/v1"}})
    project.env("e", [{"id": "e", "module": "verifiers:my-env"}])
    result = project.pytester.runpytest("benchmarks/", "--model", "m")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "module 'verifiers:my-env' needs verifiers, which is not installed: "
        "pip install 'pytest-modelbench[verifiers]'" in result.stderr.str()
    )


def test_plan_lists_prefixed_items(project: Project, sim: Any) -> None:
    pytest.importorskip("lm_eval")
    project.models({"m": {"model": "x", "api_base_url": "http://127.0.0.1:9/v1"}})
    project.env("e", [{"id": "arc", "module": "lm_eval:tasks/missing.yaml"}])
    result = project.pytester.runpytest("benchmarks/", "--model", "m", "--collect-only", "-q")
    result.stdout.fnmatch_lines(
        ["*m-arc-seed0*?*lm-eval task file 'tasks/missing.yaml' not found*"]
    )
