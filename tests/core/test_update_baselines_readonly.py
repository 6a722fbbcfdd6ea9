"""``--update-baselines`` into a ``configs/baselines`` it cannot write: one line naming the file
and the fix, never a traceback, the run's reports are still written (issue 28), and the run
exits non-zero, so a baseline-refresh job that refreshed nothing is not green (issue 43)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.store import files
from pytest_modelbench.testing.fixtures import SimServerFactory
from tests.conftest import Project, configure


def test_read_only_baselines_dir(project: Project, sim: SimServerFactory) -> None:
    configure(project, "http://placeholder", n=10)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=10)
    baselines = project.root / "configs" / "baselines"
    real_mkstemp = tempfile.mkstemp

    def read_only(*args: Any, dir: Any = None, **kwargs: Any) -> Any:
        if dir is not None and Path(dir) == baselines:  # as root, chmod would not stop a write
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_mkstemp(*args, dir=dir, **kwargs)

    with pytest.MonkeyPatch.context() as mp:  # (pytester's own monkeypatch must stay)
        mp.setattr(files.tempfile, "mkstemp", read_only)
        result = project.pytester.runpytest(
            "benchmarks/", "--model", "alpha", "--update-baselines", "--run-id", "r1"
        )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    result.assert_outcomes(passed=1)  # the item itself passed
    assert "Traceback" not in output and "INTERNALERROR" not in output
    line = (
        "--update-baselines: configs/baselines/alpha.yaml not updated, cannot write it: "
        "Permission denied; make configs/baselines writable and re-run the same command"
    )
    assert line in output
    assert "baselines written" not in output
    assert not (baselines / "alpha.yaml").exists()
    assert (project.root / "runs" / "r1" / "report.html").exists()
    assert (project.root / "runs" / "r1" / "leaderboard.csv").exists()


def test_every_entry_kept_writes_nothing_and_says_so(
    project: Project, sim: SimServerFactory
) -> None:
    server = sim(accuracy=0.5, lookup={}, latency=0.001)
    configure(project, server.base_url, n=20)
    path = project.root / "configs" / "baselines" / "alpha.yaml"
    curated = "# curated\nqa:\n  value: 0.0\n  margin: 0.5\n  n: 1319\n  source: lm-eval\n"
    path.write_text(curated)
    before = path.stat().st_mtime_ns
    result = project.pytester.runpytest(
        "benchmarks/", "--model", "alpha", "--num-examples", "5", "--update-baselines"
    )
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
    output = result.stdout.str()
    assert "baselines written" not in output
    result.stdout.fnmatch_lines(
        [
            "--update-baselines: no baseline file changed: every entry was kept (see the "
            "warnings; --mb-replace-baselines replaces them)"
        ]
    )
    assert path.read_text() == curated and path.stat().st_mtime_ns == before


def test_ctrl_c_while_baselines_are_written_is_an_interrupted_run(
    project: Project, sim: SimServerFactory
) -> None:
    configure(project, "http://placeholder", n=10)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=10)
    (project.root / "conftest.py").write_text(
        "from pytest_modelbench.gating import baselines\n\n"
        "def _interrupted(*args, **kwargs):\n"
        "    raise KeyboardInterrupt\n\n"
        "baselines.update_baselines = _interrupted\n"
    )
    result = project.pytester.runpytest_subprocess(
        "benchmarks/", "--model", "alpha", "--update-baselines", "--run-id", "r1"
    )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, output
    assert "Traceback" not in output
    result.stdout.fnmatch_lines(["--update-baselines: interrupted; files not yet written are*"])
    assert (project.root / "runs" / "r1" / "report.html").exists()  # the reports still are
