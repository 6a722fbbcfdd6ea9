"""The run store: ``runs/<run_id>/`` with a locked manifest and one directory per item.

Writes are atomic (temp file + fsync + rename); the per-example journal is
append-only, one whole JSON line per example, flushed per line and fsync'd at
item end, so a crash loses at most the examples in flight. Safe for many
xdist workers (and hosts on a shared filesystem) writing one run directory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_modelbench.names import safe_component
from pytest_modelbench.store.files import (
    StoreWriteError,
    atomic_write_json,
    link_or_copy,
    read_json,
)
from pytest_modelbench.store.item_rows import ItemRows
from pytest_modelbench.store.journal import Journal
from pytest_modelbench.store.records import (
    MANIFEST_VERSION,
    SUMMARY_VERSION,
    ItemMetadata,
    ItemStatus,
    ManifestEntry,
)
from pytest_modelbench.store.summary import ItemSummary

MANIFEST = "run_manifest.json"
JOURNAL = "results.jsonl"
SUMMARY = "summary.json"
METADATA = "metadata.json"
RESULT = "result.json"  # store.result.EvalResult: the item's verdict
SELECTION = "selection.json"  # the (example, rollout) keys the summary covers
SELECTION_VERSION = 1


@dataclass(frozen=True)
class ItemState:
    """What the store holds of one item when it is next evaluated: its files read once, for
    the reuse decision (``evaluation/reuse.py``) to choose the item's next transition."""

    summary: ItemSummary | None  # summary.json (None: none, or damaged)
    metadata: dict[str, Any] | None  # metadata.json: the configuration the journal was made by
    journal: bool  # results.jsonl exists: rows of an earlier session

    @property
    def stored(self) -> bool:
        """Anything at all is stored (a decision to start over then moves it aside)."""
        return self.journal or bool(self.summary)


@dataclass(frozen=True)
class ItemStore:
    """One item in the store, and its state machine: :meth:`state` reads what is stored;
    the evaluator (the one owner of the item's life) then takes one transition:
    :meth:`settle` (stored results stand), :meth:`seeded` (taken from the ``--restart`` run)
    or :meth:`start` → rows → :meth:`finish` (evaluated), :meth:`fail` or :meth:`interrupted`
    on the way. Each writes the item's files and its entry in the run's manifest together."""

    directory: Path
    item_id: str = ""
    run: RunStore | None = field(default=None, compare=False, repr=False)

    @property
    def journal(self) -> Journal:
        return Journal(self.directory / JOURNAL)

    @property
    def summary_path(self) -> Path:
        return self.directory / SUMMARY

    @property
    def metadata_path(self) -> Path:
        return self.directory / METADATA

    def state(self) -> ItemState:
        """The item's stored summary, metadata and whether a journal exists."""
        return ItemState(
            summary=self.read_summary(),
            metadata=self.read_metadata(),
            journal=self.journal.path.exists(),
        )

    def read_summary(self) -> ItemSummary | None:
        data = read_json(self.summary_path)
        return None if data is None else ItemSummary.from_json(data)

    def read_metadata(self) -> dict[str, Any] | None:
        return read_json(self.metadata_path)

    # -- transitions: item files and manifest entry together ---------------------------------
    def start(self, metadata: ItemMetadata, *, start_over: str | None = None) -> ItemRows:
        """Before the first request: the resolved configuration, the entry as running, and the
        item's journal opened for its rows (:meth:`open_rows`). ``start_over`` (why: ``stale``,
        ``forced``): the journal is moved aside and the summary removed first, so the item
        starts from nothing."""
        if start_over is not None:
            self.journal.discard(start_over)
            self.clear_summary()
        atomic_write_json(self.metadata_path, metadata.to_json())
        self._manifest(ManifestEntry.running(metadata))
        return self.open_rows()

    def open_rows(self) -> ItemRows:
        """The item's journal for its run, repaired, with the units already done (resume);
        closed by the caller before it summarises the rows and finishes the item."""
        return ItemRows.open(self.journal)

    def finish(self, summary: ItemSummary, entry: ManifestEntry) -> None:
        """The keys the summary covers (its ``selected``), the item's summary, then its
        manifest entry (a kill between them is repaired by :meth:`settle` when the item is next
        read back)."""
        selected = summary.selected
        if selected is not None:
            atomic_write_json(
                self.directory / SELECTION,
                {"schema_version": SELECTION_VERSION, "keys": [list(key) for key in selected]},
            )
        self.write_summary(summary)
        self._manifest(entry)

    def selection(self, summary: ItemSummary) -> set[tuple[str, int]] | None:
        """The (example, rollout) keys ``summary`` covers, or None when not recorded (an item
        finished by an older version) or not this summary's (another count of rows)."""
        data = read_json(self.directory / SELECTION)
        if not isinstance(data, dict) or data.get("schema_version") != SELECTION_VERSION:
            return None
        keys = data.get("keys")
        if not isinstance(keys, list) or len(keys) != summary.n_rows:
            return None
        return {(str(key[0]), int(key[1])) for key in keys}

    def selected_rows(self, summary: ItemSummary) -> list[dict[str, Any]]:
        """The journal's last row of each key ``summary`` covers (each rollout once), in file
        order; every key's last row when the selection is not recorded."""
        keys = self.selection(summary)
        return list(self.journal.latest(None if keys is None else keys.__contains__))

    def fail(self, error: str) -> None:
        """Best effort, while another failure is being reported: mark the entry as errored."""
        with suppress(OSError, TimeoutError):
            self._manifest_fields(status=ItemStatus.ERROR, error=error)

    def interrupted(self) -> None:
        """Best effort, while the item is being stopped (Ctrl-C, pytest-timeout's failure):
        its entry says ``interrupted``, never ``running`` (its journal keeps what finished)."""
        with suppress(OSError, TimeoutError):
            self._manifest_fields(status=ItemStatus.INTERRUPTED)

    def settle(self, entry: ManifestEntry, known: Mapping[str, Any] | None) -> None:
        """Repair the manifest entry of a finished item when ``known`` (the entry as last read)
        disagrees with it: a kill can fall between the summary and the manifest writes."""
        if entry.differs_from(known or {}):
            self._manifest(entry)

    def seeded(self, other: ItemStore, entry: ManifestEntry) -> None:
        """Take ``other``'s finished item (see :meth:`seed_from`) and record where it came from."""
        self.seed_from(other)
        self._manifest(entry)

    def _manifest(self, entry: ManifestEntry) -> None:
        self._manifest_fields(**entry.fields())

    def _manifest_fields(self, **fields: Any) -> None:
        if self.run is not None:
            self.run.update_item(self.item_id, **fields)

    def write_summary(self, summary: ItemSummary) -> None:
        atomic_write_json(
            self.summary_path, {"schema_version": SUMMARY_VERSION, **summary.to_json()}
        )

    def clear_summary(self) -> None:
        """Remove the summary and the item's saved record (``result.json``): both describe
        results that are being recomputed."""
        for path in (self.summary_path, self.directory / RESULT, self.directory / SELECTION):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StoreWriteError(exc.errno, f"cannot remove {path}: {exc.strerror}") from exc

    def seed_from(self, other: ItemStore) -> None:
        """Take ``other``'s finished files: the journal hard-linked (copied across filesystems),
        metadata and summary copied; the summary last, so a crash leaves no half-seeded item."""
        link_or_copy(other.journal.path, self.journal.path)
        link_or_copy(other.metadata_path, self.metadata_path, link=False)
        if (other.directory / SELECTION).exists():
            link_or_copy(other.directory / SELECTION, self.directory / SELECTION, link=False)
        link_or_copy(other.summary_path, self.summary_path, link=False)


