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
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
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


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never a torn one.

    ``durable`` also fsyncs the data (survives a machine crash, not only a process kill).
    """
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_directory(path.parent)
    except OSError as exc:
        if not tmp:
            raise StoreWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc
        with suppress(OSError):
            os.unlink(tmp)
        raise StoreWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc


def fsync_directory(directory: Path) -> None:
    """Make a rename or new file in ``directory`` durable (best effort: not every OS allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write_text(
        path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    )


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
        those rows: what :meth:`read` holds, streamed in two passes over the file that keep
        only each key's line number in memory."""
        last: dict[tuple[str, int], int] = {}
        for n, row in enumerate(self.rows()):
            key = row_key(row)
            if keep is None or keep(key):
                last[key] = n
        if not last:
            return
        for n, row in enumerate(self.rows(warn=False)):
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
            self._handle.write(_dumps(row) + "\n")
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
        except OSError as exc:
            raise StoreWriteError(
                exc.errno, f"cannot remove {self.summary_path}: {exc.strerror}"
            ) from exc

    def seed_from(self, other: ItemStore) -> None:
        """Take ``other``'s finished files: the journal hard-linked (copied across filesystems),
        metadata and summary copied; the summary last, so a crash leaves no half-seeded item."""
        link_or_copy(other.journal.path, self.journal.path)
        link_or_copy(other.metadata_path, self.metadata_path, link=False)
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
        return ItemStore(self.directory / safe_component(item_id))

    def read_manifest(self) -> dict[str, Any]:
        return read_json(self.manifest_path) or {}

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
            manifest.setdefault("schema_version", SCHEMA_VERSION)
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


def link_or_copy(src: Path, dst: Path, *, link: bool = True) -> None:
    """Put ``src``'s content at ``dst`` atomically: a hard link when allowed and possible,
    else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.seed.tmp")
    try:
        with suppress(FileNotFoundError):
            tmp.unlink()
        if link:
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copy2(src, tmp)
        else:
            shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except OSError as exc:
        with suppress(OSError):
            tmp.unlink()
        raise StoreWriteError(exc.errno, f"cannot copy {src} to {dst}: {exc.strerror}") from exc


def unshare(path: Path) -> None:
    """Replace a hard-linked file by a private copy, so appending never changes another run."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.unshare.tmp")
    try:
        shutil.copy2(path, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with suppress(OSError):
            tmp.unlink()
        raise StoreWriteError(exc.errno, f"cannot copy {path}: {exc.strerror}") from exc


def find_latest_run(parent: Path, run_name: str, restart_from: str | None = None) -> Path | None:
    """The most recently created run directory under ``parent`` whose manifest has ``run_name``
    (and, given ``restart_from``, that was seeded from that run, so ``--restart`` continues it)."""
    if not parent.is_dir():
        return None
    best: tuple[str, Path] | None = None
    for manifest_path in parent.glob(f"*/{MANIFEST}"):
        manifest = read_json(manifest_path) or {}
        if manifest.get("run_name") != run_name:
            continue
        if restart_from is not None and manifest.get("restart_from") != Path(restart_from).name:
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
