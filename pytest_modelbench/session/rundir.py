"""Where this session's run directory is: chosen once (``--run-id``, ``--auto-resume``, a new
id), checked writable, and kept apart from the reference runs the session gates against."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_modelbench.config.loading import display_path
from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.errors import ModelbenchUsageError, one_of
from pytest_modelbench.planning.item import Plan
from pytest_modelbench.store.runlog import find_latest_run
from pytest_modelbench.store.runstore import new_run_id
from pytest_modelbench.workers import WORKER_RUN_DIR, worker_input


class RunDirectory:
    """The session's run directory (a worker takes its controller's) and the runs it reads."""

    def __init__(
        self,
        config: pytest.Config,
        options: RunOptions,
        plan: Callable[[], Plan],
        notes: list[str],
    ) -> None:
        self.config = config
        self.options = options
        self._plan = plan  # the session's plan, built when first needed
        self._notes = notes  # the session's header lines
        self._path: Path | None = None

    @property
    def chosen(self) -> Path | None:
        """The run directory if it was chosen already (nothing is resolved here)."""
        return self._path

    @property
    def path(self) -> Path:
        if self._path is None:
            given = worker_input(self.config).get(WORKER_RUN_DIR)
            self._path = Path(given) if given else self._resolve()
        return self._path

    def parent(self) -> tuple[Path, str]:
        """The directory run directories go in, and the option or file that chose it.

        A relative path is taken from the rootdir, like the config directory, so pytest
        started in a subdirectory of the project uses the same ``configs/`` and ``runs/``.
        """
        parent, where = self.options.run_dir, "--run-dir"
        plan = self._plan()
        if plan.run_parent is not None and self.options.run_dir == Path("runs"):
            parent, where = plan.run_parent, f"{self.options.job_file}: output_dir"
        return (parent if parent.is_absolute() else self.config.rootpath / parent), where

    def check_references(self) -> None:
        """``--baseline-run`` names a run that exists (a run id under the runs directory, a
        link there included, or an absolute path, as ``--restart`` takes), or one usage error
        before anything runs; a relative path that climbs out is refused."""
        run_id = self.options.baseline_run
        if not run_id:
            return
        parent, _ = self.parent()
        if Path(run_id).is_absolute() and Path(run_id).is_dir():
            return
        inside = not Path(run_id).is_absolute() and Path(run_id).name == run_id
        inside = inside and run_id not in (".", "..")
        if inside and (parent / run_id).is_dir():
            return
        runs = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
        raise ModelbenchUsageError(
            f"--baseline-run {run_id}: "
            + (
                f"no run directory {display_path(parent / run_id)}"
                if inside
                else "expected a run id (a directory name under the runs directory) or an "
                "absolute path to a run directory"
            )
            + f"; runs under {display_path(parent)}: {one_of(runs) if runs else '(none)'}"
        )

    def reference_runs(self) -> dict[Path, str]:
        """The runs this session gates against, resolved, with where each is named:
        ``--baseline-run`` and the ``run:`` entries of the planned items' baselines. They are
        read-only for the whole session: never continued, recomputed or forced."""
        parent, _ = self.parent()
        named: dict[Path, str] = {}
        if self.options.baseline_run:
            named[(parent / self.options.baseline_run).resolve()] = (
                f"--baseline-run {self.options.baseline_run}"
            )
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.gating.baselines import BaselineBook

        book = BaselineBook(self.options.config_dir / "baselines", parent)  # reads entries only
        for item in self._plan().items:
            try:
                entries = book.entries(item.model_name)
            except ModelbenchUsageError:  # a broken file fails the items that need it
                continue
            for key in (item.variant.id, item.env):
                run = getattr(entries.get(key), "run", None)
                if run:
                    where = f"{display_path(book.path_for(item.model_name))}: {key}: run: {run}"
                    named.setdefault((parent / run).resolve(), where)
                    break
        return named

    def _resolve(self) -> Path:
        parent, _ = self.parent()
        references = self.reference_runs()
        if self.options.run_id:
            chosen = parent / self.options.run_id
            named = references.get(chosen.resolve())
            if named is not None:
                raise ModelbenchUsageError(
                    f"--run-id {self.options.run_id}: that run is this session's reference "
                    f"({named}) and is never written; give a new --run-id, or drop --run-id "
                    "to start a new run"
                )
            return chosen
        if self.options.auto_resume:  # with --restart OLD: the latest run seeded from OLD
            latest = find_latest_run(
                parent, self._plan().run_name, restart_from=self.options.restart
            )
            if latest is not None:
                named = references.get(latest.resolve())
                if named is None:
                    return latest
                fresh = parent / new_run_id(parent, self._plan().run_name)
                self._notes.append(
                    f"the latest run {latest.name} is this session's reference ({named}) and "
                    f"is never written: writing a new run {fresh.name} instead of continuing it"
                )
                return fresh
        return parent / new_run_id(parent, self._plan().run_name)

    def check_writable(self) -> None:
        """Run directories can be created where this run writes, or one usage error now
        (rather than a traceback per item)."""
        reason = _unwritable(self.path)
        if reason is not None:
            parent, where = self.parent()
            raise ModelbenchUsageError(
                f"{where}: cannot create run directories in {parent}: {reason}; choose a "
                f"writable directory (a relative path is taken from the rootdir "
                f"{self.config.rootpath})"
            )


def _unwritable(run_dir: Path) -> str | None:
    """Why ``run_dir`` cannot be created and written (None: it can); creates nothing."""
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"{existing} is not writable ({exc.strerror or exc})"
    return None
