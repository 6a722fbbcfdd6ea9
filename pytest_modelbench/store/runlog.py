"""A run as it is read back: :func:`read_run` and the one resolver of run directories.

Every reader of a finished or running run (the reports, ``modelbench runs``, ``compare``,
the pytest-html and JUnit views) reads it through :func:`read_run`: the manifest, and each
item's manifest entry, ``summary.json`` and saved record (``result.json``: its typed verdict),
with the item's status as an :class:`ItemStatus` and the run's as a :class:`RunStatus`
decided by one rule. A run directory named on a command line (``modelbench report REF``,
``--restart REF``) or found again (``--mb-auto-resume``) is resolved here, by one rule.
"""

from __future__ import annotations

import configparser
import datetime as dt
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_modelbench.errors import ModelbenchUsageError, one_of
from pytest_modelbench.names import safe_component
from pytest_modelbench.store.files import read_json
from pytest_modelbench.store.records import ItemStatus, TextEnum
from pytest_modelbench.store.result import EvalResult
from pytest_modelbench.store.runstore import MANIFEST, RunStore
from pytest_modelbench.store.summary import ItemSummary
from pytest_modelbench.store.verdict import Verdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency on 3.10
    import tomli as tomllib

RUNS = "runs"  # the run directories' parent, relative to the project's root (the rootdir)
PROJECT_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
PROJECT_DIRS = ("configs",)  # modelbench's configuration directory: a project without an ini
STALE_AFTER_S = 600  # a "running" run whose manifest is older than this was interrupted
LATEST = "latest"  # the run reference that names the most recent run


class RunStatus(TextEnum):
    """Where a whole run stands (``modelbench runs``; reports say it in three words)."""

    EMPTY = "empty"  # no item yet
    RUNNING = "running"  # an item is running and the manifest was written lately
    INTERRUPTED = "interrupted"  # an item is running but nothing was written for a while
    ERROR = "error"  # an item stopped with an error
    FAILED = "failed"  # an item failed its gate (or errored without an error entry)
    FINISHED = "finished"

    @property
    def report_word(self) -> str:
        """``incomplete``, ``failed`` or ``finished``: the run's status in its reports."""
        if self in (RunStatus.EMPTY, RunStatus.RUNNING, RunStatus.INTERRUPTED):
            return "incomplete"
        return "failed" if self in (RunStatus.ERROR, RunStatus.FAILED) else "finished"


def _parse_time(text: Any) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return None


def run_status(
    items: Iterable[tuple[ItemStatus | None, bool]],
    updated_at: Any = None,
    now: dt.datetime | None = None,
) -> RunStatus:
    """The run's status from its items' (status, failed) pairs: the one rule every reader
    uses. A running item makes the run running, or interrupted when the manifest
    (``updated_at``) is older than :data:`STALE_AFTER_S`; then an errored item, then a
    failed one."""
    pairs = list(items)
    if not pairs:
        return RunStatus.EMPTY
    if any(status is ItemStatus.RUNNING for status, _ in pairs):
        updated = _parse_time(updated_at)
        now = now or dt.datetime.now(dt.timezone.utc)
        if updated is not None and (now - updated).total_seconds() < STALE_AFTER_S:
            return RunStatus.RUNNING
        return RunStatus.INTERRUPTED
    if any(status is ItemStatus.ERROR for status, _ in pairs):
        return RunStatus.ERROR
    return RunStatus.FAILED if any(failed for _, failed in pairs) else RunStatus.FINISHED


@dataclass(frozen=True, repr=False)
class RunItem:
    """One item of a run as stored: its manifest entry, summary, metadata and saved record."""

    item_id: str
    path: str  # the item's directory name inside the run directory
    entry: Mapping[str, Any]  # its manifest entry ({} when the manifest has none)
    summary: ItemSummary | None  # summary.json (the record's, when it has one)
    metadata: Mapping[str, Any] | None  # metadata.json
    result: EvalResult | None = field(default=None, compare=False)  # result.json, if current

    @property
    def status(self) -> ItemStatus | None:
        """The manifest entry's status (the store's bookkeeping of the item's life: running,
        interrupted, error), else the summary's (an item the manifest does not list)."""
        entry = ItemStatus.of(self.entry.get("status"))
        return entry or (self.summary.status if self.summary is not None else None)

    @property
    def current(self) -> bool:
        """Whether the saved record describes the summary there now (an error has none)."""
        result = self.result
        if result is None:
            return False
        fingerprint = str(self.summary.fingerprint or "") if self.summary else None
        return result.error is not None or result.summary.fingerprint == fingerprint

    @property
    def verdict(self) -> Verdict | None:
        """The item's verdict: its current record's, else ``error`` for an entry stopped by an
        error, else None (not gated)."""
        if self.result is not None and self.current:
            return self.result.status
        if ItemStatus.of(self.entry.get("status")) is ItemStatus.ERROR and self.entry.get("error"):
            return Verdict.ERROR
        return None

    @property
    def holm_pending(self) -> bool:
        """Waiting for ``--mb-correction holm``'s final step."""
        return self.result is not None and self.current and self.result.gate_deferred

    def __repr__(self) -> str:
        """One line (the item, its status and verdict), not the nested records."""
        return (
            f"RunItem({self.item_id!r}, status={_word(self.status)}, verdict={_word(self.verdict)})"
        )


