"""A sandbox for model-generated code: separate process, limits, no network, no secrets.

See :mod:`pytest_modelbench.sandbox.host` (spawning, timeouts, verdicts),
:mod:`pytest_modelbench.sandbox.launcher` (the isolation steps, best effort
per host and reported in :attr:`ExecutionResult.isolation`) and
:mod:`pytest_modelbench.sandbox.judge` (tests run outside the program's
process, so its verdict cannot be forged).
"""

from __future__ import annotations

from pytest_modelbench.sandbox.host import (
    ExecutionResult,
    HiddenTests,
    Sandbox,
    SandboxLimits,
    Status,
    default_sandbox,
    default_workers,
    probe,
)

__all__ = [
    "ExecutionResult",
    "HiddenTests",
    "Sandbox",
    "SandboxLimits",
    "Status",
    "default_sandbox",
    "default_workers",
    "probe",
]
