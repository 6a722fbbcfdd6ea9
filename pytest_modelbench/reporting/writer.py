""":class:`ReportWriter`: the plugin object behind live progress and the run directory's reports.

On xdist workers it only installs a progress sink that writes a small JSON
file; on the controller it runs the live display, adds pytest-html columns
when ``--html`` is given, and at session end writes ``report.html``,
``leaderboard.csv/.md/.json`` and ``results.parquet`` into the run directory.
"""

from __future__ import annotations

import functools
import os
import sys
import uuid
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import pytest

from pytest_modelbench.config.options import ReportOptions
from pytest_modelbench.planning.item import Plan
from pytest_modelbench.running.progress import PROGRESS_SINK, FileProgress, RecordingProgress
from pytest_modelbench.workers import WORKER_PROGRESS_DIR, is_worker, worker_input

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from xdist.workermanage import WorkerController

    from pytest_modelbench.reporting.digest import Digests
    from pytest_modelbench.reporting.live import LiveProgress
    from pytest_modelbench.store.result import EvalResult
    from pytest_modelbench.store.runstore import RunStore

PROGRESS_DIRNAME = ".progress"


class SessionView(Protocol):
    """What the reports need from the modelbench session (the plugin passes the session)."""

    @property
    def active(self) -> bool: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def records(self) -> list[EvalResult]: ...

    @property
    def outcomes(self) -> dict[str, str]: ...

    @property
    def plan(self) -> Plan: ...


class WrittenReports(NamedTuple):
    """What a report pass wrote."""

    paths: list[Path]
    """The reports written, ``report.html`` first."""
    note: str | None
    """One line about a report skipped or not written, or None."""
    failed: bool = False
    """A report could not be written (a full disk, an unreadable journal): the session's exit
    status says so; a report skipped on purpose (no pyarrow) is not a failure."""


def write_run_reports(
    run_dir: Path,
    records: list[EvalResult] | None,
    examples: int,
    outcomes: Mapping[str, str] | None = None,
    digests: Digests | None = None,
) -> WrittenReports:
    """All run-directory reports; returns (paths written, note about what was skipped).
    ``digests``: the rows of journals read while their items ran."""
    # lazily: report builders load only at session end (pytest start-up)
    from pytest_modelbench.reporting.examples import EmbeddedExamples
    from pytest_modelbench.reporting.html import write_report
    from pytest_modelbench.reporting.leaderboard import write_leaderboards
    from pytest_modelbench.reporting.model import load_run
    from pytest_modelbench.reporting.rows import (
        PARQUET_NAME,
        FailingPicker,
        ParquetUnavailable,
        write_parquet_if_changed,
    )

    run = load_run(run_dir, records, outcomes=outcomes)
    # the parquet pass over the journals also picks the report's failing examples and packs
    # its embedded ones; when it is skipped or fails, the report reads the journals itself
    pickers = {item.item_id: FailingPicker(item, examples) for item in run.items}
    embedded = EmbeddedExamples()
    note = None
    failed = False
    try:
        # kept when unchanged
        prepared = functools.partial(digests.prepared, run) if digests is not None else None
        if write_parquet_if_changed(
            run, run_dir / PARQUET_NAME, pickers, embedded.add, prepared=prepared
        ):
            embedded.done()
        parquet = [run_dir / PARQUET_NAME]
    except ParquetUnavailable as exc:
        parquet, note = [], f"{PARQUET_NAME} skipped: {exc}"
    except Exception as exc:  # disk full, unreadable journal, Arrow error: the other reports
        # are still written, and the failure is one line of the summary
        parquet, note = [], f"{PARQUET_NAME} not written: {type(exc).__name__}: {exc}"
        failed = True
    picked = {key: p.picked for key, p in pickers.items() if p.picked is not None}
    report = write_report(run, examples=examples, picked=picked, packed=embedded.packed)
    return WrittenReports([report, *write_leaderboards(run), *parquet], note, failed)


