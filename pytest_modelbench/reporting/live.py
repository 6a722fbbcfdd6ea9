"""Live progress on the controller: examples done/total, requests/s, tokens/s, ETA.

A daemon thread polls item snapshots (this process's :class:`RecordingProgress`
with ``-n 0``; the workers' progress files with ``-n N``) and renders them:
on a terminal as one status line kept *below* pytest's current line (erased
while pytest writes), otherwise as plain lines every ``interval`` seconds for
CI logs. Output goes to a duplicate of the original stdout descriptor, so it
is shown even while pytest captures the running test's output.

In a log, lines at the default interval back off (15 s, 30 s, 1 min, ... then every
5 min) and a line is skipped when no example finished since the last one, so a long run
does not bury the log in progress lines; but one is written at least every 5 min, so a CI
job with a no-output timeout sees the run alive through a long model download or start.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_modelbench.running.progress import ItemSnapshot, RecordingProgress, read_progress_dir

PREFIX = "[modelbench]"
LINES_MAX_INTERVAL_S = 300.0  # in a log, the backed-off interval stops growing here


@dataclass(frozen=True)
class RunningItem:
    item_id: str
    done: int
    total: int
    errors: int
    rate: float
    token_rate: float
    eta_s: float | None


@dataclass(frozen=True)
class SessionView:
    """What the display shows at one moment."""

    items_done: int
    items_total: int
    examples_done: int
    examples_total: int | None
    estimated: bool  # examples_total includes guesses for items not started yet
    rate: float  # examples (= finished requests) per second over the session
    token_rate: float  # generated tokens per second over the session
    eta_s: float | None
    running: tuple[RunningItem, ...]


def latest_snapshots(snapshots: Sequence[ItemSnapshot]) -> dict[str, ItemSnapshot]:
    """One snapshot per item: the most recently updated."""
    latest: dict[str, ItemSnapshot] = {}
    for snap in snapshots:
        seen = latest.get(snap.item_id)
        if seen is None or (snap.updated_at, snap.done) >= (seen.updated_at, seen.done):
            latest[snap.item_id] = snap
    return latest


def session_view(
    snapshots: Sequence[ItemSnapshot],
    finished: set[str],
    planned: Mapping[str, str],
    elapsed_s: float,
) -> SessionView:
    """Combine item snapshots into session totals.

    ``planned`` maps the session's item ids to their variant: an item not
    started yet is assumed to have as many examples as a started item of the
    same variant (else the mean of started items). Items finished without a
    snapshot (reused from the run store) need no work and are not counted as
    examples. Rates are the running items' current rates summed (workers run
    in parallel); between items, the average over ``elapsed_s``.
    """
    latest = latest_snapshots(snapshots)
    variant_total: dict[str, int] = {}
    for item_id, snap in latest.items():
        if item_id in planned:
            variant_total.setdefault(planned[item_id], snap.total)
    known = [s.total for s in latest.values()]
    mean_total = round(sum(known) / len(known)) if known else None
    done = total = 0
    estimated = unknown = False
    for item_id in dict.fromkeys([*planned, *latest]):
        seen = latest.get(item_id)
        if seen is not None:
            total += seen.total
            done += seen.total if (seen.finished or item_id in finished) else seen.done
        elif item_id not in finished:
            guess = variant_total.get(planned.get(item_id, ""), mean_total)
            if guess is None:
                unknown = True
            else:
                total += guess
                estimated = True
    running = tuple(
        RunningItem(s.item_id, s.done, s.total, s.errors, s.rate(), s.token_rate(), s.eta_s())
        for s in latest.values()
        if not s.finished and s.item_id not in finished
    )
    if running:  # current throughput: the running items' rates add up across workers
        rate = sum(r.rate for r in running)
        token_rate = sum(r.token_rate for r in running)
    else:  # between items: the session average
        new_done = sum(s.new_done for s in latest.values())
        tokens = sum(s.completion_tokens for s in latest.values())
        rate = new_done / elapsed_s if elapsed_s > 0 else 0.0
        token_rate = tokens / elapsed_s if elapsed_s > 0 else 0.0
    examples_total = None if unknown else total
    eta = (examples_total - done) / rate if examples_total is not None and rate > 0 else None
    items_total = max(len(planned), len(set(planned) | set(latest) | finished))
    items_done = len(finished | {i for i, s in latest.items() if s.finished})
    return SessionView(
        min(items_done, items_total),
        items_total,
        done,
        examples_total,
        estimated,
        rate,
        token_rate,
        None if eta is None else max(0.0, eta),
        running,
    )


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _rate(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _percent(done: int, total: int | None) -> str:
    return f" ({100 * done / total:.0f}%)" if total else ""


def session_line(view: SessionView) -> str:
    total = (
        "?"
        if view.examples_total is None
        else ("~" if view.estimated else "") + _count(view.examples_total)
    )
    return (
        f"items {view.items_done}/{view.items_total} · "
        f"examples {_count(view.examples_done)}/{total}"
        f"{_percent(view.examples_done, view.examples_total)} · {_rate(view.rate)} req/s · "
        f"{_rate(view.token_rate)} tok/s · ETA {format_duration(view.eta_s)}"
    )


def item_line(item: RunningItem) -> str:
    errors = f" · {item.errors} errors" if item.errors else ""
    return (
        f"{item.item_id} {_count(item.done)}/{_count(item.total)}"
        f"{_percent(item.done, item.total)} · {_rate(item.rate)} req/s · "
        f"{_rate(item.token_rate)} tok/s · ETA {format_duration(item.eta_s)}"
        f"{errors}"
    )


def plain_lines(view: SessionView) -> list[str]:
    """Non-terminal output: the session line, then one indented line per running item."""
    return [f"{PREFIX} {session_line(view)}"] + [f"{PREFIX}   {item_line(i)}" for i in view.running]


def status_line(view: SessionView, width: int) -> str:
    """Terminal output: everything on one line, cut to ``width``."""
    parts = [f"{PREFIX} {session_line(view)}"] + [item_line(i) for i in view.running]
    line = " | ".join(parts)
    return line if len(line) <= width else line[: max(0, width - 3)] + "..."


class LiveProgress:
    """The polling thread and its output (``mode`` is ``"tty"`` or ``"lines"``)."""

    def __init__(
        self,
        mode: str,
        interval_s: float,
        fd: int,
        local: RecordingProgress | None,
        directory: Path | None,
        current_column: Callable[[], int] = lambda: 0,
        width: Callable[[], int] = lambda: 80,
        flush: Callable[[], None] = lambda: None,
        backoff: bool = False,
    ) -> None:
        """``backoff``: each wait is twice the one before, up to :data:`LINES_MAX_INTERVAL_S`
        (a log at the default interval; an interval the user gave is kept)."""
        self.mode = mode
        self.interval_s = interval_s
        self.backoff = backoff
        self._last_done: int | None = None  # examples done at the last line written
        self._last_line_at = time.monotonic()  # when it was written (a heartbeat's clock)
        self.fd = fd
        self.local = local
        self.directory = directory
        self.current_column = current_column
        self.width = width
        self.flush = flush
        self.planned: dict[str, str] = {}
        self.finished: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._drawn = False
        self._column_after_write = -1  # pytest's column when we last wrote lines

    # -- inputs from pytest hooks ------------------------------------------------------------
    def set_planned(self, planned: Mapping[str, str]) -> None:
        with self._lock:
            self.planned.update(planned)

    def item_finished(self, item_id: str) -> None:
        with self._lock:
            self.finished.add(item_id)

    # -- thread ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._started = time.monotonic()
            self._thread = threading.Thread(
                target=self._run, name="modelbench-progress", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._erase()
        if self.directory is not None:
            _remove_tree(self.directory)

    def intervals(self) -> Iterator[float]:
        """The waits between ticks."""
        wait = self.interval_s
        while True:
            yield wait
            if self.backoff:
                wait = max(wait, min(wait * 2, LINES_MAX_INTERVAL_S))

    def _run(self) -> None:
        for wait in self.intervals():
            if self._stop.wait(wait):
                return
            try:
                self.tick()
            except Exception:
                continue

    def snapshots(self) -> list[ItemSnapshot]:
        found = list(self.local.snapshot()) if self.local is not None else []
        if self.directory is not None:
            found.extend(read_progress_dir(self.directory))
        return found

    def view(self) -> SessionView | None:
        snaps = self.snapshots()
        if not snaps:
            return None
        with self._lock:
            finished, planned = set(self.finished), dict(self.planned)
        return session_view(snaps, finished, planned, time.monotonic() - self._started)

    def tick(self) -> None:
        view = self.view()
        if view is None:
            return
        with self._lock:
            if self._stop.is_set():
                return
            if self.mode == "tty":
                self._draw(status_line(view, max(20, self.width() - 1)))
            elif (  # a log: only lines that say more, and one at least every 5 min (a CI
                # job with a no-output timeout must not be killed during a long server start)
                view.examples_done != self._last_done
                or time.monotonic() - self._last_line_at >= LINES_MAX_INTERVAL_S
            ):
                self._last_done = view.examples_done
                self._last_line_at = time.monotonic()
                self._write_lines(plain_lines(view))

    # -- output ------------------------------------------------------------------------------
    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, text.encode("utf-8", "replace"))

    def _write_lines(self, lines: list[str]) -> None:
        with contextlib.suppress(Exception):
            self.flush()  # pytest's buffered text first, so lines interleave in order
        column = self.current_column()
        # end pytest's unfinished line ("file.py ..") unless we did and it wrote nothing since
        start = "\n" if column > 0 and column != self._column_after_write else ""
        self._write(start + "\n".join(lines) + "\n")
        self._column_after_write = column

    def _back(self) -> str:
        """Cursor from the status line back up to where pytest's writer left it."""
        return f"\x1b[1A\x1b[{self.current_column() + 1}G"

    def _draw(self, line: str) -> None:
        self._write(f"\n\r\x1b[2K{line}" + self._back())
        self._drawn = True

    def _erase(self) -> None:
        if self._drawn and self.mode == "tty":
            self._write("\n\r\x1b[2K" + self._back())
        self._drawn = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the display while pytest writes (the status line is erased first)."""
        with self._lock:
            self._erase()
            yield


def _remove_tree(directory: Path) -> None:
    """Remove this session's progress files (and ``.progress`` when it is left empty)."""
    try:
        for path in directory.glob("*"):
            with contextlib.suppress(OSError):
                path.unlink()
        directory.rmdir()
        directory.parent.rmdir()
    except OSError:
        pass
