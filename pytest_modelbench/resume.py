"""Resume beyond one run directory: ``--restart`` sources, duration memory, crash-proof ``--lf``.

The run store (``store.py``) and the evaluator (``evaluate.py``) make one run
directory resumable. This module holds what spans sessions and runs:
resolving ``--restart OLD_RUN`` to a directory, remembering every item's
duration in the pytest cache (``modelbench/durations``, for scheduling and
ETA), and registering the controller-side plugins that keep these records
current as items finish rather than at session end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.errors import ModelbenchUsageError, one_of
from pytest_modelbench.lastfailed import LastFailedRecorder, cache_set
from pytest_modelbench.scheduling.costs import DURATIONS_KEY, read_durations
from pytest_modelbench.store import MANIFEST

__all__ = ["DURATIONS_KEY", "ResumePlugin", "read_durations", "register", "resolve_run_ref"]


def resolve_run_ref(parent: Path, ref: str, this_run: Path | None = None) -> Path:
    """The run directory ``--restart REF`` names: a run id under ``parent``, or a directory path."""
    given = Path(ref).expanduser()
    candidates = [given] if given.is_absolute() else [parent / ref, given.absolute()]
    for candidate in candidates:
        if (candidate / MANIFEST).is_file():
            if this_run is not None and candidate.resolve() == this_run.resolve():
                raise ModelbenchUsageError(
                    f"--restart {ref}: that is the run being written ({this_run}); "
                    "name an older run, or drop --restart to continue this one"
                )
            return candidate
    runs = sorted(p.parent.name for p in parent.glob(f"*/{MANIFEST}")) if parent.is_dir() else []
    raise ModelbenchUsageError(
        f"--restart {ref}: no run directory {candidates[0]} (no {MANIFEST} there); "
        f"runs under {parent}: {one_of(runs)}. Give a run id from there "
        "or the path of a run directory"
    )


class ResumePlugin:
    """Controller-side: checks ``--restart`` before anything runs and remembers item durations."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._durations: dict[str, float] | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        from pytest_modelbench.session import SESSION_KEY

        mb = self.config.stash.get(SESSION_KEY, None)
        if mb is None or not mb.active or not mb.options.restart or self.config.option.collectonly:
            return
        try:
            resolve_run_ref(mb.run_dir.parent, mb.options.restart, mb.run_dir)
        except ModelbenchUsageError as exc:
            raise pytest.UsageError(str(exc)) from None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        props: dict[str, Any] = {}
        for entry in report.user_properties:
            key, value = entry
            if key in ("mb_item", "mb_duration_s"):
                props[key] = value
        item_id, seconds = props.get("mb_item"), props.get("mb_duration_s")
        if not item_id or not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            return
        if self._durations is None:
            self._durations = read_durations(self.config)
        if self._durations.get(item_id) == seconds:
            return
        self._durations[item_id] = float(seconds)
        cache_set(self.config, DURATIONS_KEY, self._durations)


def register(config: pytest.Config) -> None:
    """Register resume's controller-side plugins (only the controller writes the cache)."""
    if hasattr(config, "workerinput"):
        return
    config.pluginmanager.register(ResumePlugin(config), "modelbench-resume")
    if getattr(config, "cache", None) is not None:
        config.pluginmanager.register(LastFailedRecorder(config), "modelbench-lastfailed")
