"""The session-end report pass when it cannot finish (issue 43): a full disk is one line and a
non-zero exit (a CI job must not pass without its reports), Ctrl-C there is pytest's
interrupted run (exit 2, one line, no traceback), and neither leaves a ``.tmp`` file beside
the reports."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_modelbench.testing.fixtures import SimServerFactory
from tests.conftest import Project, configure

# the failure is injected into the pytest run (a subprocess, so Ctrl-C is its own) by a
# conftest; the row batches are written to results.parquet's .tmp file as they come
FAILING_CONFTEST = """
import errno
from pytest_modelbench.reporting import {module}

def _fail(*args, **kwargs):
    raise {exception}

{module}.{name} = _fail
"""
DISK_FULL = 'OSError(errno.ENOSPC, "No space left on device")'


def _run(project: Project, sim: SimServerFactory, module: str, name: str, exception: str) -> Any:
    configure(project, "http://placeholder", n=10)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=10)
    (project.root / "conftest.py").write_text(
        FAILING_CONFTEST.format(module=module, name=name, exception=exception)
    )
    return project.pytester.runpytest_subprocess(
        "benchmarks/", "--model", "alpha", "--run-id", "r1", "-p", "no:cacheprovider"
    )


def _leftovers(project: Project) -> list[str]:
    return sorted(p.name for p in (project.root / "runs" / "r1").glob(".*.tmp"))


def test_a_full_disk_under_the_parquet_file_fails_the_run_and_leaves_no_tmp(
    project: Project, sim: SimServerFactory
) -> None:
    result = _run(project, sim, "rows", "_arrow_table", DISK_FULL)
    output = result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    result.stdout.fnmatch_lines(
        ["modelbench: results.parquet not written: OSError: [[]Errno 28] No space left on device"]
    )
    assert "Traceback" not in output
    assert _leftovers(project) == []
    assert (project.root / "runs" / "r1" / "report.html").exists()  # the others are written


def test_no_report_written_on_a_full_disk_fails_the_run(
    project: Project, sim: SimServerFactory
) -> None:
    result = _run(project, sim, "html", "write_report", DISK_FULL)
    output = result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    result.stdout.fnmatch_lines(
        ["modelbench: reports not written: [[]Errno 28] No space left on device"]
    )
    assert "Traceback" not in output


def test_ctrl_c_in_the_report_pass_is_an_interrupted_run_without_a_traceback(
    project: Project, sim: SimServerFactory
) -> None:
    result = _run(project, sim, "rows", "_arrow_table", "KeyboardInterrupt")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, output
    assert "Traceback" not in output, output
    result.stdout.fnmatch_lines(
        ["modelbench: reports not written: interrupted; 'modelbench report r1' writes them"]
    )
    assert _leftovers(project) == []
