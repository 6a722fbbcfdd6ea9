"""Progress reporting from an evaluation loop (examples done/total, errors, tokens).

The runner calls a :class:`ProgressSink` once per finished example. Sinks here
only *record*: :class:`RecordingProgress` keeps counters in memory (the
controller's live display reads them with ``-n 0``), :class:`FileProgress`
also mirrors them to a small JSON file that the xdist controller polls
(``reporting.live``). Progress must never break an evaluation, so writing
failures are swallowed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from pytest_modelbench.store.files import atomic_write_text

PROGRESS_SCHEMA_VERSION = 1


class ProgressSink(Protocol):
    """Receives one call per finished example."""

    def start(self, item_id: str, total: int, done: int) -> None: ...

    def advance(
        self, *, error: bool = False, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        """One example (all its requests) finished; tokens are what its answer used."""
        ...

    def finish(self) -> None: ...


PROGRESS_SINK = pytest.StashKey[ProgressSink]()
"""Where the plugin leaves the sink that this process's evaluator reports to."""


class NullProgress:
    """Discards progress (quiet runs, tests)."""

    def start(self, item_id: str, total: int, done: int) -> None:
        pass

    def advance(
        self, *, error: bool = False, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass(frozen=True)
class ItemSnapshot:
    """Progress of one item at one moment; times are the evaluating process's wall clock.

    Rates use ``updated_at - started_at`` (both from the same clock), so a
    controller on another host with a skewed clock still shows correct rates.
    """

    item_id: str
    total: int
    done: int
    done_at_start: int  # examples already in the journal when this process started the item
    errors: int
    prompt_tokens: int
    completion_tokens: int
    started_at: float
    updated_at: float
    finished: bool = False

    @property
    def new_done(self) -> int:
        return self.done - self.done_at_start

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.updated_at - self.started_at)

    def rate(self) -> float:
        """Examples (= finished requests) per second since this process started the item."""
        return self.new_done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def token_rate(self) -> float:
        """Generated (completion) tokens per second."""
        return self.completion_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def eta_s(self) -> float | None:
        if self.finished or self.done >= self.total:
            return 0.0
        rate = self.rate()
        return (self.total - self.done) / rate if rate > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ItemSnapshot:
        return cls(
            item_id=str(data["item_id"]),
            total=int(data["total"]),
            done=int(data["done"]),
            done_at_start=int(data.get("done_at_start", 0)),
            errors=int(data.get("errors", 0)),
            prompt_tokens=int(data.get("prompt_tokens", 0)),
            completion_tokens=int(data.get("completion_tokens", 0)),
            started_at=float(data["started_at"]),
            updated_at=float(data["updated_at"]),
            finished=bool(data.get("finished", False)),
        )


class RecordingProgress:
    """Keeps per-item counters of this process; thread-safe reads via :meth:`snapshot`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Any]] = {}
        self._current: dict[str, Any] | None = None

    def start(self, item_id: str, total: int, done: int) -> None:
        now = time.time()
        with self._lock:
            self._current = {
                "item_id": item_id,
                "total": total,
                "done": done,
                "done_at_start": done,
                "errors": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "started_at": now,
                "updated_at": now,
                "finished": total <= done,
            }
            self._items[item_id] = self._current
        self._changed(force=True)

    def advance(
        self, *, error: bool = False, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        with self._lock:
            current = self._current
            if current is None:
                return
            current["done"] += 1
            current["errors"] += int(error)
            current["prompt_tokens"] += prompt_tokens
            current["completion_tokens"] += completion_tokens
            current["updated_at"] = time.time()
        self._changed(force=False)

    def finish(self) -> None:
        with self._lock:
            if self._current is not None:
                self._current["finished"] = True
                self._current["updated_at"] = time.time()
            self._current = None
        self._changed(force=True)

    def snapshot(self) -> list[ItemSnapshot]:
        with self._lock:
            return [ItemSnapshot.from_dict(item) for item in self._items.values()]

    def _changed(self, *, force: bool) -> None:
        """Called after every update (subclasses publish)."""


class FileProgress(RecordingProgress):
    """Records progress and mirrors it to ``path`` (atomically, at most every ``min_interval_s``).

    Used on xdist workers: the controller's live display reads every file of
    its session from ``<run_dir>/.progress/<session token>/``.
    """

    def __init__(self, path: Path, worker: str, min_interval_s: float = 0.5) -> None:
        super().__init__()
        self.path = path
        self.worker = worker
        self.min_interval_s = min_interval_s
        self._written_at = 0.0

    def _changed(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._written_at < self.min_interval_s:
            return
        self._written_at = now
        data = {
            "schema_version": PROGRESS_SCHEMA_VERSION,
            "worker": self.worker,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "items": [snap.as_dict() for snap in self.snapshot()],
        }
        # a full disk must not fail the evaluation (the display just lags); no .tmp is left
        with contextlib.suppress(OSError):
            atomic_write_text(self.path, json.dumps(data), durable=False)


def read_progress_dir(directory: Path) -> list[ItemSnapshot]:
    """Every item snapshot in the progress files of one session (damaged files are skipped)."""
    snapshots: list[ItemSnapshot] = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return snapshots
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            snapshots.extend(ItemSnapshot.from_dict(item) for item in data.get("items", []))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return snapshots
