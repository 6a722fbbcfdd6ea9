"""How this session gates its items: the baseline book, Holm's family, the stop rules of
``--mb-stop-early``, and an item's verdict (decided at once, or waiting for Holm's final
step, ``session/settle.py``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.planning.item import Plan, PlannedItem
from pytest_modelbench.session.rundir import RunDirectory
from pytest_modelbench.store.result import EvalResult

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from pytest_modelbench.backends.protocol import Backend
    from pytest_modelbench.gating.baselines import BaselineBook
    from pytest_modelbench.gating.early import StopRule


class ItemGates:
    """The session's baselines and Holm's family, read once; gates each finished item."""

    def __init__(
        self,
        options: RunOptions,
        plan: Callable[[], Plan],
        selected: Callable[[], list[PlannedItem] | None],
        runs: RunDirectory,
        backend_for: Callable[[str], Backend | None],
    ) -> None:
        self.options = options
        self._plan = plan  # the session's plan, built when first needed
        self._selected = selected  # the items left after deselection (-k, --lf), once known
        self._runs = runs
        self._backend_for = backend_for
        self._book: BaselineBook | None = None
        self._family: int | None = None

    def book(self) -> BaselineBook:
        """The baselines this run's items are gated on (reference runs beside the run)."""
        if self._book is None:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.gating.baselines import BaselineBook

            self._book = BaselineBook(
                self.options.config_dir / "baselines",
                self._runs.path.parent,
                require=self.options.require_baseline,
                baseline_run=self.options.baseline_run,
                baseline_model=self.options.baseline_model,
                allow_unfinished=self.options.allow_unfinished_baseline,
                stop_early=self.options.stop_early,
                require_same_setup=self.options.require_same_setup,
            )
            self._book.family = self.family  # the stop rule's alpha / m under Holm
        return self._book

    def planning_book(self) -> BaselineBook:
        """``--collect-only``: a book that reads baseline files and reference runs only."""
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.gating.baselines import BaselineBook

        parent, _ = self._runs.parent()
        book = BaselineBook(
            self.options.config_dir / "baselines",
            parent,
            baseline_run=self.options.baseline_run,
            baseline_model=self.options.baseline_model,
            allow_unfinished=self.options.allow_unfinished_baseline,
            stop_early=self.options.stop_early,
        )
        if self.options.stop_early:
            book.family = self.family
        return book

    @property
    def family(self) -> int | None:
        """``--mb-correction holm``: how many selected items have a statistical gate (Holm's
        m, known before any item runs, so an item's own p-value can decide it at once)."""
        if self.options.correction != "holm":
            return None
        if self._family is None:
            items = self._selected() or self._plan().items
            self._family = max(1, sum(map(self.tested, items)))
        return self._family

    def tested(self, item: PlannedItem, book: BaselineBook | None = None) -> bool:
        """Whether an item's gate is a statistical test (a value or a reference run)."""
        if self.options.baseline_run:
            return True
        try:
            entries = (book or self.book()).entries(item.model_name)
        except ModelbenchUsageError:  # broken file: its items fail; count them (conservative)
            return True
        spec = entries.get(item.variant.id) or entries.get(item.env)
        return spec is not None and (spec.value is not None or spec.run is not None)

    def gate(self, result: EvalResult, item: PlannedItem) -> EvalResult:
        """The item's result with its verdict; under Holm, whether that waits for the others."""
        verdict = self.book().verdict(result)
        deferred = False
        if self.family is not None and verdict.p_value is not None:
            # lazily: loaded only when this runs, not at every pytest start-up
            from pytest_modelbench.gating.gates import holm_decided

            deferred = holm_decided(verdict, self.family) is None
        return dataclasses.replace(
            result,
            verdict=verdict,
            gate_deferred=deferred,
            holm_family=self.family if verdict.p_value is not None else None,
            model_path=item.model.model,
        )

    def stop_rule(self, item: PlannedItem, metric: str) -> StopRule | None:
        """``--mb-stop-early``: the item's stop rule from its baseline (early decisions at
        alpha / m under Holm)."""
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.gating.baselines import ItemRef

        ref = ItemRef(item.item_id, item.model_name, item.env, item.variant.id, item.seed)
        rollouts = item.variant.rollouts_per_example
        return self.book().stop_rule(ref, metric, self.family, rollouts)

    def planned_rule(self, book: BaselineBook, item: PlannedItem) -> StopRule | bool | None:
        """``--collect-only --mb-stop-early``: the item's stop rule; False where its backend runs
        its own loop to the end, None where no rule applies or the variant is broken (the run
        will say why)."""
        backend = self._backend_for(item.variant.module)
        if backend is None or not getattr(backend, "stops_early", False):
            return False
        try:
            metric = backend.primary_metric(item)
        except ModelbenchUsageError:  # the plan must print even when one variant is broken
            return None
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.gating.baselines import ItemRef

        ref = ItemRef(item.item_id, item.model_name, item.env, item.variant.id, item.seed)
        try:
            return book.stop_rule(ref, metric, self.family, item.variant.rollouts_per_example)
        except ModelbenchUsageError:  # a broken baseline file fails its items when they run
            return None
