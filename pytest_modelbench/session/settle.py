"""Holm's final step: items whose verdict waited for the others' p-values get their outcome.

Under ``--mb-correction holm`` an item is decided when it finishes whenever its own p-value
settles it (``gating.gates.holm_decided``: the final rule, at the two extremes of the other
p-values). Only an item in between waits. Its test shows ``holm-pending`` while it waits, and
when the session ends ``holm_adjust_verdicts`` (the same rule, once, over the p-values the
workers saved) gives it its final outcome in every channel that has seen its report: the test
report itself (the terminal's counts, FAILURES section and short summary read it), JUnit,
``--lf`` (pytest's record and modelbench's crash-proof one), pytest-html and the exit code.
Reports, trackers and the ``pytest_modelbench_item_finished`` hook read the settled records.

Why the outcome is edited after reporters saw it, rather than settled before: pytest hands a
report to every reporter in one ``pytest_runtest_logreport`` call, made as the test finishes
(``_pytest.runner.call_and_report``; under xdist ``DSession.worker_testreport`` on the
controller, as each worker's report arrives). That hook is not ``firstresult`` and a wrapper
must run the other implementations exactly once, so no plugin can hold a report back or
re-order it; a waiting item's outcome depends on p-values of items that finish later, possibly
on other workers, which learn nothing back from the controller before they end. Holding the
report on the worker would need such a channel, and would hide the ``HOLM-PENDING`` line users
watch. So every edit of another plugin's state is here, one function per reporter, each
checked by ``tests/core/test_holm_channels.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_modelbench.store.records import PROPERTY_PREFIX
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.verdict import GateVerdict, Verdict

if TYPE_CHECKING:  # pytest's JUnit plugin loads only with --junitxml
    from _pytest.junitxml import _NodeReporter

PENDING = "holm-pending"  # the terminal category of an item waiting for Holm's final step
VERDICT_PROPERTY = PROPERTY_PREFIX + "verdict"


@dataclass
class PendingItem:
    """An item Holm has yet to decide: its call report, and the JUnit entry made from it."""

    report: pytest.TestReport
    junit: _NodeReporter | None = None  # pytest's JUnit entry, when --junitxml is on


class HolmStep:
    """Controller-side ``--mb-correction holm``: holds the tests of items waiting for the
    other p-values, and at session end decides every tested item once and settles them."""

    def __init__(self, config: pytest.Config, announce: Callable[[EvalResult], None]) -> None:
        self.config = config
        self._announce = announce  # pytest_modelbench_item_finished, for a settled item
        # the tests of items Holm has yet to decide (several tests may share an item)
        self._pending: dict[str, list[PendingItem]] = {}
        self.failures: list[str] = []  # the messages of the items Holm fails

    def hold(self, report: pytest.TestReport, result: EvalResult) -> None:
        """Keep a waiting item's test (and its JUnit entry) until the final step."""
        self._pending.setdefault(result.item_id, []).append(
            PendingItem(report, _junit_entry(self.config, report))
        )

    def settle_all(
        self, session: pytest.Session, records: list[EvalResult], outcomes: dict[str, str]
    ) -> list[EvalResult]:
        """Holm over every tested verdict (the family of size m the workers decided with);
        items that waited get their final outcome everywhere (``outcomes`` too), any failure
        fails the run; returns ``records`` with the final verdicts."""
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.gating.gates import holm_adjust_verdicts

        tested = [r for r in records if r.verdict is not None and r.holm_family]
        family = max([len(tested), *(r.holm_family or 0 for r in tested)], default=0)
        # items of the family without a p-value (an error, nothing computed) count as p = 1
        absent = GateVerdict(passed=True, rule="none", metric="", value=0.0, alpha=0.0, p_value=1.0)
        verdicts = [r.verdict for r in tested if r.verdict is not None]
        # each item is decided at its own alpha (a baseline entry may set one)
        settled = holm_adjust_verdicts([*verdicts, *[absent] * (family - len(verdicts))])[
            : len(verdicts)
        ]
        final = {
            r.item_id: dataclasses.replace(r, verdict=v, gate_deferred=False)
            for r, v in zip(tested, settled, strict=True)
        }
        for result in final.values():
            with contextlib.suppress(OSError):
                result.save()  # the record is rewritten once, with its final verdict
            if result.verdict is not None and not result.verdict.passed:
                self.failures.append(result.message)
            waiting = self._pending.pop(result.item_id, [])
            for test in waiting:
                settle(self.config, session, test, result.status, result.message)
                if test.report.failed:
                    outcomes[result.item_id] = test.report.outcome
            if waiting:
                self._announce(result)
        if self.failures and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return [final.get(r.item_id, r) for r in records]

    def write_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """The terminal's section of the items Holm failed."""
        if self.failures:
            terminalreporter.write_sep("=", "regressions after Holm correction", red=True)
            for message in self.failures:
                terminalreporter.write_line(message)


