"""Config mistakes found before anything runs (issue 43): a baseline entry that could not gate
(a metric typo, a bad ``n``, NaN, an empty entry, ``value`` with ``run``, a ``run`` that is a
path) and a ``--baseline-run`` that names no run are each one usage error at start-up, never
an item error after the item's requests."""

from __future__ import annotations

import pytest

from tests.conftest import UNREACHABLE_URL, Project, configure, one_usage_error

BASELINE = "configs/baselines/alpha.yaml"


@pytest.fixture
def unreachable(project: Project) -> Project:
    """``alpha`` at an endpoint where nothing listens: a run that sent a request would fail."""
    configure(project, UNREACHABLE_URL, n=5)
    return project


def _baseline(project: Project, text: str) -> None:
    (project.root / BASELINE).write_text(text)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            "qa: {value: 0.5, metric: exact_mach}",
            f"{BASELINE}: qa: metric 'exact_mach' is not computed by jsonl (did you mean "
            "'exact_match'?); it computes exact_match",
        ),
        ("qa: {value: 0.5, n: 12.5}", f"{BASELINE}: qa: n: *integer*12.5*"),
        ("qa: {value: 0.5, n: -3}", f"{BASELINE}: qa: n: *greater than or equal to 1*-3*"),
        ("qa: {value: .nan}", f"{BASELINE}: qa: value: *finite*"),
        (
            "qa: {}",
            f"{BASELINE}: qa: needs one of 'value' (with optional 'margin'), 'min' or 'run'*",
        ),
        (
            "qa: {value: 0.5, run: old}",
            f"{BASELINE}: qa: 'run' and 'value' are two different gates (a paired test against "
            "that run, a fixed number); keep one of them*",
        ),
        ("qa: {run: ../../etc}", f"{BASELINE}: qa: run: expected a run id *not a path*"),
    ],
    ids=["metric-typo", "fractional-n", "negative-n", "nan", "empty", "value-and-run", "path-run"],
)
def test_a_baseline_entry_mistake_is_a_usage_error_before_anything_runs(
    unreachable: Project, entry: str, expected: str
) -> None:
    _baseline(unreachable, entry + "\n")
    line = one_usage_error(unreachable, "--model", "alpha")
    assert fnmatch_one(line, f"ERROR: {expected}"), line
    assert not (unreachable.root / "runs").exists()  # nothing ran


def fnmatch_one(line: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(line, pattern)


def test_a_valid_metric_is_accepted(unreachable: Project) -> None:
    _baseline(unreachable, "qa: {min: 0.5, metric: exact_match}\n")
    result = unreachable.pytester.runpytest("benchmarks/", "--model", "alpha", "--co")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()


def test_baseline_run_naming_no_run_is_a_usage_error_as_restart_is(unreachable: Project) -> None:
    (unreachable.root / "runs" / "r1").mkdir(parents=True)
    line = one_usage_error(unreachable, "--model", "alpha", "--baseline-run", "nosuch")
    assert line == (
        "ERROR: --baseline-run nosuch: no run directory runs/nosuch; runs under runs: r1"
    )
    assert [p.name for p in (unreachable.root / "runs").iterdir()] == ["r1"]  # nothing ran


def test_baseline_run_that_is_a_path_out_of_the_runs_is_refused(unreachable: Project) -> None:
    line = one_usage_error(unreachable, "--model", "alpha", "--baseline-run", "../configs")
    assert line.startswith("ERROR: --baseline-run ../configs: expected a run id")
