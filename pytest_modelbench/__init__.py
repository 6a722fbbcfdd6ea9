"""pytest-modelbench: LLM benchmarks as pytest items."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_modelbench.store.result import EvalResult

__version__ = "0.1.0"
__all__ = ["EvalResult", "__version__"]


def __getattr__(name: str) -> Any:
    """``EvalResult`` on first use: importing the package (every pytest session loads its
    plugins) must not load the run store."""
    if name == "EvalResult":
        # lazily: the run store loads only when a test names EvalResult (pytest start-up)
        from pytest_modelbench.store.result import EvalResult

        return EvalResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
