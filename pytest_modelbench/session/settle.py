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

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pytest_modelbench.store.records import PROPERTY_PREFIX
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.verdict import Verdict

if TYPE_CHECKING:  # pytest's JUnit plugin loads only with --junitxml
    from _pytest.junitxml import _NodeReporter

PENDING = "holm-pending"  # the terminal category of an item waiting for Holm's final step
VERDICT_PROPERTY = PROPERTY_PREFIX + "verdict"


@dataclass
class PendingItem:
    """An item Holm has yet to decide: its call report, and the JUnit entry made from it."""

    report: pytest.TestReport
    junit: _NodeReporter | None = None  # pytest's JUnit entry, when --junitxml is on


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
