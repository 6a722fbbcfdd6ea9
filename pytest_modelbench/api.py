"""What third parties may rely on: the names here keep their meaning across releases.

Everything else in ``pytest_modelbench`` is private and may change. A conftest or plugin adds
a ``module:`` kind by implementing the ``pytest_modelbench_make_backend`` hook and returning a
:class:`Backend` (docs/api.md works one through); tests read an item's :class:`EvalResult`,
and tools read a whole run directory with :func:`read_run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_modelbench.backends.protocol import Backend, ItemContext, Outcome
from pytest_modelbench.backends.suite_backend import SuiteBackend
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.running.endpoint import Endpoint
from pytest_modelbench.running.progress import ProgressSink
from pytest_modelbench.store.item_rows import RowSink
from pytest_modelbench.store.records import JOURNAL_ROW_VERSION, ItemStatus, JournalRow
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runlog import RunItem, RunLog, RunNotFound, RunStatus, read_run
from pytest_modelbench.store.summary import ItemSummary, MetricSummary
from pytest_modelbench.store.verdict import Verdict
from pytest_modelbench.suites.contract import Example, Score, Suite, SuiteArgumentError

if TYPE_CHECKING:
    from pytest_modelbench.running.client import Completion, RequestFailed

__all__ = [
    "JOURNAL_ROW_VERSION",
    "Backend",
    "Completion",
    "Endpoint",
    "EvalResult",
    "EvaluationError",
    "Example",
    "ItemContext",
    "ItemStatus",
    "ItemSummary",
    "JournalRow",
    "MetricSummary",
    "ModelbenchUsageError",
    "Outcome",
    "PlannedItem",
    "ProgressSink",
    "RequestFailed",
    "RowSink",
    "RunItem",
    "RunLog",
    "RunNotFound",
    "RunStatus",
    "Score",
    "Suite",
    "SuiteArgumentError",
    "SuiteBackend",
    "Verdict",
    "read_run",
]


def __getattr__(name: str) -> Any:
    """``Completion`` and ``RequestFailed`` on first use: the HTTP client they come with
    (aiohttp) loads when an item sends requests, not when a conftest imports this module."""
    if name in ("Completion", "RequestFailed"):
        # lazily: aiohttp costs about 0.1 s of pytest's start-up
        from pytest_modelbench.running import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
