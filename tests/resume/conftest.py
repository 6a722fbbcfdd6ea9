"""Helpers for resume tests: requests of a run, and pytest started (and killed) as a subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import rows

# a pytest started by a test must not think it is an xdist worker of the outer run
_OUTER_PYTEST_VARS = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
    "PYTEST_CURRENT_TEST",
    "PYTEST_ADDOPTS",
    "PYTEST_VERSION",
)


def completions(server: Any) -> list[Any]:
    return [r for r in server.requests if r.path.endswith("completions")]


def comparable(item_dir: Path) -> list[tuple[str, str, float]]:
    """(example_id, completion, score) per example, sorted: what must not depend on crashes."""
    return sorted((r["example_id"], r["completion"], r["score"]) for r in rows(item_dir))


@dataclass
class Finished:
    returncode: int
    output: str


def argv_for(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:randomly", *args]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OUTER_PYTEST_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_pytest(root: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """pytest in its own process group (so the whole group, xdist workers too, can be killed)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            argv_for(*args),
            cwd=root,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def run_pytest(root: Path, *args: str, timeout: float = 120) -> Finished:
    log = root / f"pytest-{os.getpid()}-{len(list(root.glob('pytest-*.log')))}.log"
    proc = start_pytest(root, *args, log=log)
    try:
        proc.wait(timeout=timeout)
    finally:
        kill_group(proc)
    return Finished(proc.returncode, log.read_text(errors="replace"))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of ``proc`` while it still runs, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