def pending_status(
    report: pytest.TestReport, result: EvalResult | None
) -> tuple[str, str, str] | None:
    """The terminal's (category, letter, word) of a passed call whose item's saved record
    (``result``) waits for Holm."""
    if report.when != "call" or not report.passed or result is None or not result.gate_deferred:
        return None
    return (PENDING, "h", "HOLM-PENDING")


def settle(
    config: pytest.Config,
    session: pytest.Session,
    item: PendingItem,
    verdict: Verdict,
    message: str,
) -> None:
    """Give a waiting item its final verdict (``pass`` or ``fail``) everywhere."""
    report = item.report
    report.user_properties = [
        (name, verdict.value if name == VERDICT_PROPERTY else value)
        for name, value in report.user_properties
    ]
    failed = verdict.failed
    if failed:
        report.outcome = "failed"
        report.longrepr = message
        session.testsfailed += 1
    _terminal(config, report, "failed" if failed else "passed")
    _junit(config, item, verdict.value, message if failed else None)
    _pytest_html(config, report, message if failed else None)
    if failed:
        _lastfailed(config, report)


def _terminal(config: pytest.Config, report: pytest.TestReport, category: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    waiting = reporter.stats.get(PENDING, [])
    if report in waiting:
        waiting.remove(report)
        if not waiting:
            del reporter.stats[PENDING]
    reporter.stats.setdefault(category, []).append(report)


def _junit(config: pytest.Config, item: PendingItem, verdict: str, failure: str | None) -> None:
    # lazily: only sessions that settle an item with --junitxml load pytest's JUnit plugin
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None or item.junit is None:
        return
    case: ET.Element = item.junit.to_xml()  # finalized at teardown: the testcase element
    for prop in case.iter("property"):
        if prop.get("name") == VERDICT_PROPERTY:
            prop.set("value", verdict)
    if failure is not None:
        node = ET.Element("failure", message=failure.splitlines()[0][:200])
        node.text = failure
        case.append(node)
        xml.stats["passed"] -= 1
        xml.stats["failure"] += 1


def _lastfailed(config: pytest.Config, report: pytest.TestReport) -> None:
    for name in ("lfplugin", "modelbench-lastfailed"):
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is None:
            continue
        if name == "lfplugin":
            plugin.lastfailed[report.nodeid] = True
        else:
            plugin.pytest_runtest_logreport(report)


def _pytest_html(config: pytest.Config, report: pytest.TestReport, failure: str | None) -> None:
    """pytest-html rendered the test at teardown, as waiting; its data get the final verdict:
    the outcome here, the modelbench cells (the verdict among them) and paragraph re-rendered by
    ``modelbench-html`` from the record saved with that verdict."""
    columns = config.pluginmanager.get_plugin("modelbench-html")
    for plugin in config.pluginmanager.get_plugins():
        data = getattr(getattr(plugin, "_report", None), "data", None)
        outcomes = getattr(getattr(plugin, "_report", None), "outcomes", None)
        if not isinstance(data, dict) or "tests" not in data or not isinstance(outcomes, dict):
            continue
        for test in data["tests"].get(report.nodeid, []):
            cells = list(test.get("resultsTableRow", []))
            if failure is not None:
                test["result"] = "Failed"
                cells = [cell.replace(">Passed<", ">Failed<") for cell in cells]
                test["log"] = f"{failure}\n{test.get('log', '')}"
                outcomes["passed"]["value"] -= 1
                outcomes["failed"]["value"] += 1
            test["resultsTableRow"] = cells
            if columns is not None:
                columns.refresh(test, report)


def _junit_entry(config: pytest.Config, report: pytest.TestReport) -> _NodeReporter | None:
    """pytest's JUnit entry of a test (``--junitxml``), or None."""
    # lazily: only sessions with an item waiting for Holm get here
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    return xml.node_reporter(report) if xml is not None else None