def _word(value: TextEnum | None) -> str:
    return "none" if value is None else value.value


@dataclass(frozen=True, repr=False)
class RunLog:
    """A run directory read back: the manifest's run fields and every item."""

    directory: Path
    manifest: Mapping[str, Any]
    items: tuple[RunItem, ...]

    @property
    def run_id(self) -> str:
        return self.directory.name

    def status(self, now: dt.datetime | None = None) -> RunStatus:
        """:func:`run_status` of the items, a failed one being one with a failing verdict."""
        return run_status(
            ((i.status, i.verdict is not None and i.verdict.failed) for i in self.items),
            self.manifest.get("updated_at"),
            now,
        )

    def count(self, status: ItemStatus) -> int:
        return sum(1 for item in self.items if item.status is status)

    def gate_failures(self) -> int:
        """Items whose gate failed (pending Holm's final step or not)."""
        return sum(1 for item in self.items if item.verdict is Verdict.FAIL)

    def __repr__(self) -> str:
        """One line (the run, its status, how many items), not every item's records."""
        return f"RunLog({self.run_id!r}, status={self.status().value}, items={len(self.items)})"


class RunNotFound(FileNotFoundError):
    """The named run directory does not exist or is not a run (message says which and why)."""


def read_run(
    directory: str | os.PathLike[str],
    records: Sequence[EvalResult] | None = None,
    *,
    only_records: bool = False,
    ids: Iterable[str] | None = None,
    manifest: bool = True,
    metadata: bool = True,
) -> RunLog:
    """The run in ``directory``: the manifest's items, each with its saved record; this
    session's ``records`` are taken as they are (``only_records``: just those items;
    ``ids``: just these). ``manifest=False`` (with ``ids``) reads only the items' own files,
    their status then being their summary's: one item read after each test costs the same
    at any run size. ``metadata=False`` leaves each item's ``metadata`` None.

    :class:`RunNotFound` when ``directory`` holds no run manifest (and no ``records`` are
    given): a wrong path is an error, not an empty run."""
    directory = Path(directory)
    if records is None and manifest and not (directory / MANIFEST).is_file():
        found = f"no {MANIFEST} there" if directory.is_dir() else "no such directory"
        raise RunNotFound(
            f"{directory}: not a run directory ({found}; a run directory holds {MANIFEST} "
            "and one directory per item, as pytest writes them under runs/)"
        )
    store = RunStore(directory)
    manifest_fields = store.read_manifest() if manifest or ids is None else {}
    entries = manifest_fields.get("items")
    entries = entries if isinstance(entries, dict) else {}
    by_record = {r.item_id: r for r in records or []}
    if ids is None:
        ids = by_record if only_records else dict.fromkeys([*entries, *by_record])
    items = []
    for item_id in ids:
        item_store = store.item(item_id)
        entry = entries.get(item_id)
        entry = entry if isinstance(entry, dict) else {}
        result = by_record.get(item_id) or EvalResult.load(item_store.directory)
        items.append(
            RunItem(
                item_id=item_id,
                path=str(entry.get("path") or safe_component(item_id)),
                entry=entry,
                summary=result.summary
                if result is not None and result.summary
                else item_store.read_summary(),
                metadata=item_store.read_metadata() if metadata else None,
                result=result,
            )
        )
    return RunLog(directory=directory, manifest=manifest_fields, items=tuple(items))


# -- finding run directories -------------------------------------------------------------------
def find_project_root(start: Path) -> Path | None:
    """The directory pytest would take as the rootdir from ``start``: the nearest one up
    holding a pytest configuration (``pytest.ini``, ``.pytest.ini``, or a ``pyproject.toml``,
    ``tox.ini`` or ``setup.cfg`` with a pytest section), else the nearest with a ``configs/``
    directory; the plugin writes ``runs/`` there. None when there is neither."""
    return _ini_dir(start) or next(
        (d for d in (start, *start.parents) if any((d / n).is_dir() for n in PROJECT_DIRS)),
        None,
    )


def project_runs_dir(start: Path) -> Path | None:
    """Where the plugin writes run directories for a session started in ``start``: the
    rootdir's ``modelbench_run_dir`` (ini), else its ``runs/``; None outside a project. (A
    job file's ``output_dir`` is known only to that job's session: ``--run-dir`` names it.)"""
    root = find_project_root(start)
    if root is None:
        return None
    configured = _ini_values(root).get("modelbench_run_dir")
    parent = Path(str(configured).strip()) if configured and str(configured).strip() else None
    return root / (parent or Path(RUNS))


