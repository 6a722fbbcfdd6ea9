"""Resume beyond one run directory: the ``--restart`` check, duration memory, crash-proof ``--lf``.

The run store (``store/``) and the evaluator (``evaluation/``) make one run
directory resumable. This module registers the controller-side plugins that
span sessions: checking ``--restart OLD_RUN`` before anything runs, and
keeping every item's duration (``scheduling/durations.py``), its tokens per
example (``scheduling/tokens.py``) and pytest's ``--lf`` record current as
items finish rather than at session end. The memories are rewritten whole, so
they are written at most every ``FLUSH_S`` seconds (and at session end): a
10k-item session does not write 10k copies of a 10k-entry file.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.scheduling.durations import read_durations, write_durations
from pytest_modelbench.scheduling.tokens import ObservedTokens, read_tokens, write_tokens
from pytest_modelbench.session.core import SESSION_KEY
from pytest_modelbench.session.lastfailed import LastFailedRecorder
from pytest_modelbench.store.records import PROPERTY_PREFIX
from pytest_modelbench.store.runlog import resolve_run_ref
from pytest_modelbench.store.runstore import ItemStore
from pytest_modelbench.store.summary import EMPTY
from pytest_modelbench.workers import is_worker

FLUSH_S = 2.0  # the memories are written at most this often while items finish


class ResumePlugin:
    """Controller-side: checks ``--restart`` before anything runs and remembers item durations
    and tokens per example."""

    def __init__(self, config: pytest.Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._durations: dict[str, float] | None = None
        self._tokens: dict[str, ObservedTokens] | None = None
        self._clock = clock
        self._dirty: set[str] = set()  # memories changed since they were last written
        self._flushed = float("-inf")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self) -> None:
        mb = self.config.stash.get(SESSION_KEY, None)
        if mb is None or not mb.active or not mb.options.restart or self.config.option.collectonly:
            return
        try:
            resolve_run_ref(mb.run_dir.parent, mb.options.restart, mb.run_dir)
        except ModelbenchUsageError as exc:
            raise pytest.UsageError(str(exc)) from None

    # trylast: after the session's own hook has taken in the item's record (its summary)
    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        shown = dict(report.user_properties)  # the item's mb_* properties (JUnit's view)
        if report.when == "setup" and report.failed:
            # an item that ended in error (over its error budget) still measured the tokens
            # of the replies it got
            item_id = shown.get(PROPERTY_PREFIX + "item")
            if isinstance(item_id, str):
                self._remember_tokens(item_id)
                self._flush(force=False)
            return
        if report.when != "call":
            return
        item_id, seconds = (
            shown.get(PROPERTY_PREFIX + "item"),
            shown.get(PROPERTY_PREFIX + "duration_s"),
        )
        if (
            not isinstance(item_id, str)
            or not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
        ):
            return
        self._remember_tokens(item_id)
        seconds = self._work_on_one_server(item_id, float(seconds))
        if self._durations is None:
            self._durations = read_durations(self.config)
        if self._durations.get(item_id) != seconds:
            self._durations[item_id] = float(seconds)
            self._dirty.add("durations")
        self._flush(force=False)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        self._flush(force=True)

    def _flush(self, *, force: bool) -> None:
        """Write the memories that changed, at most every ``FLUSH_S`` unless ``force``."""
        now = self._clock()
        if not self._dirty or (not force and now - self._flushed < FLUSH_S):
            return
        if "durations" in self._dirty and self._durations is not None:
            write_durations(self.config, self._durations)
        if "tokens" in self._dirty and self._tokens is not None:
            write_tokens(self.config, self._tokens)
        self._dirty.clear()
        self._flushed = now

    def _work_on_one_server(self, item_id: str, seconds: float) -> float:
        """The item's duration as the scheduler plans it: replicas shortened its wall time
        by the time they served it (``server_s`` in its summary)."""
        mb = self.config.stash.get(SESSION_KEY, None)
        if mb is None or not mb.records or mb.records[-1].item_id != item_id:
            return seconds
        server_s = mb.records[-1].summary.server_s
        if not isinstance(server_s, (int, float)) or isinstance(server_s, bool):
            return seconds
        return max(seconds, float(server_s))

    def _remember_tokens(self, item_id: str) -> None:
        """Tokens per example from the record the controller has just taken in for ``item_id``
        (its ``summary.json``): read from the session, not from the store again."""
        mb = self.config.stash.get(SESSION_KEY, None)
        if mb is None or not mb.records or mb.records[-1].item_id != item_id:
            return  # not a benchmark item's first report (a second test of it: already seen)
        record = mb.records[-1]
        # an item that ended in error has no record of its own: its summary.json, when written
        summary = record.summary or ItemStore(record.directory).read_summary() or EMPTY
        observed = ObservedTokens.from_summary(record.model, record.env, record.variant, summary)
        if observed is None:
            return
        if self._tokens is None:
            self._tokens = read_tokens(self.config)
        if self._tokens.get(item_id) == observed:
            return
        self._tokens[item_id] = observed
        self._dirty.add("tokens")


def register(config: pytest.Config) -> None:
    """Register resume's controller-side plugins (only the controller writes the cache)."""
    if is_worker(config):
        return
    config.pluginmanager.register(ResumePlugin(config), "modelbench-resume")
    if getattr(config, "cache", None) is not None:
        config.pluginmanager.register(LastFailedRecorder(config), "modelbench-lastfailed")
