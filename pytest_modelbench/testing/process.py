"""The simulated server in its own process: ``python -m pytest_modelbench.testing.simserver``.

:class:`SimProcess` starts the simulator's command line with the given flags, reads the base URL
it prints first, and stops it (SIGTERM, then SIGKILL). Load generators and the ``perf/``
scripts use it where the server must not share the measured process's CPU or event loop::

    with SimProcess(["--slots", "64", "--latency", "0.02"]) as server:
        run_client(server.base_url)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType

SIMSERVER_MODULE = "pytest_modelbench.testing.simserver"


class SimProcessError(RuntimeError):
    """The simulator exited before it printed its URL (a bad flag; its stderr says which)."""


class SimProcess:
    """``python -m pytest_modelbench.testing.simserver FLAGS``, running until :meth:`stop`."""

    def __init__(
        self, flags: Sequence[str] = (), *, python: str = sys.executable, quiet: bool = False
    ) -> None:
        """``quiet``: its stderr (the request counts it prints when stopped) is dropped."""
        self.argv = [python, "-m", SIMSERVER_MODULE, *flags]
        self.process = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            text=True,
        )
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().strip()
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        if not self.base_url.startswith("http"):
            self.stop()
            raise SimProcessError(
                f"simserver exited with {self.process.returncode} before printing its URL "
                f"({' '.join(self.argv[1:])})"
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (it prints its request counts on stderr); kill it if it hangs."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
