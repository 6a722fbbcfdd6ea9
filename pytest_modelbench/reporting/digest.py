"""Session-end reports made while the items run.

After the last reply, session end reads every journal the session wrote to make
``results.parquet`` and ``report.html``: each row parsed, normalised and encoded twice,
about 0.1 s per 2000 examples while the user waits. An item spends most of its time waiting
on its server (and an xdist controller waits on its workers), so a background thread of the
controller reads each journal as it grows and makes its rows then. Session end takes them
when the journal is still the file they were read from, and reads the file as before
otherwise: a journal replaced (discarded, repaired, unshared), a damaged line, or more than
:data:`BUDGET_BYTES` read in the session.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pytest_modelbench.store.journal import last_per_key, parse_line

if TYPE_CHECKING:
    from pytest_modelbench.reporting.model import ItemRecord, RunData
    from pytest_modelbench.reporting.rows import PreparedRow

__all__ = ["BUDGET_BYTES", "Digests", "JournalDigest"]

POLL_S = 0.25  # how often the thread looks for new lines
BATCH = 64  # lines made at a time before the GIL is handed back (the event loop may share it)
# journal bytes held across the session (in memory about three times as much: each line as
# read, its parquet line and its report record; plus about 50 bytes a line for its key,
# score and error flag, which matters only for very short lines)
BUDGET_BYTES = 4 << 20
# imported with the first rows made, off session end's path (which imports them otherwise)
REPORT_MODULES = ("pytest_modelbench.reporting.html", "pytest_modelbench.reporting.leaderboard")


class _Made:
    """A journal's lines in file order, each with its key and what session end makes of it.
    Flat lists of strings, bytes and ints: nothing per line that the garbage collector tracks
    (rows kept as dicts would make every collection of the item's process walk them, which
    cost more than parsing them again at session end)."""

    __slots__ = ("errored", "ids", "lines", "parquet", "records", "rollouts", "scores")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.rollouts: list[int] = []
        self.lines: list[bytes] = []  # as read, parsed again at session end only if needed
        # None: the score needs the item's metric (and so do the next two)
        self.parquet: list[bytes | None] = []
        self.records: list[str | None] = []
        self.scores: list[float | None] = []
        self.errored: list[bool] = []

    def __len__(self) -> int:
        return len(self.lines)


class JournalDigest:
    """One journal's rows, read and made as it grows; :meth:`prepared` hands them over."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.spoiled = False  # read the file at session end instead
        self.size = 0  # bytes read
        self._handle: IO[bytes] | None = None  # open while the item runs
        self._identity: tuple[int, int] | None = None
        self._sealed: tuple[int, int, int, int] | None = None  # the file as its item left it
        self._tail = b""  # an unterminated last line, completed by a later read
        self._made = _Made()
        self._start_size = _size(path)  # a journal that never grows is never read

    @property
    def grown(self) -> bool:
        """Whether the journal was written since the item started (else it is never read)."""
        return (
            self._handle is not None
            or self._sealed is not None
            or _size(self.path) not in (self._start_size, None)
        )

    def advance(self, room: int) -> int:
        """Read and make the lines written since the last call; returns the bytes read.
        ``room``: bytes the session may still hold (past it, this digest gives up)."""
        if self.spoiled or self._sealed is not None:
            return 0
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return 0
        if self._handle is None or (stat.st_dev, stat.st_ino) != self._identity:
            self._reopen()  # first read, or the journal was replaced: start over
        assert self._handle is not None
        data = self._handle.read(max(room, 0) + 1)
        if len(data) > room:
            self.spoil()
            return 0
        self.size += len(data)
        self._make(data)
        return len(data)

    def _reopen(self) -> None:
        self.close()
        self._made, self._tail, self.size = _Made(), b"", 0
        self._handle = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        opened = os.fstat(self._handle.fileno())
        self._identity = (opened.st_dev, opened.st_ino)

    def _make(self, data: bytes) -> None:
        # lazily: the row makers load only once a journal grows, while its item waits on the
        # server (not during the item's start-up)
        from pytest_modelbench.reporting.examples import record_text
        from pytest_modelbench.reporting.rows import needs_metric, row_line, score_of

        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()
        made = self._made
        for start in range(0, len(lines), BATCH):
            for line in lines[start : start + BATCH]:
                if not line.strip():
                    continue
                parsed = parse_line(line)
                if parsed is None:
                    self.spoil()  # session end reads the file, and warns about the line
                    return
                key, row = parsed
                early = not needs_metric(row)
                made.ids.append(key[0])
                made.rollouts.append(key[1])
                made.lines.append(line)
                made.parquet.append(row_line(row, "") if early else None)
                made.records.append(record_text(row, "") if early else None)
                made.scores.append(score_of(row, "") if early else None)
                made.errored.append(bool(row.get("error")))
            time.sleep(0)  # hand the GIL back between batches

    def seal(self) -> None:
        """The item ended and everything it wrote was read: remember the file as it is (a
        later change means session end reads it) and close it, so that a session of many
        items holds no more open files than items running."""
        if self._handle is None or self.spoiled:
            return
        stat = os.fstat(self._handle.fileno())
        self._sealed = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        self.close()

    def prepared(self, metric: str) -> list[PreparedRow] | None:
        """The journal's rows as :meth:`Journal.latest` gives them, made; None when the file
        must be read instead. Call once everything written was read (:meth:`advance`)."""
        from pytest_modelbench.reporting.examples import record_text
        from pytest_modelbench.reporting.rows import PreparedRow, row_line, score_of

        if self.spoiled or not self._unchanged():
            return None
        made = self._made
        ready = []
        for n in last_per_key(zip(made.ids, made.rollouts, strict=True)):
            line = made.parquet[n]
            if line is not None:  # made while the item ran: parsed again only if picked
                ready.append(
                    PreparedRow(
                        made.lines[n],
                        line,
                        made.records[n],
                        score=made.scores[n],
                        errored=made.errored[n],
                    )
                )
                continue
            row = json.loads(made.lines[n])
            ready.append(
                PreparedRow(
                    row,
                    row_line(row, metric),
                    record_text(row, metric),
                    score=score_of(row, metric),
                    errored=made.errored[n],
                )
            )
        return ready

    def _unchanged(self) -> bool:
        """The journal is still the file that was read: open and the same inode, or sealed
        and the same inode, size and modification time (its inode may since have been reused)."""
        try:
            stat = self.path.stat()
        except OSError:
            return False
        if self._sealed is not None:
            return self._sealed == (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        return self._handle is not None and self._identity == (stat.st_dev, stat.st_ino)

    def spoil(self) -> None:
        """Give up (a damaged line, past the budget, an error): session end reads the file."""
        self.spoiled = True
        self._made = _Made()
        self.close()

    def close(self) -> None:
        """Close the file (the rows are kept)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            handle.close()


class Digests:
    """The controller's journal digests and the thread that advances those of running items."""

    def __init__(self, budget: int = BUDGET_BYTES, poll_s: float | None = None) -> None:
        self.budget = budget
        self.poll_s = POLL_S if poll_s is None else poll_s
        self._digests: dict[Path, JournalDigest] = {}
        self._running: dict[str, JournalDigest] = {}  # by pytest node id: polled
        self._held = 0  # bytes read by the digests kept
        self._reading = threading.Lock()  # one digest read at a time: the thread's or an end's
        self._warm = False  # REPORT_MODULES imported
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def started(self, nodeid: str, journal: Path) -> None:
        """An item started: read ``journal`` as it grows. Starts the thread once. An item run
        again (a rerun plugin) starts its journal over."""
        with self._lock:
            if self._stop.is_set():
                return
            old = self._digests.get(journal)
            if old is not None:
                with self._reading:
                    self._held -= 0 if old.spoiled else old.size
                    old.spoil()
            digest = self._digests[journal] = JournalDigest(journal)
            self._running[nodeid] = digest
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="modelbench-digest", daemon=True
                )
                self._thread.start()

    def finished(self, nodeid: str) -> None:
        """The item ended: its journal is read to the end and closed; session end checks it is
        unchanged. A journal that never grew (an item read from the store) is dropped."""
        with self._lock:
            digest = self._running.pop(nodeid, None)
            if digest is None:
                return
            if not digest.grown:
                del self._digests[digest.path]
                return
        with self._reading:
            self._advance(digest)
            digest.seal()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.advance()

    def advance(self) -> None:
        """One pass over the running items' journals (the thread's step)."""
        with self._lock:
            running = list(self._running.values())
        for digest in running:
            if self._stop.is_set():
                return
            if not digest.spoiled and digest.grown:
                with self._reading:
                    self._advance(digest)

    def _advance(self, digest: JournalDigest) -> None:
        if not self._warm:
            self._warm = True
            with contextlib.suppress(Exception):  # session end imports them and says why
                for name in REPORT_MODULES:
                    importlib.import_module(name)
        before = digest.size
        try:
            digest.advance(self.budget - self._held)
        except Exception:  # never the session's failure: session end reads the file
            digest.spoil()
        self._held += (0 if digest.spoiled else digest.size) - before

    def stop(self) -> None:
        """Stop the thread (session end, before the reports take the digests)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def prepared(self, run: RunData, item: ItemRecord) -> list[PreparedRow] | None:
        """``item``'s rows, made while it ran; None: read its journal. Stops the thread first
        (session end: nothing is polled any more)."""
        from pytest_modelbench.store.runstore import ItemStore

        self.stop()
        digest = self._digests.get(ItemStore(run.item_dir(item)).journal.path)
        if digest is None or digest.spoiled or not digest.grown:
            return None
        try:
            self._advance(digest)  # what was written since the last poll
            return digest.prepared(item.metric)
        except Exception:
            return None
        finally:
            digest.close()

    def close(self) -> None:
        """Stop, close every journal and drop the rows (so they are not held until exit)."""
        self.stop()
        for digest in self._digests.values():
            digest.close()
        self._digests, self._running = {}, {}


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None
