"""Controller-side: each benchmark item's record as its reports arrive (from any worker),
its pytest outcome, and ``pytest_modelbench_item_finished`` for it."""

from __future__ import annotations

import pytest

from pytest_modelbench.secrets import redact
from pytest_modelbench.session.rundir import RunDirectory
from pytest_modelbench.store.records import PROPERTY_PREFIX
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import RunStore
from pytest_modelbench.store.summary import EMPTY


class ItemResults:
    """The records the workers saved, read once per item, in the order the items finished."""

    def __init__(self, config: pytest.Config, runs: RunDirectory) -> None:
        self.config = config
        self._runs = runs
        self.records: list[EvalResult] = []  # one per finished item
        self.outcomes: dict[str, str] = {}  # item id -> pytest outcome
        self.hook_failures: list[str] = []  # listeners of pytest_modelbench_item_finished

    def add(self, report: pytest.TestReport) -> tuple[EvalResult, bool] | None:
        """The record of a benchmark item's call (or failed setup) report, and whether it is
        the item's first test (several tests may share one item); None for other reports."""
        if not (report.when == "call" or (report.when == "setup" and report.failed)):
            return None
        result = self.result_of(report)
        if result is None:
            return None
        first = result.item_id not in self.outcomes
        if first:
            self.records.append(result)
        if first or report.failed:
            self.outcomes[result.item_id] = report.outcome
        return result, first

    def result_of(self, report: pytest.TestReport) -> EvalResult | None:
        """The record the worker saved for a benchmark item's report (None: another test)."""
        shown = {k[len(PROPERTY_PREFIX) :]: v for k, v in report.user_properties}
        item_id = shown.get("item")
        run_dir = self._runs.chosen
        if not isinstance(item_id, str) or run_dir is None:
            return None
        directory = RunStore(run_dir).item(item_id).directory
        saved = EvalResult.load(directory) if not report.failed or report.when == "call" else None
        if saved is not None:
            return saved
        # nothing saved (the store could not be written): what the properties say
        return EvalResult(
            item_id=item_id,
            model=str(shown.get("model")),
            env=str(shown.get("env")),
            variant=str(shown.get("variant")),
            seed=int(str(shown.get("seed") or 0)),
            metric="",
            summary=EMPTY,
            directory=directory,
            error=str(shown.get("error") or report.longreprtext or "no result"),
        )

    def announce(self, result: EvalResult) -> None:
        """``pytest_modelbench_item_finished`` for an item with a result, on the controller (items
        of every worker arrive here), with the record the worker saved."""
        hook = self.config.hook.pytest_modelbench_item_finished
        if not hook.get_hookimpls() or result.error is not None or not result.summary:
            return  # nobody listens (the common case costs nothing), or the item has no result
        try:
            hook(  # the summary.json object, a plain dict the listener may keep, change or dump
                config=self.config,
                item_id=result.item_id,
                summary=result.summary.to_json(),
                result=result,
            )
        except Exception as exc:  # a listener's bug must not stop the session (INTERNALERROR)
            self.hook_failures.append(
                f"pytest_modelbench_item_finished raised for {result.item_id}: "
                f"{type(exc).__name__}: {redact(str(exc))[:300]}"
            )
