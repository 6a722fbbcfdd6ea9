"""Scheduler tests reuse the core tests' benchmark project and simulated server."""

from __future__ import annotations

from tests.core.conftest import project, sim

__all__ = ["project", "sim"]
