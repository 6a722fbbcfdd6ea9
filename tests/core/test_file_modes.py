"""Files modelbench writes respect the umask, so teammates on a shared filesystem can read them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.store.files import atomic_write_json
from tests.conftest import Project, configure


@pytest.fixture
def umask() -> Iterator[Any]:
    old = os.umask(0o022)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_follow_the_umask(
    tmp_path: Path, umask: Any, mask: int, expected: int
) -> None:
    umask(mask)
    atomic_write_json(tmp_path / "x.json", {"a": 1})
    assert mode(tmp_path / "x.json") == expected


def test_run_store_and_reports_are_readable_by_the_group_and_others(
    project: Project, sim: Any, umask: Any
) -> None:
    server = sim(accuracy=0.5, lookup={}, latency=0.001)
    configure(project, server.base_url, n=5)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (run_dir,) = project.run_dirs()
    item = run_dir / "alpha-qa-seed0"
    for path in (
        run_dir / "run_manifest.json",
        run_dir / "report.html",
        run_dir / "leaderboard.json",
        item / "summary.json",
        item / "metadata.json",
        item / "results.jsonl",
    ):
        assert mode(path) == 0o644, path
