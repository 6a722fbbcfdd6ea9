"""The evaluator is the one owner of an item's journal: it opens it once per item, the backend
only appends, and the summary after the last reply reads the rows that one journal object
holds, never the file again (the small-journal fast path of ``store.journal``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.store import item_rows
from pytest_modelbench.store.journal import Journal
from tests.conftest import Project, configure

N = 40


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The journals the evaluator opened, and each journal object's reads of its file."""
    seen: dict[str, Any] = {"opened": [], "scans": {}}
    open_rows, scan = item_rows.ItemRows.open.__func__, Journal._scan  # type: ignore[attr-defined]

    def counting_open(cls: type[item_rows.ItemRows], journal: Journal) -> item_rows.ItemRows:
        seen["opened"].append(journal)
        rows: item_rows.ItemRows = open_rows(cls, journal)
        return rows

    def counting_scan(self: Journal) -> Any:
        seen["scans"][id(self)] = seen["scans"].get(id(self), 0) + 1
        return scan(self)

    monkeypatch.setattr(item_rows.ItemRows, "open", classmethod(counting_open))
    monkeypatch.setattr(Journal, "_scan", counting_scan)
    return seen


def _item_dir(project: Project) -> Path:
    (run_dir,) = project.run_dirs()
    return run_dir / "alpha-qa-seed0"


def test_an_item_summary_reads_its_journal_once_fresh_or_resumed(
    project: Project, sim: Any, reads: dict[str, Any]
) -> None:
    server = sim(accuracy=0.6, lookup={})
    configure(project, server.base_url, n=N)
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (journal,) = reads["opened"]
    # the repair's one look at the (absent) file; the summary used the rows held since
    assert reads["scans"].get(id(journal)) == 1
    assert journal.path == _item_dir(project) / "results.jsonl"
    assert len(journal.path.read_text().splitlines()) == N

    # a kill after 25 rows: the same command resumes; the journal is read once, at its start
    item = _item_dir(project)
    lines = (item / "results.jsonl").read_text().splitlines(keepends=True)
    (item / "results.jsonl").write_text("".join(lines[:25]))
    (item / "summary.json").unlink()
    reads["opened"].clear()
    project.pytester.runpytest("benchmarks/", "--model", "alpha").assert_outcomes(passed=1)
    (journal,) = reads["opened"]
    assert reads["scans"].get(id(journal)) == 1
    assert len(journal.path.read_text().splitlines()) == N
