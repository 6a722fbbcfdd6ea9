"""Backends evaluate one item: built-in suites, generic JSONL data, and (as extras) verifiers / lm-eval."""

from __future__ import annotations

from pytest_modelbench.backends.base import (
    Backend,
    ItemContext,
    known_module_names,
    resolve_builtin,
)

__all__ = ["Backend", "ItemContext", "known_module_names", "resolve_builtin"]