def _ini_dir(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if any((directory / name).is_file() for name in PROJECT_FILES[:2]):
            return directory
        if any(_pytest_section(directory / name) is not None for name in PROJECT_FILES[2:]):
            return directory
    return None


def _pytest_section(path: Path) -> dict[str, object] | None:
    """The pytest section of ``path`` (pyproject.toml, tox.ini, setup.cfg), or None."""
    if not path.is_file():
        return None
    try:
        if path.name == "pyproject.toml":
            tool = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {})
            section = tool.get("pytest", {}).get("ini_options") if isinstance(tool, dict) else None
            return dict(section) if isinstance(section, dict) else None
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(path, encoding="utf-8")
        name = "tool:pytest" if path.name == "setup.cfg" else "pytest"
        return dict(parser[name]) if parser.has_section(name) else None
    except (OSError, ValueError, configparser.Error):
        return None


def _ini_values(root: Path) -> dict[str, object]:
    """The pytest ini values of the rootdir's configuration file (the first pytest reads)."""
    for name in PROJECT_FILES:
        path = root / name
        if name in PROJECT_FILES[:2] and path.is_file():  # pytest.ini: even without a section
            parser = configparser.ConfigParser(interpolation=None)
            try:
                parser.read(path, encoding="utf-8")
            except (OSError, configparser.Error):
                return {}
            return dict(parser["pytest"]) if parser.has_section("pytest") else {}
        section = _pytest_section(path) if name not in PROJECT_FILES[:2] else None
        if section is not None:
            return section
    return {}


def list_runs(
    parent: Path, run_name: str | None = None, restart_from: str | None = None
) -> list[Path]:
    """Run directories under ``parent``, oldest first (by the manifest's ``created_at``); only
    those named ``run_name`` and, given ``restart_from``, seeded from that run."""
    if not parent.is_dir():
        return []
    found: list[tuple[str, str, Path]] = []
    for manifest_path in parent.glob(f"*/{MANIFEST}"):
        manifest = read_json(manifest_path) or {}
        if run_name is not None and manifest.get("run_name") != run_name:
            continue
        if restart_from is not None and manifest.get("restart_from") != Path(restart_from).name:
            continue
        created = str(manifest.get("created_at", ""))
        found.append((created, manifest_path.parent.name, manifest_path.parent))
    return [path for _, _, path in sorted(found)]


def find_latest_run(parent: Path, run_name: str, restart_from: str | None = None) -> Path | None:
    """The most recent run under ``parent`` named ``run_name`` (and seeded from
    ``restart_from``, so ``--restart`` continues it)."""
    runs = list_runs(parent, run_name, restart_from)
    return runs[-1] if runs else None


def _candidates(parent: Path, ref: str) -> list[Path]:
    """Where a reference may be: a run id under ``parent``, then a path as given."""
    given = Path(ref).expanduser()
    return [given] if given.is_absolute() else [parent / ref, given.absolute()]


def find_run(parent: Path, ref: str) -> Path | None:
    """The run directory ``ref`` names: ``latest``, a run id under ``parent`` or a path."""
    if ref == LATEST:
        runs = list_runs(parent)
        return runs[-1] if runs else None
    return _named(parent, ref)


def _named(parent: Path, ref: str) -> Path | None:
    return next((c for c in _candidates(parent, ref) if (c / MANIFEST).is_file()), None)


def resolve_run(ref: str, parent: Path) -> Path:
    """:func:`find_run`, or :class:`RunNotFound` saying where it looked and what is there."""
    found = find_run(parent, ref)
    if found is not None:
        return found
    if ref == LATEST:
        raise RunNotFound(f"latest: no runs under {parent} yet")
    shown = ", ".join(p.name for p in list_runs(parent)[-5:]) or "none"
    raise RunNotFound(
        f"{ref}: not a run directory (no {MANIFEST} in {Path(ref)} or {parent / ref}); "
        f"recent runs in {parent}: {shown} (list them with 'modelbench runs')"
    )


def resolve_run_ref(parent: Path, ref: str, this_run: Path | None = None) -> Path:
    """The run directory ``--restart REF`` names (:func:`find_run`; never ``this_run``)."""
    found = _named(parent, ref)
    if found is not None:
        if this_run is not None and found.resolve() == this_run.resolve():
            raise ModelbenchUsageError(
                f"--restart {ref}: that is the run being written ({this_run}); "
                "name an older run, or drop --restart to continue this one"
            )
        return found
    runs = sorted(p.name for p in list_runs(parent))
    raise ModelbenchUsageError(
        f"--restart {ref}: no run directory {_candidates(parent, ref)[0]} (no {MANIFEST} "
        f"there); runs under {parent}: {one_of(runs)}. Give a run id from there "
        "or the path of a run directory"
    )
