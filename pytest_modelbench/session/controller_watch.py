"""An xdist worker whose controller is gone stops its item (``kill -9`` of ``pytest -n``).

execnet notices the closed channel, but only sends the worker SIGINT 5 s later and ends it
with ``os._exit`` 10 s after that: a worker started with SIGINT ignored (a background job of a
shell script, as CI runners start them) evaluates on for those 15 s, with its GPUs held, and
is then killed without settling its item. A thread here watches the process that started the
worker (the controller for ``popen`` workers, ssh's session for remote ones): when it is gone,
SIGTERM stops the running item as Ctrl-C does (its servers stopped, the item marked
interrupted in the manifest), or ends an idle worker.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

POLL_S = 0.5  # how soon a worker notices; one getppid() call per poll


class ControllerWatch:
    """Registered on xdist workers by ``plugin.start_session``; stops with the session."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self.parent = os.getppid()
        self._poll_s = poll_s
        self._stop = threading.Event()
        # as its child, a changed parent pid is proof (a reused pid cannot fool it)
        self._thread = threading.Thread(
            target=self._watch, name="modelbench-controller-watch", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            if os.getppid() != self.parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def pytest_unconfigure(self) -> None:
        self._stop.set()


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(ControllerWatch(), "modelbench-controller-watch")
