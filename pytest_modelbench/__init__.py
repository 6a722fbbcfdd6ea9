"""pytest-modelbench: LLM benchmarks as pytest items."""

from __future__ import annotations

from pytest_modelbench.store.result import EvalResult

__version__ = "0.1.0"
__all__ = ["EvalResult", "__version__"]
