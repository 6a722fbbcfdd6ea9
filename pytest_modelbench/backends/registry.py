"""Which backend evaluates a ``module``: built-in suites, ``jsonl``, and the prefixed extras.

This is the default implementation behind the ``pytest_modelbench_make_backend``
hook. The prefixed backends (``verifiers:<env_id>``, ``lm_eval:<task>``) are
named by module path and imported only when a variant uses them, so their
heavy packages stay out of sessions that do not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pytest_modelbench.backends.jsonl_suite import JsonlSuite
from pytest_modelbench.backends.protocol import Backend
from pytest_modelbench.backends.solutions import SolutionsOrSuite
from pytest_modelbench.backends.suite_backend import SuiteBackend
from pytest_modelbench.config.modules import missing_name
from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.suites import BUILTIN_SUITES


def _builtin_factory(module: str) -> Callable[[], Any] | None:
    """The factory of a built-in suite or ``jsonl``; only that suite's module is imported."""
    if module == "jsonl":
        return JsonlSuite
    return BUILTIN_SUITES.get(module)


def known_module_names() -> list[str]:
    """Names accepted as ``module:`` (built-in suites plus the prefixed backends)."""
    return [*sorted([*BUILTIN_SUITES, "jsonl"]), "verifiers:<env_id>", "lm_eval:<task>"]


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


PREFIXED_BACKENDS: dict[str, PrefixedBackend] = {
    "verifiers": PrefixedBackend(
        "verifiers",
        "pytest_modelbench.backends.verifiers_backend",
        "VerifiersBackend",
    ),
    "lm_eval": PrefixedBackend(
        "lm_eval",
        "pytest_modelbench.backends.lm_eval_backend",
        "LmEvalBackend",
    ),
}


def _resolve_prefixed(module: str) -> Backend | None:
    prefix, _, name = module.partition(":")
    spec = PREFIXED_BACKENDS.get(prefix)
    if spec is None:
        return None
    missing = missing_name(module)
    if missing is not None:
        raise ModelbenchUsageError(f"module {module!r}: {missing}")
    name = name.strip()
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
        factory = _builtin_factory(module)
        if factory is None:
            return None
        backend = SolutionsOrSuite(SuiteBackend(factory()))
    if backend is not None:
        _BACKEND_CACHE[module] = backend
    return backend
