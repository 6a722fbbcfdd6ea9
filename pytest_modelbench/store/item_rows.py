"""An item's journal while it runs: the item-state API its one owner (the evaluator) uses.

:meth:`ItemStore.open_rows <pytest_modelbench.store.runstore.ItemStore.open_rows>` repairs the
journal and reads which units are done (resume); the backend receives the :class:`ItemRows`
as a :class:`RowSink` and appends its rows; the evaluator closes it and summarises the rows,
then :meth:`ItemStore.finish <pytest_modelbench.store.runstore.ItemStore.finish>` writes the
summary and the manifest entry. One :class:`~pytest_modelbench.store.journal.Journal` object
serves the whole span, so a small journal's rows are parsed once (see its module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from pytest_modelbench.store.journal import Journal, Key, Row


class RowSink(Protocol):
    """Where a backend puts the journal rows of the item it runs (one row per example and
    rollout, a :class:`~pytest_modelbench.store.records.JournalRow`); it never opens, resumes,
    summarises or finishes the journal itself."""

    def done_keys(self) -> frozenset[Key]:
        """(example, rollout) keys whose last row has no error: the units a resume skips."""
        ...

    def rows(self, keep: Callable[[Key], bool] | None = None) -> Iterator[Row]:
        """The journal's last row per key that ``keep`` accepts, in file order (read them,
        don't change them)."""
        ...

    def append(self, row: Mapping[str, Any]) -> None:
        """Journal one finished row (flushed to the OS before this returns)."""
        ...

    def stopped(self) -> bool:
        """Whether the item should take no more units (``--mb-stop-early``: its verdict is
        certain); a run loop asks after each row."""
        ...

    def parse_ahead(self, count: int) -> bool:
        """Read up to ``count`` more rows for the summary now (while the item's last replies
        are awaited, say); whether any are left. Only a speed-up: it may do nothing."""
        ...


class ItemRows:
    """The journal of one item from the evaluator's open to its close: the :class:`RowSink`
    its backend writes to. The file is opened for appending when it exists, else created by
    the first row (a backend that fails before its first row leaves no journal)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._done: frozenset[Key] = frozenset()
        self._opened = False

    @classmethod
    def open(cls, journal: Journal) -> ItemRows:
        """Repair the journal (a crash may have torn its last line) and read what is done."""
        rows = cls(journal)
        journal.repair()
        rows._done = frozenset(journal.finished_keys())
        if journal.path.exists():
            rows._open()
        return rows

    def _open(self) -> None:
        self.journal.open()
        self._opened = True

    def done_keys(self) -> frozenset[Key]:
        return self._done

    def rows(self, keep: Callable[[Key], bool] | None = None) -> Iterator[Row]:
        return self.journal.latest(keep)

    def append(self, row: Mapping[str, Any]) -> None:
        if not self._opened:
            self._open()
        self.journal.append(row)

    def stopped(self) -> bool:
        return False

    def parse_ahead(self, count: int) -> bool:
        return self.journal.parse_ahead(count)

    def close(self) -> None:
        """fsync and close (the rows survive a machine crash from here on)."""
        self.journal.close()


__all__ = ["ItemRows", "RowSink"]
