"""The per-example journal (``results.jsonl``): append-only, one whole JSON line per example.

Each line is flushed when its example finishes and fsync'd at item end, so a
crash loses at most the examples in flight; a torn or damaged line is moved
aside (``results.damaged.jsonl``) before the next append.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
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


def _dumps(data: Any) -> str:
    return _ENCODER.encode(data)


def row_key(row: Mapping[str, Any]) -> tuple[str, int]:
    return (str(row["example_id"]), int(row.get("rollout", 0)))


def _damaged_warning(path: Path, count: int) -> StoreWarning:
    return StoreWarning(f"{path}: skipped {count} damaged line(s); those examples will be redone")


class Journal:
    """Append-only per-example results (``results.jsonl``) of one item."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

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
        key's line number in memory."""
        try:
            small = self.path.stat().st_size <= HELD_BYTES
        except OSError:
            small = False
        last: dict[tuple[str, int], int] = {}
        held: list[dict[str, Any]] | None = [] if small else None
        for n, row in enumerate(self.rows()):
            key = row_key(row)
            if keep is None or keep(key):
                last[key] = n
            if held is not None:
                held.append(row)
        if not last:
            return
        for n, row in enumerate(held if held is not None else self.rows(warn=False)):
            if last.get(row_key(row)) == n:
                yield row

    def finished_keys(self) -> set[tuple[str, int]]:
        """(example, rollout) keys whose last row has no error: the units a resume skips."""
        ok: dict[tuple[str, int], bool] = {}
        for row in self.rows():
            ok[row_key(row)] = not row.get("error")
        return {key for key, good in ok.items() if good}

    def _scan(self) -> Iterator[tuple[bytes, dict[str, Any] | None, bool]]:
        """(line, its row or None when damaged, whether it ends in a newline) per non-blank
        line of the file as it is now, streamed; an unterminated last line comes last."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below, also on early exit
        except FileNotFoundError:
            return
        with handle:
            for raw in handle:
                if not raw.endswith(b"\n"):
                    yield raw, None, False
                    return
                line = raw[:-1]
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    row_key(row)
                except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
                    yield line, None, True
                    continue
                yield line, row, True

    def repair(self) -> int:
        """Before appending (under the item lock): move damaged lines and a torn last line (a
        crash mid-write) out to ``results.damaged.jsonl``, with a warning, so the journal holds
        only whole rows again. Returns how many lines were moved."""
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
            if self.path.exists() and self.path.stat().st_nlink > 1:
                unshare(self.path)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except StoreWriteError:
            raise
        except OSError as exc:
            raise StoreWriteError(exc.errno, f"cannot open {self.path}: {exc.strerror}") from exc

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one whole line and flush it to the OS (survives a process crash)."""
        assert self._handle is not None, "journal not open"
        try:
            self._handle.write(redact(_dumps(row)) + "\n")
            self._handle.flush()
        except OSError as exc:
            raise StoreWriteError(
                exc.errno, f"cannot append to {self.path}: {exc.strerror}"
            ) from exc

    def close(self) -> None:
        """fsync and close (survives a machine crash from here on)."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        try:
            handle.flush()
            os.fsync(handle.fileno())
            fsync_directory(self.path.parent)
        except OSError as exc:
            raise StoreWriteError(exc.errno, f"cannot sync {self.path}: {exc.strerror}") from exc
        finally:
            with suppress(OSError):  # a failed flush above was already reported
                handle.close()

    def discard(self, reason: str) -> Path | None:
        """Move the journal aside (kept for inspection) so the item starts over."""
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
