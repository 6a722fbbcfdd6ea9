"""Resume beyond one run directory: the ``--restart`` check, duration memory, crash-proof ``--lf``.

The run store (``store/``) and the evaluator (``evaluation/``) make one run
directory resumable. This module registers the controller-side plugins that
span sessions: checking ``--restart OLD_RUN`` before anything runs, and
keeping every item's duration (``scheduling/durations.py``), its tokens per
example (``scheduling/tokens.py``) and pytest's ``--lf`` record current as
items finish rather than at session end.
"""

from __future__ import annotations

import pytest

from pytest_modelbench.errors import ModelbenchUsageError
from pytest_modelbench.scheduling.durations import read_durations, write_durations
from pytest_modelbench.scheduling.tokens import ObservedTokens, read_tokens, write_tokens
from pytest_modelbench.session.core import SESSION_KEY
from pytest_modelbench.session.lastfailed import LastFailedRecorder
from pytest_modelbench.store.records import PROPERTY_PREFIX
from pytest_modelbench.store.runstore import resolve_run_ref
from pytest_modelbench.workers import is_worker


class ResumePlugin:
    """Controller-side: checks ``--restart`` before anything runs and remembers item durations
    and tokens per example."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._durations: dict[str, float] | None = None
        self._tokens: dict[str, ObservedTokens] | None = None

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
        if report.when != "call":
            return
        shown = dict(report.user_properties)  # the item's mb_* properties (JUnit's view)
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
        if self._durations.get(item_id) == seconds:
            return
        self._durations[item_id] = float(seconds)
        write_durations(self.config, self._durations)

    def _work_on_one_server(self, item_id: str, seconds: float) -> float:
        """The item's duration as the scheduler plans it: replicas shortened its wall time
        by the time they served it (``server_s`` in its summary)."""
        mb = self.config.stash.get(SESSION_KEY, None)
        if mb is None or not mb.records or mb.records[-1].item_id != item_id:
            return seconds
        server_s = mb.records[-1].summary.get("server_s")
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
        observed = ObservedTokens.from_summary(
            record.model, record.env, record.variant, record.summary
        )
        if observed is None:
            return
        if self._tokens is None:
            self._tokens = read_tokens(self.config)
        if self._tokens.get(item_id) == observed:
            return
        self._tokens[item_id] = observed
        write_tokens(self.config, self._tokens)


def register(config: pytest.Config) -> None:
    """Register resume's controller-side plugins (only the controller writes the cache)."""
    if is_worker(config):
        return
    config.pluginmanager.register(ResumePlugin(config), "modelbench-resume")
    if getattr(config, "cache", None) is not None:
        config.pluginmanager.register(LastFailedRecorder(config), "modelbench-lastfailed")
