"""A sandbox for model-generated code: a minimal root, namespaces, limits, no network, no secrets.

See :mod:`pytest_modelbench.sandbox.host` (choosing the isolation level, spawning,
timeouts, verdicts), :mod:`pytest_modelbench.sandbox.bwrap` and
:mod:`pytest_modelbench.sandbox.namespaces` (the two full levels, over the root of
:mod:`pytest_modelbench.sandbox.layout`), :mod:`pytest_modelbench.sandbox.launcher`
(the child side, which checks what holds and reports it in
:attr:`ExecutionResult.isolation`), :mod:`pytest_modelbench.sandbox.judge` (tests run
outside the program's process, so its verdict cannot be forged) and
:mod:`pytest_modelbench.sandbox.policy` (no code runs without OS isolation unless the
user accepts it).
"""

from __future__ import annotations

from pytest_modelbench.sandbox.host import (
    FULL_LEVELS,
    LEVELS,
    ExecutionResult,
    HiddenTests,
    Level,
    Sandbox,
    SandboxFailure,
    SandboxLimits,
    Status,
    default_sandbox,
    default_workers,
    probe,
)
from pytest_modelbench.sandbox.policy import (
    ALLOW_WEAK_FLAG,
    WeakSandboxError,
    WeakSandboxWarning,
    allow_weak_sandbox,
    require_full_isolation,
    weak_sandbox_allowed,
)

__all__ = [
    "ALLOW_WEAK_FLAG",
    "FULL_LEVELS",
    "LEVELS",
    "ExecutionResult",
    "HiddenTests",
    "Level",
    "Sandbox",
    "SandboxFailure",
    "SandboxLimits",
    "Status",
    "WeakSandboxError",
    "WeakSandboxWarning",
    "allow_weak_sandbox",
    "default_sandbox",
    "default_workers",
    "probe",
    "require_full_isolation",
    "weak_sandbox_allowed",
]
