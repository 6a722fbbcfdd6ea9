"""modelbench installed beside other popular pytest plugins breaks no pytest session.

pytest-timeout, pytest-rerunfailures, pytest-randomly and pytest-cov live in
``.venv/coexist-plugins`` (``scripts/setup.sh`` installs them there, not into the
environment itself, where pytest-randomly would reorder and reseed this suite). Each run
here is a subprocess with that directory on ``PYTHONPATH``, so only that process finds
their entry points, and it uses each plugin's own flag (``--timeout`` belongs to
pytest-timeout; modelbench's is ``--mb-timeout``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Project, configure, manifest
from tests.resume.conftest import clean_env

PLUGINS_DIR = Path(sys.prefix) / "coexist-plugins"
PLUGINS = ("pytest_timeout", "pytest_rerunfailures", "pytest_randomly", "pytest_cov")

pytestmark = pytest.mark.skipif(
    not all(
        (PLUGINS_DIR / name).exists() or (PLUGINS_DIR / f"{name}.py").exists() for name in PLUGINS
    ),
    reason=f"pytest-timeout, pytest-rerunfailures, pytest-randomly and pytest-cov are not in "
    f"{PLUGINS_DIR}: run bash scripts/setup.sh",
)

PLAIN_TESTS = """
from pathlib import Path


def test_plain():
    assert sum(range(4)) == 6


def test_fails_once_then_passes():
    marker = Path(__file__).with_name("failed-once")
    if not marker.exists():
        marker.write_text("x")
        raise AssertionError("first attempt fails; --reruns 1 runs it again")
"""


def run_with_plugins(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS_DIR), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_plugins_active(output: str) -> None:
    plugins = next(line for line in output.splitlines() if line.startswith("plugins:"))
    for name in ("timeout-", "rerunfailures-", "randomly-", "cov-", "modelbench-"):
        assert name in plugins, plugins
    assert "Using --randomly-seed=" in output  # pytest-randomly is on by default
    assert "timeout: 5.0s" in output  # pytest-timeout owns --timeout


def test_unrelated_project_with_each_plugins_own_flag(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain=PLAIN_TESTS)
    out = run_with_plugins(pytester.path, "--timeout", "5", "--reruns", "1", "--cov", "-rA")
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    assert_plugins_active(output)
    assert "2 passed, 1 rerun" in output
    assert "TOTAL" in output  # pytest-cov's report
    assert "argparse" not in output and "conflicting option" not in output


def test_benchmark_run_with_the_plugins(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder", n=20)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"))
    configure(project, server.base_url, n=20, seeds=[0, 1])
    out = run_with_plugins(
        project.root,
        "benchmarks/",
        "--model",
        "alpha",
        "--run-id",
        "with-plugins",
        "--mb-timeout",
        "30",
        "--timeout",
        "60",
        "--reruns",
        "1",
        "--cov",
    )
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    assert "2 passed" in output
    assert "Using --randomly-seed=" in output and "timeout: 60.0s" in output
    items = manifest(project.root / "runs" / "with-plugins")["items"]
    assert {item: entry["status"] for item, entry in items.items()} == {
        "alpha-qa-seed0": "finished",
        "alpha-qa-seed1": "finished",
    }
