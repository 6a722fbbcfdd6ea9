"""The simulated server's request log: one record per request, counters, optional JSONL.

Tests read it to assert on what the client really did (how many attempts, how
many in flight at once, whether an example was answered twice). The JSONL
file carries the same records across processes, flushed per line, for tests
whose client is killed while the server lives on.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any, Literal

from pytest_modelbench.testing.faults import FaultKind

Outcome = Literal[
    "ok", "5xx", "429", "timeout", "reset", "malformed", "client_error", "hang", "aborted"
]
"""How a request ended. ``hang``: held under ``hang_forever`` until the server stopped;
``aborted``: still in flight when the server stopped (its connection was dropped)."""

LOG_SCHEMA_VERSION = 1

Row = tuple[str, str, str, "int | None", Outcome, int, float, float, int, float, str]
"""A record's fields in :class:`RequestRecord` order (what the server appends, cheaply)."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the server saw it (times are ``time.monotonic()`` in the server process).

    ``key`` is the last user message (chat) or the prompt (completions; the first
    one for a list of prompts); ``attempt`` counts earlier requests with the same
    path, model, key and seed; ``queued`` is the time spent waiting for a slot;
    ``detail`` says more about the outcome (the fault drawn, the 4xx reason).
    """

    path: str
    model: str
    key: str
    seed: int | None
    outcome: Outcome
    status: int
    start: float
    end: float
    attempt: int = 0
    queued: float = 0.0
    detail: str = ""

    @property
    def duration(self) -> float:
        """Seconds from the request's arrival to its answer (or drop)."""
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the record (one JSONL line)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["schema_version"] = LOG_SCHEMA_VERSION
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        """Read back a record written by :meth:`to_json`."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class RequestLog:
    """Every request the server handled, with running counters.

    Appends come from the server's event loop as plain tuples (a record object
    per request would be a measurable share of the server's work); reads, from
    any thread, turn them into :class:`RequestRecord` values on demand.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: list[Row] = []
        self._records: list[RequestRecord] = []
        self._counts: Counter[str] = Counter()
        self._answers: Counter[str] = Counter()
        self._attempts: dict[Hashable, int] = {}
        self._sink: IO[str] | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.pending = 0
        self.max_pending = 0

    # -- written by the server ---------------------------------------------------------

    def next_attempt(self, identity: Hashable) -> int:
        """How many requests with this identity came before (and count this one)."""
        attempt = self._attempts.get(identity, 0)
        self._attempts[identity] = attempt + 1
        return attempt

    def enter_slot(self) -> None:
        """A request took a slot."""
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight

    def leave_slot(self) -> None:
        """A request gave its slot back."""
        self.in_flight -= 1

    def arrive(self) -> None:
        """A request arrived (waiting or served)."""
        self.pending += 1
        if self.pending > self.max_pending:
            self.max_pending = self.pending

    def add(self, row: Row) -> None:
        """Record a finished request (and write it to the JSONL sink, if any)."""
        self._rows.append(row)
        outcome = row[4]
        self._counts[outcome] += 1
        if outcome == "ok" and row[0].endswith("completions"):
            self._answers[row[2]] += 1
        if self._sink is not None:
            self._sink.write(json.dumps(RequestRecord(*row).to_json()) + "\n")
            self._sink.flush()

    def open_sink(self, path: str | Path) -> None:
        """Append every later record to ``path`` as JSONL, flushed per line."""
        self.close_sink()
        self._sink = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- closed in close_sink

    def close_sink(self) -> None:
        """Stop writing JSONL."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    # -- read by tests -----------------------------------------------------------------

    @property
    def records(self) -> list[RequestRecord]:
        """A snapshot of all records so far, in completion order."""
        with self._lock:
            done = len(self._records)
            self._records.extend(RequestRecord(*row) for row in self._rows[done:])
            return list(self._records)

    @property
    def counts(self) -> Counter[str]:
        """Requests per outcome (``ok``, ``5xx``, ``429`` ...)."""
        with self._lock:
            return Counter(self._counts)

    def answers_per_key(self) -> Counter[str]:
        """Successful (``ok``) answers per key: a value above 1 means a repeated example."""
        with self._lock:
            return Counter(self._answers)

    def clear(self) -> None:
        """Forget every record, counter, attempt number and maximum."""
        with self._lock:
            self._rows.clear()
            self._records.clear()
            self._counts.clear()
            self._answers.clear()
            self._attempts.clear()
            self.max_in_flight = self.in_flight
            self.max_pending = self.pending

    def __len__(self) -> int:
        return len(self._rows)


def read_log(path: str | Path) -> list[RequestRecord]:
    """The records of a JSONL request log (a torn last line, from a kill, is skipped)."""
    return list(iter_log(path))


def iter_log(path: str | Path) -> Iterator[RequestRecord]:
    """Iterate over the records of a JSONL request log, skipping a torn last line."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.endswith("\n"):
                break
            yield RequestRecord.from_json(json.loads(line))


class Pending:
    """What is known so far about a request in progress (for its log record)."""

    __slots__ = ("attempt", "fault", "key", "model", "path", "queued", "seed", "start")

    def __init__(self, path: str, start: float) -> None:
        self.path = path
        self.start = start
        self.model = ""
        self.key = ""
        self.seed: int | None = None
        self.attempt = 0
        self.queued = 0.0
        self.fault: FaultKind | None = None
