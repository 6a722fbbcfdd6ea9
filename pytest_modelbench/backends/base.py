"""The :class:`Backend` protocol and the default module resolution."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pytest_modelbench.endpoint import Endpoint
    from pytest_modelbench.plan import PlannedItem
    from pytest_modelbench.progress import ProgressSink
    from pytest_modelbench.store import ItemStore


@dataclass(frozen=True)
class ItemContext:
    """What a backend needs to evaluate one item."""

    item: PlannedItem
    endpoint: Endpoint
    store: ItemStore
    error_budget: float
    progress: ProgressSink


class Backend(Protocol):
    """Evaluates items of one ``module`` kind and writes their journal rows.

    ``describe`` is cheap-ish (may load data) and is used for the plan and
    fingerprints; ``evaluate`` does the requests and returns the summary
    metrics dict (the plugin writes ``summary.json``).
    """

    name: str

    def primary_metric(self, item: PlannedItem) -> str: ...

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        """Everything besides model/sampling/seed that changes results (data checksum, scorer version)."""
        ...

    def count_examples(self, item: PlannedItem) -> int: ...

    def tokens_per_example(self) -> int: ...

    def evaluate(self, ctx: ItemContext) -> dict[str, Any]:
        """Run (or continue) the item; return summary fields (metrics, n, errors...)."""
        ...


def _builtin_factories() -> dict[str, Callable[[], Any]]:
    factories: dict[str, Callable[[], Any]] = {}
    try:
        from pytest_modelbench.suites import BUILTIN_SUITES
    except ImportError:  # pragma: no cover - suites ship with the package
        BUILTIN_SUITES = {}
    factories.update(BUILTIN_SUITES)
    from pytest_modelbench.backends.jsonl_suite import JsonlSuite

    factories["jsonl"] = JsonlSuite
    return factories


def known_module_names() -> list[str]:
    """Names accepted as ``module:`` (built-in suites plus the prefixed backends)."""
    return [*sorted(_builtin_factories()), "verifiers:<env_id>", "lm_eval:<task>"]


_BACKEND_CACHE: dict[str, Backend] = {}


def resolve_builtin(module: str) -> Backend | None:
    """The default resolution: built-in suites and ``jsonl``; None when unknown."""
    if module in _BACKEND_CACHE:
        return _BACKEND_CACHE[module]
    factories = _builtin_factories()
    if module not in factories:
        return None
    from pytest_modelbench.backends.suite_backend import SuiteBackend

    backend = SuiteBackend(factories[module]())
    _BACKEND_CACHE[module] = backend
    return backend
