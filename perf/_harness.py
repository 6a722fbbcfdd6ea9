"""What the perf/ scripts share: the package's simulated server in its own process.

Every script that measures against a simulated server starts it here, through the package's own
launcher (:class:`pytest_modelbench.testing.process.SimProcess`), with fixed latency (the ideal
time of a load is then requests x latency / slots) and, given ``log``, its request log read back.
A script imports this module as ``_harness`` (Python puts a script's own directory first on
``sys.path``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pytest_modelbench.testing.process import SimProcess, SimProcessError

MODEL = "sim-model"  # the simulator's default model name


class Sim(SimProcess):
    """``python -m pytest_modelbench.testing.simserver`` with perf's flags; ``SystemExit`` with
    the reason when it cannot start."""

    def __init__(
        self,
        *,
        slots: int,
        latency: float,
        accuracy: float | None = None,
        lookup: Path | None = None,
        model: str = MODEL,
        log: Path | None = None,
        python: str | Path = sys.executable,
        quiet: bool = False,
    ) -> None:
        self.log = log
        flags = ["--slots", str(slots), "--latency", str(latency), "--latency-dist", "fixed"]
        flags += ["--models", model]
        if accuracy is not None:
            flags += ["--accuracy", str(accuracy)]
        if lookup is not None:
            flags += ["--lookup", str(lookup)]
        if log is not None:
            flags += ["--log", str(log)]
        try:
            super().__init__(flags, python=str(python), quiet=quiet)
        except SimProcessError as exc:
            raise SystemExit(str(exc)) from None

    def offset(self) -> int:
        """Where the request log ends now (read the requests after it with :meth:`since`)."""
        assert self.log is not None, "started without a request log"
        return self.log.stat().st_size if self.log.exists() else 0

    def since(self, offset: int) -> list[dict[str, Any]]:
        """Completion requests logged after byte ``offset`` (the /models pre-flight excluded)."""
        assert self.log is not None, "started without a request log"
        with self.log.open("rb") as handle:
            handle.seek(offset)
            lines = handle.read().split(b"\n")
        records = [json.loads(line) for line in lines if line.strip()]
        return [r for r in records if str(r["path"]).endswith("completions")]
