"""The :class:`Backend` protocol and the default module resolution."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
        """Everything besides model/sampling/seed that changes results (data, scorer version)."""
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


@dataclass(frozen=True)
class PrefixedBackend:
    """A backend addressed as ``<prefix>:<name>``, living in an optional extra.

    ``module`` and ``factory`` name the class lazily; the module is ours and thin
    (the heavy package is imported only when an item runs). Its ``require_extra``
    checks the extra is installed in a supported version, else raises a usage
    error that names the install command.
    """

    prefix: str
    module: str
    factory: str
    what: str  # what follows the colon, for messages ("environment id", "task name or YAML path")


PREFIXED_BACKENDS: dict[str, PrefixedBackend] = {
    "verifiers": PrefixedBackend(
        "verifiers",
        "pytest_modelbench.backends.verifiers_backend",
        "VerifiersBackend",
        "environment id",
    ),
    "lm_eval": PrefixedBackend(
        "lm_eval",
        "pytest_modelbench.backends.lm_eval_backend",
        "LmEvalBackend",
        "task name or task YAML path",
    ),
}


def _resolve_prefixed(module: str) -> Backend | None:
    prefix, _, name = module.partition(":")
    spec = PREFIXED_BACKENDS.get(prefix)
    if spec is None:
        return None
    from pytest_modelbench.errors import ModelbenchUsageError

    name = name.strip()
    if not name:
        raise ModelbenchUsageError(
            f"module {module!r}: give the {spec.what} after the colon: '{prefix}:<{spec.what}>'"
        )
    backend_module = importlib.import_module(spec.module)  # our thin module: no heavy import
    backend_module.require_extra(module)  # raises with "pip install 'pytest-modelbench[...]'"
    backend: Backend = getattr(backend_module, spec.factory)(name)
    return backend


def resolve_builtin(module: str) -> Backend | None:
    """The default resolution: built-in suites, ``jsonl`` and the prefixed backends
    (``verifiers:<env_id>``, ``lm_eval:<task>``); None when unknown.

    A suite backend also scores pre-generated solution files when the item's
    model has ``solutions:`` (see :mod:`pytest_modelbench.backends.solutions`).
    """
    if module in _BACKEND_CACHE:
        return _BACKEND_CACHE[module]
    backend: Backend | None
    if ":" in module:
        backend = _resolve_prefixed(module)
    else:
        factories = _builtin_factories()
        if module not in factories:
            return None
        from pytest_modelbench.backends.solutions import SolutionsOrSuite
        from pytest_modelbench.backends.suite_backend import SuiteBackend

        backend = SolutionsOrSuite(SuiteBackend(factories[module]()))
    if backend is not None:
        _BACKEND_CACHE[module] = backend
    return backend


@contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Keep a chatty library logger (lm-eval, verifiers log every batch at INFO) at WARNING while it runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)
