"""Fixtures for the built-in suite and sandbox tests.

``make_sandbox`` gives a sandbox at each isolation level: ``bwrap`` and ``namespaces`` (full
isolation, skipped only where the host cannot provide them, and never in CI: see
:func:`sandbox_for`) and ``audit-hook`` (the fallback, where only the launcher's own checks
and the Python audit hook hold).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable

import pytest

from pytest_modelbench.sandbox import Sandbox, SandboxLimits

HOSTILE_LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=9, memory_bytes=512 << 20)
# bubblewrap runs as the sandbox user: an interpreter only root may read (pyenv under /root)
# is out of its reach, so bwrap tests fall back to the system's python where there is one
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@functools.cache
def usable_python(level: str) -> tuple[str | None, str]:
    """An interpreter this host can run ``level`` with, or None and why not."""
    reasons = []
    for python in dict.fromkeys([None, *(p for p in SYSTEM_PYTHONS if os.path.exists(p))]):
        reason = Sandbox(isolation=level, python=python).unusable(level)
        if reason is None:
            return python, ""
        reasons.append(f"{python or 'this interpreter'}: {reason}")
    return None, "; ".join(reasons)


def sandbox_for(level: str, limits: SandboxLimits, workers: int = 2) -> Sandbox:
    """A sandbox at ``level``; a full level this host lacks skips the test, except in CI
    (``$CI``), where namespaces must work, and bwrap too wherever it is installed."""
    if level == "audit-hook":
        return Sandbox(limits, workers=workers, isolation=level)
    python, reason = usable_python(level)
    if python is None and reason:
        required = level == "namespaces" or shutil.which("bwrap") is not None
        if in_ci() and required:
            pytest.fail(f"CI runs the hostile programs with {level}, which failed: {reason}")
        pytest.skip(f"this host cannot isolate with {level}: {reason}")
    return Sandbox(limits, workers=workers, isolation=level, python=python)


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """A sandbox with two workers (the machines running this suite are small)."""
    return Sandbox(SandboxLimits(cpu_seconds=10, wall_seconds=20), workers=2)


MakeSandbox = Callable[..., Sandbox]


@pytest.fixture(scope="session")
def make_sandbox() -> MakeSandbox:
    """``make_sandbox(level, limits=HOSTILE_LIMITS)``: see :func:`sandbox_for`."""
    return lambda level, limits=HOSTILE_LIMITS: sandbox_for(level, limits)
