"""``--update-baselines`` at session end: the settled scores written to the baseline files,
and what the terminal says about them (written, kept, skipped, or could not be written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_modelbench.config.options import RunOptions
from pytest_modelbench.store.result import EvalResult


class BaselineUpdate:
    """Controller-side: writes the baseline files once every verdict is final."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.written: list[Path] = []
        self.errors: list[str] = []  # files it could not write
        self.skipped: list[str] = []  # entries of failed items

    def write(self, session: pytest.Session, records: list[EvalResult], run_id: str) -> None:
        """Write the scores of ``records``; an interruption or a file not written fails the run."""
        # lazily: loaded only when this runs, not at every pytest start-up
        from pytest_modelbench.gating.baselines import update_baselines

        try:
            self.written = update_baselines(
                self.options.config_dir / "baselines",
                records,
                run_id,
                replace=self.options.replace_baselines,
                errors=self.errors,
                include_failed=self.options.update_failed_baselines,
                skipped=self.skipped,
            )
        except KeyboardInterrupt:  # each file is written atomically: none is half written
            self.errors.append(
                "--update-baselines: interrupted; files not yet written are left as they "
                "were: re-run the same command (finished items are reused)"
            )
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        if self.errors and session.exitstatus == pytest.ExitCode.OK:
            # a baseline-refresh job that refreshed nothing must not pass
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def write_summary(
        self, terminalreporter: pytest.TerminalReporter, records: list[EvalResult]
    ) -> None:
        """The terminal's lines about the baseline files."""
        if self.written:
            terminalreporter.write_line(
                "baselines written: " + ", ".join(str(p) for p in self.written)
            )
        elif self.options.update_baselines and not self.errors and not self.skipped:
            scored = any(r.score is not None for r in records)
            terminalreporter.write_line(
                "--update-baselines: no baseline file changed: "
                + (
                    "every entry was kept (see the warnings; --mb-replace-baselines replaces them)"
                    if scored
                    else "no item has a score to write"
                ),
                yellow=True,
            )
        for line in self.skipped:
            terminalreporter.write_line(line, yellow=True)
        for line in self.errors:
            terminalreporter.write_line(line, red=True)
