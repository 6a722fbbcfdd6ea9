"""The :class:`Backend` protocol: what evaluates the items of one ``module`` kind.

A backend produces an item's journal rows and says which of them its summary covers
(:class:`Outcome`); the evaluator owns the journal (opens, resumes, summarises, finishes it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_modelbench.planning.item import PlannedItem
from pytest_modelbench.running.endpoint import Endpoint
from pytest_modelbench.running.progress import ProgressSink
from pytest_modelbench.store.item_rows import RowSink
from pytest_modelbench.store.journal import Key

if TYPE_CHECKING:
    from pytest_modelbench.gating.early import StopRule


@dataclass(frozen=True)
class ItemContext:
    """What a backend needs to evaluate one item. The endpoint is resolved on first use, so an
    item whose journal already holds every example starts no server and sends nothing."""

    item: PlannedItem
    resolve_endpoint: Callable[[], Endpoint]
    rows: RowSink  # the item's journal: what is done (resume), and where its rows go
    directory: Path  # the item's directory, for a backend's own files (lm-eval's request cache)
    fingerprint: str  # of everything that produces the item's results (planning/fingerprint.py)
    error_budget: float
    progress: ProgressSink
    stop_rule: StopRule | None = None  # --mb-stop-early: when the item's verdict is certain

    @cached_property
    def endpoint(self) -> Endpoint:
        return self.resolve_endpoint()


@dataclass(frozen=True)
class Outcome:
    """What a backend's ``evaluate`` returns: which journal rows the item's summary covers and
    the backend's own summary fields. The evaluator summarises those rows, the same way for
    every backend, and writes ``summary.json``."""

    expected: int  # units the item should have (examples x rollouts)
    selected: Callable[[Key], bool]  # the (example, rollout) keys the summary covers
    metric_names: Sequence[str] = ()  # metrics summarised even when no row has them
    resumed: int = 0  # units of the summary already done when the item started
    fields: Mapping[str, Any] = field(default_factory=dict)  # the backend's own summary fields
    metrics: Mapping[str, Any] | None = None  # computed by the backend (lm-eval), not from rows
    extra_metrics: Mapping[str, Any] = field(default_factory=dict)  # beside the rows' (aggregates)


class Backend(Protocol):
    """Evaluates items of one ``module`` kind by appending journal rows to ``ctx.rows``.

    ``count_examples`` and ``fingerprint_parts`` may load data and are used for
    the plan and fingerprints; ``evaluate`` does the requests and returns the
    :class:`Outcome` (the evaluator summarises it and writes ``summary.json``).
    """

    name: str

    def primary_metric(self, item: PlannedItem) -> str: ...

    def fingerprint_parts(self, item: PlannedItem) -> dict[str, Any]:
        """Everything besides model/sampling/seed that changes results (data, scorer version)."""
        ...

    def count_examples(self, item: PlannedItem) -> int: ...

    def tokens_per_example(self) -> int: ...

    def evaluate(self, ctx: ItemContext) -> Outcome:
        """Run (or continue) the item: append its rows to ``ctx.rows``; say what they cover."""
        ...