class ReportWriter:
    """Registered by ``plugin.pytest_configure`` on every process."""

    def __init__(self, config: pytest.Config, options: ReportOptions, session: SessionView) -> None:
        self.config = config
        self.options = options
        self.session = session
        self.live: LiveProgress | None = None  # on the controller while running
        self._token = uuid.uuid4().hex[:12]
        self._written: list[Path] | None = None
        self._note: str | None = None
        self._digests: Digests | None = None  # journals read while their items run
        self._item_ids: frozenset[str] | None = None
        self._store: RunStore | None = None  # the run's store, once an item started
        self._session: pytest.Session | None = None  # set at session end (its exit status)
        self.mode = "off"
        self.local: RecordingProgress | None = None
        if is_worker(config):
            directory = worker_input(config).get(WORKER_PROGRESS_DIR)
            if directory:
                worker = str(worker_input(config).get("workerid", "worker"))
                config.stash[PROGRESS_SINK] = FileProgress(
                    Path(directory) / f"{worker}.json", worker
                )
            return
        self.mode = self._progress_mode()
        if self.mode != "off":
            self.local = RecordingProgress()
            config.stash[PROGRESS_SINK] = self.local
        if config.pluginmanager.hasplugin("html") and config.getoption("htmlpath", None):
            # lazily: report builders load only at session end (pytest start-up)
            from pytest_modelbench.reporting.htmlplugin import HtmlReportColumns

            config.pluginmanager.register(
                HtmlReportColumns(
                    lambda: self.session.run_dir,
                    lambda: (self.session.records, self.session.outcomes),
                    self.options.report_examples,
                ),
                "modelbench-html",
            )

    # -- progress ------------------------------------------------------------------------------
    def _progress_mode(self) -> str:
        config = self.config
        if (
            self.options.progress == "off"
            or config.get_verbosity() < 0
            or config.option.collectonly
        ):
            return "off"
        if self.options.progress != "auto":
            return self.options.progress
        try:
            tty = os.isatty(sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):
            tty = False
        live_logs = bool(config.getoption("log_cli_level", None) or config.getini("log_cli"))
        return "tty" if tty and not live_logs and os.environ.get("TERM") != "dumb" else "lines"

    def _progress_dir(self) -> Path:
        return self.session.run_dir / PROGRESS_DIRNAME / self._token

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: WorkerController) -> None:
        if self.mode != "off" and self.session.active:
            node.workerinput[WORKER_PROGRESS_DIR] = str(self._progress_dir())

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        if is_worker(self.config) or self.mode == "off" or not self.session.active:
            return
        # lazily: report builders load only at session end (pytest start-up)
        from pytest_modelbench.reporting.live import LiveProgress

        if self.config.pluginmanager.get_plugin("terminalreporter") is None:
            return  # -p no:terminal
        try:
            fd = os.dup(sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):
            return
        writer = self.config.get_terminal_writer()
        interval = self.options.progress_interval or (0.5 if self.mode == "tty" else 15.0)
        self.live = LiveProgress(
            self.mode,
            interval,
            fd,
            self.local,
            self._progress_dir(),  # the dir: xdist workers' files
            current_column=lambda: writer.width_of_current_line,
            width=lambda: _columns(fd, writer.fullwidth),
            flush=writer.flush,
            # a log at the default interval: lines back off, so they do not pile up
            backoff=self.mode != "tty" and not self.options.progress_interval,
        )
        self.live.set_planned(_planned(session.items))
        self.live.start()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, ids: list[str]) -> None:
        if self.live is not None:
            self.live.set_planned(_planned_from_ids(ids, self.session))

    def _stop_live(self) -> None:
        if self.live is not None:
            live, self.live = self.live, None
            live.stop()
            os.close(live.fd)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logstart(self, nodeid: str) -> Generator[None, Any, Any]:
        self._digest_started(nodeid)
        if self.live is None:
            return (yield)
        with self.live.paused():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None, Any, Any]:
        if self.live is None:
            return (yield)
        if report.when in ("call", "setup"):
            item_id = next((v for k, v in report.user_properties if k == "mb_item"), None)
            if item_id and (report.when == "call" or report.failed):
                self.live.item_finished(str(item_id))
        with self.live.paused():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logfinish(self, nodeid: str) -> Generator[None, Any, Any]:
        if self._digests is not None:
            self._digests.finished(nodeid)
        if self.live is None:
            return (yield)
        with self.live.paused():
            return (yield)

    # -- reports -------------------------------------------------------------------------------
    def _digest_started(self, nodeid: str) -> None:
        """A benchmark item started (here or on a worker): read its journal as it grows, so
        session end has its rows made (reporting.digest). Best effort: on any failure session
        end reads the journal, as it always can."""
        if is_worker(self.config) or not self.options.write_reports or not self.session.active:
            return
        item_id = self._item_id(nodeid)
        if item_id is None:
            return
        try:
            if self._digests is None:
                # lazily: only sessions that run benchmark items load these
                from pytest_modelbench.reporting.digest import Digests
                from pytest_modelbench.store.runstore import RunStore

                self._store = RunStore(self.session.run_dir)
                self._digests = Digests()
            assert self._store is not None
            self._digests.started(nodeid, self._store.item(item_id).journal.path)
        except Exception:  # (a thread that cannot start, no memory): nothing is lost
            self._digests = None

    def _item_id(self, nodeid: str) -> str | None:
        """The plan item a node id runs: its parameter, when that is an item id (a test
        parametrized further is read from its journal at session end instead)."""
        if self._item_ids is None:
            try:
                self._item_ids = frozenset(item.item_id for item in self.session.plan.items)
            except Exception:  # no plan: nothing to read early
                self._item_ids = frozenset()
        param = _node_param(nodeid)
        return param if param in self._item_ids else None

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, Any, Any]:
        self._session = session
        self._stop_live()
        result = yield
        self._write_reports()  # after every plain impl: Holm has re-decided the verdicts
        return result

    def pytest_unconfigure(self) -> None:
        self._stop_live()
        if self._digests is not None:
            self._digests.close()

    def _write_reports(self) -> None:
        if self._written is not None or is_worker(self.config) or not self.options.write_reports:
            return
        self._written = []
        records = self.session.records
        if not records:
            return
        failed: pytest.ExitCode | None = None
        try:
            self._written, self._note, not_all = write_run_reports(
                self.session.run_dir,
                records,
                self.options.report_examples,
                self.session.outcomes,
                self._digests,
            )
            failed = pytest.ExitCode.TESTS_FAILED if not_all else None
        except OSError as exc:
            self._note = f"reports not written: {exc}"
            failed = pytest.ExitCode.TESTS_FAILED
        except KeyboardInterrupt:  # Ctrl-C while they are written: pytest's interrupted run
            self._note = (
                f"reports not written: interrupted; 'modelbench report "
                f"{self.session.run_dir.name}' writes them"
            )
            failed = pytest.ExitCode.INTERRUPTED
        finally:
            if self._digests is not None:
                self._digests.close()
        session = self._session
        # a CI job must not pass without its reports (a full disk is exit 1, not 0)
        if (
            failed is not None
            and session is not None
            and (failed == pytest.ExitCode.INTERRUPTED or session.exitstatus == pytest.ExitCode.OK)
        ):
            session.exitstatus = failed

    @pytest.hookimpl(trylast=True)  # after the session's summary table
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        self._write_reports()
        if self._written:
            first, *rest = self._written
            terminalreporter.write_line(
                f"modelbench report: {first}"
                + (f" (also {', '.join(p.name for p in rest)})" if rest else "")
            )
        if self._note:
            terminalreporter.write_line(f"modelbench: {self._note}")


