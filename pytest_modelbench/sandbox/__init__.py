"""A sandbox for model-generated code: separate process, limits, no network, no secrets.

See :mod:`pytest_modelbench.sandbox.host` (spawning, timeouts, verdicts) and
:mod:`pytest_modelbench.sandbox.launcher` (the isolation steps, best effort
per host and reported in :attr:`ExecutionResult.isolation`).
"""

from __future__ import annotations

from pytest_modelbench.sandbox.host import (
    ExecutionResult,
    Sandbox,
    SandboxLimits,
    Status,
    default_sandbox,
    default_workers,
    probe,
)

__all__ = [
    "ExecutionResult",
    "Sandbox",
    "SandboxLimits",
    "Status",
    "default_sandbox",
    "default_workers",
    "probe",
]
