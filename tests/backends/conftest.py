"""Fixtures for backend tests: the core ``project``/``sim`` fixtures, re-exported."""

from __future__ import annotations

from tests.core.conftest import Project, project, sim  # noqa: F401 - fixtures re-exported
