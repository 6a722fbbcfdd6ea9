"""pytest-html integration: score columns, per-item extras, and charts in the summary section.

Registered on the controller only when pytest-html is active (``--html``).
Everything is computed from the reports' ``mb_*`` user properties and the
run store, so it works the same with ``-n N``. Sortable columns: pytest-html
sorts on the cell text, so each numeric cell starts with an HTML comment
holding a fixed-width key (invisible in the page).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.reporting.html import item_fragment, summary_fragment, verdict_class
from pytest_modelbench.reporting.model import ItemRecord, RunData, build_item, load_run
from pytest_modelbench.store.records import PROPERTY_PREFIX
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runlog import read_run

_MISSING_KEY = "~"  # sorts after every number key
_CELL_CLASS = re.compile(r'<td class="col-(mb[a-z]+)[" ]')

# (column id, header, value of an ItemRecord, numeric?)
COLUMNS: tuple[tuple[str, str, Callable[[ItemRecord], Any], bool], ...] = (
    ("mbmodel", "Model", lambda i: i.model, False),
    ("mbenv", "Environment", lambda i: i.variant, False),
    ("mbseed", "Seed", lambda i: i.seed, True),
    ("mbmetric", "Metric", lambda i: i.metric, False),
    ("mbscore", "Score", lambda i: i.score, True),
    ("mbci", "95% CI", lambda i: (i.ci_low, i.ci_high), False),
    ("mbbaseline", "Baseline", lambda i: i.baseline, True),
    ("mbdelta", "Δ", lambda i: i.delta, True),
    ("mbverdict", "Verdict", lambda i: i, False),  # the record: its verdict and the text
    ("mbn", "n", lambda i: i.n, True),
    ("mberrors", "Errors", lambda i: i.errors, True),
    ("mbevaltime", "Eval time (s)", lambda i: i.duration_s, True),
    ("mbtokens", "Tokens", lambda i: i.tokens, True),
)
INSERT_AT = 2  # after pytest-html's Result and Test columns


def sort_key(value: Any) -> str:
    """A string whose lexical order is the numeric order (pytest-html compares strings)."""
    if value is None or isinstance(value, bool):
        return _MISSING_KEY
    try:
        number = float(value)
    except (TypeError, ValueError):
        return _MISSING_KEY
    return f"{number + 1e12:022.6f}"


def _cell(column: str, value: Any, numeric: bool) -> str:
    if column == "mbci":
        low, high = value
        text = "-" if low is None or high is None else f"[{low:.3f}, {high:.3f}]"
        return f'<td class="col-{column}"><!--{sort_key(low)}-->{text}</td>'
    if numeric:
        if value is None:
            shown = "-"
        elif isinstance(value, int):
            shown = f"{value:,}"
        else:
            shown = f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
        return f'<td class="col-{column}"><!--{sort_key(value)}-->{shown}</td>'
    if column == "mbverdict":
        css, text = verdict_class(value.verdict), value.verdict_text
        return f'<td class="col-{column} {css}">{escape(text or "-")}</td>'
    return f'<td class="col-{column}">{escape(str(value or "-"))}</td>'


def _column_of(cell: str) -> str:
    """The column id of a rendered cell (``<td class="col-mbverdict ...">``), or ""."""
    match = _CELL_CLASS.match(cell)
    return match.group(1) if match else ""


def mb_item_id(report: pytest.TestReport) -> str | None:
    """The benchmark item a report is of (its ``mb_item`` property), or None for other tests."""
    item_id = dict(report.user_properties).get(PROPERTY_PREFIX + "item")
    return item_id if isinstance(item_id, str) else None


class HtmlReportColumns:
    """pytest-html hooks; ``run_dir`` is resolved lazily (the session decides it)."""

    def __init__(
        self,
        run_dir: Callable[[], Path],
        records: Callable[[], tuple[list[EvalResult], dict[str, str]]],
        examples: int,
    ) -> None:
        self._run_dir = run_dir
        self._records = records
        self.examples = examples

    def item_record(self, item_id: str, outcome: str) -> ItemRecord:
        """The item as the report shows it, from the record its worker saved."""
        (item,) = read_run(self._run_dir(), ids=[item_id]).items
        return build_item(item, outcome)

    def refresh(self, test: dict[str, Any], report: pytest.TestReport) -> None:
        """Re-render a test pytest-html rendered before Holm settled its item: its modelbench
        cells (the verdict and its colour) and its modelbench extra (the paragraph), from the
        record saved with the final verdict."""
        item_id = mb_item_id(report)
        if item_id is None:
            return
        item = self.item_record(item_id, report.outcome)
        fresh = {c: _cell(c, get(item), numeric) for c, _, get, numeric in COLUMNS}
        test["resultsTableRow"] = [
            fresh.get(_column_of(cell), cell) for cell in test.get("resultsTableRow", [])
        ]
        for extra in test.get("extras", []):
            if isinstance(extra, dict) and extra.get("name") == "modelbench":
                extra["content"] = self._fragment(item)

    def _fragment(self, item: ItemRecord) -> str:
        run_dir = self._run_dir()
        run = RunData(run_id=run_dir.name, directory=run_dir, items=(item,))
        return item_fragment(run, item, self.examples)

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        headers = [
            f'<th class="sortable" data-column-type="{column}">{escape(title)}</th>'
            for column, title, _, _ in COLUMNS
        ]
        cells[INSERT_AT:INSERT_AT] = headers

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        item_id = mb_item_id(report)
        if item_id is None:
            cells[INSERT_AT:INSERT_AT] = [f'<td class="col-{c}"></td>' for c, _, _, _ in COLUMNS]
            return
        item = self.item_record(item_id, report.outcome)
        cells[INSERT_AT:INSERT_AT] = [
            _cell(c, get(item), numeric) for c, _, get, numeric in COLUMNS
        ]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Attach the gate paragraph and failing examples as an HTML extra (pytest-html reads
        it at teardown)."""
        if not (report.when == "call" or (report.when == "setup" and report.failed)):
            return
        item_id = mb_item_id(report)
        if item_id is None:
            return
        item = self.item_record(item_id, report.outcome)
        extra = {
            "name": "modelbench",
            "format_type": "html",
            "mime_type": None,
            "extension": None,
            "content": self._fragment(item),
        }
        report.extras = [*getattr(report, "extras", []), extra]  # type: ignore[attr-defined]

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_summary(self, prefix: list[str]) -> None:
        records, outcomes = self._records()
        if not records:
            return
        run = load_run(self._run_dir(), records, outcomes=outcomes, only_records=True)
        prefix.append(summary_fragment(run))
