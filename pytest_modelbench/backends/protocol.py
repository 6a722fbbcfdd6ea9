"""The :class:`Backend` protocol: what evaluates the items of one ``module`` kind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.running.endpoint import Endpoint
from pytest_modelbench.running.progress import ProgressSink
from pytest_modelbench.store.runstore import ItemStore

if TYPE_CHECKING:
    from pytest_modelbench.gating.early import StopRule


@dataclass(frozen=True)
class ItemContext:
    """What a backend needs to evaluate one item. The endpoint is resolved on first use, so an
    item whose journal already holds every example starts no server and sends nothing."""

    item: PlannedItem
    resolve_endpoint: Callable[[], Endpoint]
    store: ItemStore
    error_budget: float
    progress: ProgressSink
    stop_rule: StopRule | None = None  # --mb-stop-early: when the item's verdict is certain

    @cached_property
    def endpoint(self) -> Endpoint:
        return self.resolve_endpoint()


class Backend(Protocol):
    """Evaluates items of one ``module`` kind and writes their journal rows.

    ``count_examples`` and ``fingerprint_parts`` may load data and are used for
    the plan and fingerprints; ``evaluate`` does the requests and returns the
    summary fields (the evaluator completes and writes ``summary.json``).
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
