"""The run store: ``runs/<run_id>/`` with a locked manifest and one directory per item.

Writes are atomic (temp file + fsync + rename); the per-example journal is
append-only, one whole JSON line per example, flushed per line and fsync'd at
item end, so a crash loses at most the examples in flight. Safe for many
xdist workers (and hosts on a shared filesystem) writing one run directory.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from filelock import FileLock

SCHEMA_VERSION = 1
MANIFEST = "run_manifest.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")


class StoreWarning(UserWarning):
    """Something in the run store was damaged and has been worked around."""


class StoreWriteError(OSError):
    """Writing to the run store failed (disk full, I/O error); names the file."""


def safe_component(name: str) -> str:
    """An item id made safe as a single path component (no separators, no '..')."""
    cleaned = _UNSAFE.sub("_", name).strip(".") or "_"
    return cleaned[:200]


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc


def atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's object, or None when missing; a damaged file warns and reads as None."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        warnings.warn(StoreWarning(f"{path}: damaged JSON ignored"), stacklevel=2)
        return None
    return data if isinstance(data, dict) else None


def row_key(row: Mapping[str, Any]) -> tuple[str, int]:
    return (str(row["example_id"]), int(row.get("rollout", 0)))


class Journal:
    """Append-only per-example results (``results.jsonl``) of one item."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    def read(self) -> dict[tuple[str, int], dict[str, Any]]:
        """The last row per (example, rollout); a torn last line or damaged lines are skipped with a warning."""
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return rows
        lines = data.split(b"\n")
        torn = lines.pop() if lines else b""  # text after the last newline was never finished
        if torn.strip():
            warnings.warn(
                StoreWarning(f"{self.path}: dropped an unfinished last line (crash while writing)"),
                stacklevel=2,
            )
            self._truncate_to(len(data) - len(torn))
        damaged = 0
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows[row_key(row)] = row
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                damaged += 1
        if damaged:
            warnings.warn(
                StoreWarning(f"{self.path}: skipped {damaged} damaged line(s); those examples will be redone"),
                stacklevel=2,
            )
        return rows

    def _truncate_to(self, size: int) -> None:
        try:
            with open(self.path, "r+b") as handle:
                handle.truncate(size)
        except OSError:
            pass

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def append(self, row: Mapping[str, Any]) -> None:
        """Write one whole line and flush it to the OS (survives a process crash)."""
        assert self._handle is not None, "journal not open"
        try:
            self._handle.write(_dumps(row) + "\n")
            self._handle.flush()
        except OSError as exc:
            raise StoreWriteError(exc.errno, f"cannot append to {self.path}: {exc.strerror}") from exc

    def close(self) -> None:
        """fsync and close (survives a machine crash from here on)."""
        if self._handle is None:
            return
        try:
            self._handle.flush()
            os.fsync(self._handle.fileno())
        finally:
            self._handle.close()
            self._handle = None

    def discard(self, reason: str) -> Path | None:
        """Move the journal aside (kept for inspection) so the item starts over."""
        if not self.path.exists():
            return None
        aside = self.path.with_name(f"results.{time.strftime('%Y%m%d-%H%M%S')}.{reason}.jsonl")
        os.replace(self.path, aside)
        return aside


@dataclass(frozen=True)
class ItemStore:
    """Files of one item: ``results.jsonl``, ``summary.json``, ``metadata.json``."""

    directory: Path

    @property
    def journal(self) -> Journal:
        return Journal(self.directory / "results.jsonl")

    @property
    def summary_path(self) -> Path:
        return self.directory / "summary.json"

    @property
    def metadata_path(self) -> Path:
        return self.directory / "metadata.json"

    def read_summary(self) -> dict[str, Any] | None:
        return read_json(self.summary_path)

    def read_metadata(self) -> dict[str, Any] | None:
        return read_json(self.metadata_path)

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        atomic_write_json(self.summary_path, {"schema_version": SCHEMA_VERSION, **summary})

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        atomic_write_json(self.metadata_path, {"schema_version": SCHEMA_VERSION, **metadata})

    def clear_summary(self) -> None:
        try:
            self.summary_path.unlink()
        except FileNotFoundError:
            pass


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
        return ItemStore(self.directory / safe_component(item_id))

    def read_manifest(self) -> dict[str, Any]:
        return read_json(self.manifest_path) or {}

    @contextmanager
    def _manifest(self) -> Iterator[dict[str, Any]]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            manifest = self.read_manifest()
            manifest.setdefault("schema_version", SCHEMA_VERSION)
            manifest.setdefault("run_id", self.run_id)
            manifest.setdefault("items", {})
            yield manifest
            atomic_write_json(self.manifest_path, manifest)

    def init(self, **fields: Any) -> None:
        """Create the run directory and record run-level metadata (first writer wins for created_at)."""
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


def find_latest_run(parent: Path, run_name: str) -> Path | None:
    """The most recently created run directory under ``parent`` whose manifest has ``run_name``."""
    if not parent.is_dir():
        return None
    best: tuple[str, Path] | None = None
    for manifest_path in parent.glob(f"*/{MANIFEST}"):
        manifest = read_json(manifest_path) or {}
        if manifest.get("run_name") != run_name:
            continue
        created = str(manifest.get("created_at", ""))
        key = (created, manifest_path.parent)
        if best is None or key > best:
            best = key
    return best[1] if best else None


def new_run_id(parent: Path, run_name: str) -> str:
    """``<run_name>-<YYYYmmdd-HHMMSS>``, with a counter when that exists already."""
    base = f"{safe_component(run_name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    candidate, n = base, 1
    while (parent / candidate).exists():
        n += 1
        candidate = f"{base}-{n}"
    return candidate