class RunStore:
    """One run directory, shared by every worker of a session."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.manifest_path = directory / MANIFEST
        self._lock = FileLock(str(directory / f".{MANIFEST}.lock"), timeout=120)

    @property
    def run_id(self) -> str:
        return self.directory.name

    def item(self, item_id: str) -> ItemStore:
        return ItemStore(self.directory / safe_component(item_id), item_id, self)

    def read_manifest(self) -> dict[str, Any]:
        return read_json(self.manifest_path) or {}

    def finished_item_ids(self) -> set[str]:
        """Item ids the manifest lists as finished (they will be read back, not evaluated)."""
        items = self.read_manifest().get("items")
        if not isinstance(items, dict):
            return set()
        return {
            k
            for k, v in items.items()
            if isinstance(v, dict) and ItemStatus.of(v.get("status")) is ItemStatus.FINISHED
        }

    @contextmanager
    def _manifest(self) -> Iterator[dict[str, Any]]:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreWriteError(
                exc.errno, f"cannot create {self.directory}: {exc.strerror}"
            ) from exc
        with self._lock:
            manifest = self.read_manifest()
            manifest.setdefault("schema_version", MANIFEST_VERSION)
            manifest.setdefault("run_id", self.run_id)
            manifest.setdefault("items", {})
            yield manifest
            atomic_write_json(self.manifest_path, manifest)

    def init(self, **fields: Any) -> None:
        """Create the run directory and record run-level metadata (first writer sets created_at)."""
        with self._manifest() as manifest:
            manifest.setdefault("created_at", _now())
            for key, value in fields.items():
                manifest[key] = value
            manifest["updated_at"] = _now()

    def update_item(self, item_id: str, **fields: Any) -> None:
        """Merge ``fields`` into the manifest entry of ``item_id`` (atomic, locked)."""
        with self._manifest() as manifest:
            entry = manifest["items"].setdefault(item_id, {"path": safe_component(item_id)})
            entry.update(fields)
            entry["updated_at"] = _now()
            manifest["updated_at"] = _now()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def new_run_id(parent: Path, run_name: str) -> str:
    """``<run_name>-<YYYYmmdd-HHMMSS>``, with a counter when that exists already."""
    base = f"{safe_component(run_name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = base, 1
    while (parent / candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    return candidate
