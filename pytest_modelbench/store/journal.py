"""The per-example journal (``results.jsonl``): append-only, one whole JSON line per example.

Each line is flushed when its example finishes and fsync'd at item end, so a
crash loses at most the examples in flight; a torn or damaged line is moved
aside (``results.damaged.jsonl``) before the next append.

A :class:`Journal` object also keeps the lines of a small journal (up to :data:`HELD_BYTES`)
that it read at the item's start and appended since, with their keys, so the item's summary
after the last reply reads no file: each line is parsed once, by :meth:`Journal.latest` or
ahead of it (:meth:`Journal.parse_ahead`, while the item's last replies are awaited), as the
reader parses it. They are used only while the file is still the one they are (device, inode,
size, modification time); anything else reads the file.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from pytest_modelbench.secrets import redact
from pytest_modelbench.store.files import (
    StoreWarning,
    StoreWriteError,
    atomic_write_text,
    fsync_directory,
    unshare,
)

HELD_BYTES = 4 << 20  # Journal.latest parses a journal this small once and holds its rows
# made once: json.dumps with options builds an encoder per call, once per example here
_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, default=str)
_NEWLINE_BYTES = len(os.linesep.encode())  # text mode writes "\n" as the platform's line end
# text from a network may hold lone surrogates, which utf-8 cannot encode: written as the JSON
# escape "\udXXX" (only a JSON string can hold one, so the line reads back as the same text)
TEXT_ERRORS = "backslashreplace"
MAX_DEPTH = 100  # a value nested deeper is stored as a note (json's encoder recurses)
TOO_DEEP = f"[a value nested more than {MAX_DEPTH} levels deep, not stored]"

Row = dict[str, Any]
Key = tuple[str, int]


def _dumps(data: Any) -> str:
    try:
        return _ENCODER.encode(data)
    except RecursionError:  # a reply's deeply nested JSON, say: stored down to MAX_DEPTH
        return _ENCODER.encode(_shallow(data, MAX_DEPTH))


def _shallow(value: Any, depth: int) -> Any:
    """``value`` with containers nested deeper than ``depth`` replaced by :data:`TOO_DEEP`."""
    if isinstance(value, (dict, list, tuple)):
        if depth <= 0:
            return TOO_DEEP
        if isinstance(value, dict):
            return {key: _shallow(item, depth - 1) for key, item in value.items()}
        return [_shallow(item, depth - 1) for item in value]
    return value


def _line_bytes(line: str) -> int:
    """Bytes that ``line`` and its newline take in the file (utf-8); ``UnicodeEncodeError``
    for a line with a lone surrogate (the file holds its escape, which reads back otherwise
    than the line: a high and a low one become one character)."""
    return (len(line) if line.isascii() else len(line.encode())) + _NEWLINE_BYTES


def _written_key(row: Mapping[str, Any], dumped: str, line: str) -> Key:
    """:func:`row_key` of the row that reading ``line`` (``redact(dumped)``) gives back: taken
    from ``row`` where json keeps the values as they are (a dict whose id is a str and whose
    rollout is an int, the text not redacted), else from the parsed line (raises as
    :func:`row_key` does on a line the reader skips)."""
    if type(row) is dict and line == dumped:
        example_id, rollout = row.get("example_id"), row.get("rollout", 0)
        if type(example_id) is str and type(rollout) is int:
            return (example_id, rollout)
    return row_key(json.loads(line))


def row_key(row: Mapping[str, Any]) -> tuple[str, int]:
    return (str(row["example_id"]), int(row.get("rollout", 0)))


class _Held:
    """A journal's lines in file order with their keys: each line as read (bytes) or written
    (str) until it is parsed, then its row. Flat lists of strings and ints: nothing kept per
    example that the garbage collector tracks, as a (key, line) pair or a key tuple would be
    (its collections on the event loop grew with them: a few ms per 2000 examples)."""

    __slots__ = ("ids", "lines", "parsed", "rollouts")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.rollouts: list[int] = []
        self.lines: list[bytes | str | Row] = []
        self.parsed = 0  # lines before this one were parsed by Journal.parse_ahead

    def add(self, key: Key, line: bytes | str) -> None:
        self.ids.append(key[0])
        self.rollouts.append(key[1])
        self.lines.append(line)


def _damaged_warning(path: Path, count: int) -> StoreWarning:
    return StoreWarning(f"{path}: skipped {count} damaged line(s); those examples will be redone")


class Journal:
    """Append-only per-example results (``results.jsonl``) of one item."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None
        # the file's lines while the file is the one they are: None when not held (large,
        # damaged, replaced, unknown). Lines, not rows, while the item runs: rows kept from the
        # start cost the garbage collector more than parsing them once (2000 MMLU examples:
        # about 30 ms more of collections on the event loop, and a full collection of 15-60 ms
        # in the summary, against about 20 ms of parsing)
        self._held: _Held | None = None
        self._held_file: tuple[int, int] | None = None  # (device, inode); None: no file
        self._held_size = 0
        self._held_mtime: int | None = None  # None while appending (only this object writes)

    def read(self) -> dict[tuple[str, int], dict[str, Any]]:
        """The last row per (example, rollout). Text after the last newline is ignored (a line
        being written, or torn by a crash: :meth:`repair` drops it); damaged lines are skipped
        with a warning (those examples are redone)."""
        return {row_key(row): row for row in self.rows()}

    def rows(self, *, warn: bool = True) -> Iterator[dict[str, Any]]:
        """Every whole row in file order, read line by line, so memory does not grow with the
        journal; damaged lines are skipped (with a warning once the file is read)."""
        damaged = 0
        for _, row, terminated in self._scan():
            if row is not None:
                yield row
            elif terminated:
                damaged += 1
        if damaged and warn:
            warnings.warn(_damaged_warning(self.path, damaged), stacklevel=2)

    def latest(
        self, keep: Callable[[tuple[str, int]], bool] | None = None
    ) -> Iterator[dict[str, Any]]:
        """The last row per (example, rollout) whose key ``keep`` accepts, in file order of
        those rows: what :meth:`read` holds. A journal of up to :data:`HELD_BYTES` is parsed
        once and its rows held; a larger one is streamed in two passes that keep only each
        key's line number in memory.

        Rows of the lines this object holds (read by :meth:`finished_keys`, written by
        :meth:`append`) are parsed once and kept: they are the same objects on every call, so
        read them, don't change them."""
        held = self._held_rows()
        if held is not None:
            yield from _last_per_key(held, len(held.lines), keep)
            return
        try:
            small = self.path.stat().st_size <= HELD_BYTES
        except OSError:
            small = False
        last: dict[tuple[str, int], int] = {}
        kept: list[dict[str, Any]] | None = [] if small else None
        for n, row in enumerate(self.rows()):
            key = row_key(row)
            if keep is None or keep(key):
                last[key] = n
            if kept is not None:
                kept.append(row)
        if not last:
            return
        for n, row in enumerate(kept if kept is not None else self.rows(warn=False)):
            if last.get(row_key(row)) == n:
                yield row

    def finished_keys(self) -> set[tuple[str, int]]:
        """(example, rollout) keys whose last row has no error: the units a resume skips.
        A journal of up to :data:`HELD_BYTES` whose lines are all whole rows is held from here
        on (see :meth:`latest`)."""
        ok: dict[tuple[str, int], bool] = {}
        damaged = 0
        for entry in self._read_holding():
            if entry is None:
                damaged += 1
            else:
                ok[entry[0]] = not entry[1].get("error")
        if damaged:
            warnings.warn(_damaged_warning(self.path, damaged), stacklevel=2)
        return {key for key, good in ok.items() if good}

    def _scan(self) -> Iterator[tuple[bytes, dict[str, Any] | None, bool]]:
        """(line, its row or None when damaged, whether it ends in a newline) per non-blank
        line of the file as it is now, streamed; an unterminated last line comes last."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below, also on early exit
        except FileNotFoundError:
            return
        with handle:
            yield from _lines(handle)

    def _read_holding(self) -> Iterator[tuple[Key, Row] | None]:
        """(key, row) per whole row in file order and None per damaged line, as :meth:`rows`
        reads them; once the whole file is read, its lines are held when it is small and every
        line was a whole row."""
        self._forget()
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below, also on early exit
        except FileNotFoundError:
            self._held, self._held_file, self._held_size, self._held_mtime = _Held(), None, 0, None
            return
        with handle:
            opened = os.fstat(handle.fileno())
            kept: _Held | None = _Held() if opened.st_size <= HELD_BYTES else None
            for line, row, terminated in _lines(handle):
                if row is None:
                    kept = None  # the file is not only whole rows: it is read as before
                    if terminated:
                        yield None
                    continue
                key = row_key(row)
                if kept is not None:
                    kept.add(key, line)
                yield key, row
            if kept is None:
                return
            ended = os.fstat(handle.fileno())
            # the lines are the file only if nothing was appended while it was read
            if handle.tell() == ended.st_size <= HELD_BYTES:
                self._held = kept
                self._held_file = (ended.st_dev, ended.st_ino)
                self._held_size = ended.st_size
                self._held_mtime = ended.st_mtime_ns

    def _held_rows(self) -> _Held | None:
        """The held rows when the file is still the one they are (else they are dropped)."""
        if self._held is None:
            return None
        try:
            now: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            now = None
        except OSError:  # cannot tell: read the file (which says what is wrong)
            now = None
            self._forget()
        if self._is_held_file(now):
            return self._held
        self._forget()
        return None

    def _is_held_file(self, now: os.stat_result | None) -> bool:
        """Whether rows are held and are the file that ``now`` describes (None: no file)."""
        if self._held is None:
            return False
        if now is None:
            return self._held_file is None
        return (
            (now.st_dev, now.st_ino) == self._held_file
            and now.st_size == self._held_size
            and self._held_mtime in (None, now.st_mtime_ns)
        )

    def _forget(self) -> None:
        self._held = None

    def _hold(self, row: Mapping[str, Any], dumped: str, line: str) -> None:
        """Keep ``line``, just written for ``row``, with its key (about 1 us: this runs once
        per example, on the event loop)."""
        held = self._held
        assert held is not None
        try:
            self._held_size += _line_bytes(line)
        except UnicodeEncodeError:  # a lone surrogate: read the file, as the reader does
            self._forget()
            return
        if self._held_size > HELD_BYTES:  # as large as Journal.latest streams: hold nothing
            self._forget()
            return
        try:
            key = _written_key(row, dumped, line)
        except Exception:  # a line the reader skips or trips on: read the file, as before
            self._forget()
            return
        held.add(key, line)

    def parse_ahead(self, count: int) -> bool:
        """Parse up to ``count`` more of the held lines now, for :meth:`latest` (while the
        item's last replies are awaited, say); whether any are left."""
        held = self._held
        if held is None:
            return False
        lines, start = held.lines, held.parsed
        held.parsed = end = min(len(lines), start + count)
        for n in range(start, end):
            entry = lines[n]
            if not isinstance(entry, dict):
                lines[n] = json.loads(entry)
        return end < len(lines)

    def repair(self) -> int:
        """Before appending (under the item lock): move damaged lines and a torn last line (a
        crash mid-write) out to ``results.damaged.jsonl``, with a warning, so the journal holds
        only whole rows again. Returns how many lines were moved."""
        self._forget()
        damaged: list[bytes] = []
        tail = b""
        for line, row, terminated in self._scan():
            if not terminated:
                tail = line
            elif row is None:
                damaged.append(line)
        torn = tail.strip()
        if not damaged and not torn:
            return 0
        if torn:
            warnings.warn(
                StoreWarning(f"{self.path}: dropped an unfinished last line (crash while writing)"),
                stacklevel=2,
            )
        if damaged:
            warnings.warn(_damaged_warning(self.path, len(damaged)), stacklevel=2)
        aside = self.path.with_name("results.damaged.jsonl")
        moved = [*damaged, tail] if torn else damaged
        try:
            with open(aside, "ab") as handle:
                handle.write(b"".join(line + b"\n" for line in moved))
        except OSError as exc:
            raise StoreWriteError(exc.errno, f"cannot write {aside}: {exc.strerror}") from exc
        atomic_write_text(self.path, "".join(_dumps(row) + "\n" for row in self.rows(warn=False)))
        return len(moved)

    def open(self) -> None:
        """Open for appending; a journal shared with another run (hard link) is copied first."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                before: os.stat_result | None = self.path.stat()
            except FileNotFoundError:
                before = None
            if before is not None and before.st_nlink > 1:
                unshare(self.path)
            self._handle = open(self.path, "a", encoding="utf-8", errors=TEXT_ERRORS)  # noqa: SIM115 - closed in close()
        except StoreWriteError:
            raise
        except OSError as exc:
            raise StoreWriteError(exc.errno, f"cannot open {self.path}: {exc.strerror}") from exc
        self._follow(before, self._handle)

    def _follow(self, before: os.stat_result | None, handle: IO[str]) -> None:
        """Keep the held rows for the file just opened when they were the file before it (a
        private copy made by :func:`unshare` has the same bytes and modification time)."""
        if not self._is_held_file(before):
            self._forget()
            return
        opened = self._fstat_or_forget(handle)
        if opened is None:
            return
        same_bytes = opened.st_size == (before.st_size if before is not None else 0)
        if before is not None:
            same_bytes = same_bytes and opened.st_mtime_ns == before.st_mtime_ns
        if not same_bytes:
            self._forget()
            return
        self._held_file = (opened.st_dev, opened.st_ino)
        self._held_size = opened.st_size
        self._held_mtime = None  # appends change it; close() reads it again

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one whole line and flush it to the OS (survives a process crash)."""
        assert self._handle is not None, "journal not open"
        dumped = _dumps(row)
        line = redact(dumped)
        held, self._held = self._held, None  # not held while the write may be half done
        try:
            self._handle.write(line + "\n")
            self._handle.flush()
        except OSError as exc:
            raise StoreWriteError(
                exc.errno, f"cannot append to {self.path}: {exc.strerror}"
            ) from exc
        if held is not None:
            self._held = held
            self._hold(row, dumped, line)

    def close(self) -> None:
        """fsync and close (survives a machine crash from here on)."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        try:
            handle.flush()
            os.fsync(handle.fileno())
            fsync_directory(self.path.parent)
            self._settle(handle)
        except OSError as exc:
            self._forget()
            raise StoreWriteError(exc.errno, f"cannot sync {self.path}: {exc.strerror}") from exc
        finally:
            with suppress(OSError):  # a failed flush above was already reported
                handle.close()

    def _settle(self, handle: IO[str]) -> None:
        """The appends are done: the held rows are the file as it is now (its bytes, its
        modification time), or nothing is held when another writer appended too."""
        if self._held is None:
            return
        closed = self._fstat_or_forget(handle)
        if closed is None:
            return
        if (closed.st_dev, closed.st_ino) == self._held_file and closed.st_size == self._held_size:
            self._held_mtime = closed.st_mtime_ns
        else:
            self._forget()

    def _fstat_or_forget(self, handle: IO[str]) -> os.stat_result | None:
        """The open file's status; None, and nothing held, when it cannot be read."""
        try:
            return os.fstat(handle.fileno())
        except OSError:
            self._forget()
            return None

    def discard(self, reason: str) -> Path | None:
        """Move the journal aside (kept for inspection) so the item starts over."""
        self._forget()
        if not self.path.exists():
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"results.{stamp}.{reason}.jsonl")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"results.{stamp}-{n}.{reason}.jsonl")
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            raise StoreWriteError(
                exc.errno, f"cannot move {self.path} aside: {exc.strerror}"
            ) from exc
        return aside