def _columns(fd: int, fallback: int) -> int:
    """The terminal's width, read on our own descriptor (fd 1 may be captured right now)."""
    try:
        columns = os.get_terminal_size(fd).columns
    except OSError:
        return fallback
    return columns if columns > 0 else fallback  # a pseudo-terminal may report 0 x 0


def _planned(items: list[pytest.Item]) -> dict[str, str]:
    planned = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        planned_item = callspec.params.get("mb_item") if callspec is not None else None
        if planned_item is not None:
            planned[planned_item.item_id] = planned_item.variant.id
    return planned


def _node_param(nodeid: str) -> str | None:
    """The parameter part of a node id (``test_x[alpha-qa-seed0]`` → ``alpha-qa-seed0``)."""
    if "[" not in nodeid or not nodeid.endswith("]"):
        return None
    return nodeid[nodeid.index("[") + 1 : -1]


def _planned_from_ids(ids: list[str], session: SessionView) -> dict[str, str]:
    """xdist: the controller sees node ids only; match their parameter part to plan items."""
    try:
        by_id = {item.item_id: item.variant.id for item in session.plan.items}
    except Exception:
        return {}
    planned = {}
    for nodeid in ids:
        param = _node_param(nodeid)
        if param is None:
            continue
        matches = [item_id for item_id in by_id if item_id == param or item_id in param]
        if matches:
            best = max(matches, key=len)
            planned[best] = by_id[best]
    return planned


def register(config: pytest.Config, options: ReportOptions, session: SessionView) -> None:
    """Called from ``plugin.pytest_configure`` with the parsed options and the session object."""
    config.pluginmanager.register(ReportWriter(config, options, session), "modelbench-reports")
