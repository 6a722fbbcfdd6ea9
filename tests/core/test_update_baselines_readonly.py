"""``--update-baselines`` into a ``configs/baselines`` it cannot write: one line naming the file
and the fix, never a traceback, and the run's reports are still written (issue 28)."""

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
    assert result.ret == 0, output
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
