"""Fixtures for the built-in suite and sandbox tests."""

from __future__ import annotations

import pytest

from pytest_modelbench.sandbox import Sandbox, SandboxLimits


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    """A sandbox with two workers (the machines running this suite are small)."""
    return Sandbox(SandboxLimits(cpu_seconds=10, wall_seconds=20), workers=2)
