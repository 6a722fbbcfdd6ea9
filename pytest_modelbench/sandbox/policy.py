"""Generated code runs with full isolation, or with the user's stated consent: never silently less.

The audit-hook level (no namespaces: rlimits and a Python audit hook) is not a security
boundary; native code gets past it. The code suites call :func:`require_full_isolation`
before they run anything: it refuses that level unless the user opted in with
``--mb-allow-weak-sandbox`` (the plugin calls :func:`allow_weak_sandbox`) or
``$MODELBENCH_ALLOW_WEAK_SANDBOX=1``, and warns once when they did.
"""

from __future__ import annotations

import os
import threading
import warnings

from pytest_modelbench.sandbox.host import FULL_LEVELS, Sandbox

ALLOW_WEAK_VAR = "MODELBENCH_ALLOW_WEAK_SANDBOX"
ALLOW_WEAK_FLAG = "--mb-allow-weak-sandbox"
WHAT_IS_ACCEPTED = (
    "generated code then runs as your user on this host with only the Python audit hook in "
    "its way, which native code (ctypes, a child process) gets past: it can read your files "
    "and the benchmark's answers, reach the network and keep state between runs"
)
_lock = threading.Lock()
_state = {"allowed": False, "warned": False}


class WeakSandboxError(RuntimeError):
    """The sandbox would run generated code without OS isolation and the user did not accept it."""


class WeakSandboxWarning(UserWarning):
    """Generated code runs with the audit hook alone, as the user accepted."""


def allow_weak_sandbox(allowed: bool = True) -> None:
    """Accept (or stop accepting) the audit-hook level for this process."""
    with _lock:
        _state["allowed"] = allowed


def weak_sandbox_allowed() -> bool:
    """Whether the user accepted the audit-hook level (the flag or the environment variable)."""
    value = os.environ.get(ALLOW_WEAK_VAR, "").strip().lower()
    return _state["allowed"] or value in ("1", "true", "yes")


def weak_sandbox_message(sandbox: Sandbox, what: str) -> str:
    """Why ``what`` does not run, what would make it safe, and how to accept the risk."""
    reasons = "; ".join(f"{level}: {why}" for level, why in sandbox.unavailable.items())
    return (
        f"{what}: this host provides no OS isolation for generated code"
        + (f" ({reasons})" if reasons else "")
        + ". Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or allow user "
        "namespaces to get it; or accept the audit-hook sandbox with "
        f"{ALLOW_WEAK_FLAG} (or {ALLOW_WEAK_VAR}=1): {WHAT_IS_ACCEPTED}"
    )


def require_full_isolation(sandbox: Sandbox, what: str) -> None:
    """Return if ``sandbox`` isolates fully or the user accepted less (warning once);
    otherwise raise :class:`WeakSandboxError` naming the flag that accepts it."""
    if sandbox.level in FULL_LEVELS:
        return
    if not weak_sandbox_allowed():
        raise WeakSandboxError(weak_sandbox_message(sandbox, what))
    with _lock:
        warned, _state["warned"] = _state["warned"], True
    if not warned:
        warnings.warn(
            WeakSandboxWarning(
                f"{what}: generated code runs under the audit-hook sandbox ({ALLOW_WEAK_FLAG}): "
                + WHAT_IS_ACCEPTED
            ),
            stacklevel=2,
        )
