"""A run named as a reference (``--baseline-run``, ``run:`` in a baseline file) is read-only:
auto-resume never continues it, nothing recomputes it, and the gate reads it as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Project


@pytest.fixture
def worse_later(project: Project, sim: Any) -> tuple[Project, Any]:
    """A 60-example ``qa`` environment answered perfectly, for a reference run."""
    project.qa("qa", 60)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    project.models(
        {"alpha": {"model": "sim-model", "api_base_url": server.base_url, "max_concurrent": 16}}
    )
    project.env("qa", [{"id": "qa", "module": "jsonl", "env_args": {"path": "qa.jsonl"}}])
    return project, server


def _runs(project: Project) -> list[Path]:
    return sorted(p for p in (project.root / "runs").iterdir() if p.is_dir())


def _digests(run: Path) -> dict[str, str]:
    """Every file of a run directory (but its lock files) by content digest."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def _reference(project: Project) -> Path:
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (reference,) = _runs(project)
    return reference


@pytest.mark.parametrize("named_in", ["--baseline-run", "baseline file"])
def test_auto_resume_never_continues_the_reference_run(
    worse_later: tuple[Project, Any], named_in: str
) -> None:
    project, server = worse_later
    reference = _reference(project)
    before = _digests(reference)
    server.reconfigure(accuracy=0.4)  # the model under test got much worse
    args = ["benchmarks/", "--model", "alpha"]
    if named_in == "--baseline-run":
        args += ["--baseline-run", reference.name]
    else:
        (project.root / "configs" / "baselines" / "alpha.yaml").write_text(
            f"qa: {{run: {reference.name}}}\n"
        )
    result = project.pytester.runpytest(*args)
    result.assert_outcomes(failed=1)  # before: continued the reference, compared it with itself
    result.stdout.fnmatch_lines(
        [
            f"modelbench: the latest run {reference.name} is this session's reference (*) and "
            "is never written: writing a new run * instead of continuing it",
            "*regression of 0.*correct->wrong*",
        ]
    )
    assert len(_runs(project)) == 2
    assert _digests(reference) == before


def test_force_and_a_changed_config_never_touch_the_reference(
    worse_later: tuple[Project, Any],
) -> None:
    project, server = worse_later
    reference = _reference(project)
    before = _digests(reference)
    server.reconfigure(accuracy=0.4)
    # a changed sampling setting: before, the reference item was recomputed in place
    project.models(
        {
            "alpha": {
                "model": "sim-model",
                "api_base_url": server.base_url,
                "max_concurrent": 16,
                "sampling_args": {"temperature": 0.5},
            }
        }
    )
    for extra in ([], ["--force"]):
        result = project.pytester.runpytest(
            "benchmarks/", "--model", "alpha", "--baseline-run", reference.name, *extra
        )
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*regression of 0.*"])
    assert _digests(reference) == before


def test_run_id_naming_the_reference_is_a_usage_error(worse_later: tuple[Project, Any]) -> None:
    project, _ = worse_later
    reference = _reference(project)
    before = _digests(reference)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--run-id", reference.name,
        "--baseline-run", reference.name,
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: --run-id {reference.name}: that run is this session's reference "
            f"(--baseline-run {reference.name}) and is never written; give a new --run-id*"
        ]
    )
    assert _digests(reference) == before


def test_an_older_reference_leaves_auto_resume_alone(worse_later: tuple[Project, Any]) -> None:
    project, _ = worse_later
    project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--run-id", "a-ref", "--num-examples", "30"
    ).assert_outcomes(passed=1)
    _reference_latest(project)
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--baseline-run", "a-ref"
    )
    result.assert_outcomes(passed=1)
    assert "is never written" not in result.stdout.str()
    assert [p.name for p in _runs(project)] == ["a-ref", "b-newer"]


def _reference_latest(project: Project) -> Path:
    """A second, newer run (not a reference): auto-resume continues it (runs made in the same
    second are ordered by name)."""
    project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--run-id", "b-newer"
    ).assert_outcomes(passed=1)
    return project.root / "runs" / "b-newer"
