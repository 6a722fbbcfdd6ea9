"""Session-end imports start in the background while an item waits on its server."""

from __future__ import annotations

import sys
import threading

from pytest_modelbench.running import prefetch


def _join_prefetch() -> int:
    threads = [t for t in threading.enumerate() if t.name == "modelbench-prefetch"]
    for thread in threads:
        thread.join(timeout=60)
    return len(threads)


def test_modules_are_imported_once_in_a_daemon_thread() -> None:
    sys.modules.pop("colorsys", None)
    prefetch.prefetch(("no_such_module_for_modelbench", "colorsys"))
    prefetch.prefetch(("colorsys",))  # already started: no second thread
    assert _join_prefetch() <= 1
    # a missing module is skipped quietly; session end reports what is missing itself
    assert "no_such_module_for_modelbench" not in sys.modules and "colorsys" in sys.modules
    prefetch.prefetch(("colorsys",))
    assert _join_prefetch() == 0


def test_session_end_modules_are_the_parquet_writer() -> None:
    assert prefetch.SESSION_END_MODULES[0] == "pyarrow"
    # an in-process pytester run earlier in this worker may have imported them and then
    # restored sys.modules: start afresh
    prefetch._started.difference_update(prefetch.SESSION_END_MODULES)
    prefetch.prefetch(prefetch.SESSION_END_MODULES)
    _join_prefetch()
    assert "pyarrow.parquet" in sys.modules