def parse_line(line: bytes) -> tuple[Key, Row] | None:
    """A whole, non-blank journal line's key and row; None when the reader skips it as
    damaged (not JSON, or no usable ``example_id``/``rollout``)."""
    try:
        row = json.loads(line)
        return row_key(row), row
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        return None


def last_per_key(keys: Iterable[Key], keep: Callable[[Key], bool] | None = None) -> list[int]:
    """Positions of the last line of each key (that ``keep`` accepts), in file order: the
    rows :meth:`Journal.latest` gives."""
    last: dict[Key, int] = {}
    for n, key in enumerate(keys):
        if keep is None or keep(key):
            last[key] = n
    return sorted(last.values())


def _lines(handle: IO[bytes]) -> Iterator[tuple[bytes, dict[str, Any] | None, bool]]:
    """:meth:`Journal._scan` of an open file, from where it stands."""
    for raw in handle:
        if not raw.endswith(b"\n"):
            yield raw, None, False
            return
        line = raw[:-1]
        if not line.strip():
            continue
        parsed = parse_line(line)
        yield line, None if parsed is None else parsed[1], True


def _last_per_key(held: _Held, count: int, keep: Callable[[Key], bool] | None) -> Iterator[Row]:
    """:meth:`Journal.latest` of held lines: their first ``count`` (lines appended meanwhile are
    not read). Each line yielded is parsed once, as the reader parses it, and its row kept."""
    lines = held.lines
    for n in last_per_key(zip(held.ids[:count], held.rollouts[:count], strict=True), keep):
        entry = lines[n]
        if not isinstance(entry, dict):
            entry = lines[n] = json.loads(entry)
        yield entry
