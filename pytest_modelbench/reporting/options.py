"""Report and progress options (``--mb-progress``, ``--mb-report-examples``...), parsed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

PROGRESS_MODES = ("auto", "tty", "lines", "off")

# (flag, dest, help, kind)
_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "--mb-progress",
        "progress",
        "live progress: auto (status line on a terminal, else periodic lines), tty, lines, off",
        "str",
    ),
    (
        "--mb-progress-interval",
        "progress_interval",
        "seconds between progress updates (default: 0.5 on a terminal, 15 otherwise)",
        "float",
    ),
    (
        "--mb-report-examples",
        "report_examples",
        "wrong/errored examples shown per item in HTML reports (default 5)",
        "int",
    ),
    (
        "--mb-no-reports",
        "no_reports",
        "do not write report.html, leaderboard.* and results.parquet into the run directory",
        "flag",
    ),
)


def add_report_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("modelbench")
    for flag, dest, help_text, kind in _OPTIONS:
        if kind == "flag":
            group.addoption(
                flag, dest=f"mb_{dest}", action="store_true", default=None, help=help_text
            )
        else:
            group.addoption(
                flag,
                dest=f"mb_{dest}",
                action="store",
                default=None,
                metavar=dest.split("_")[-1].upper(),
                help=help_text,
            )
        if kind == "flag":
            parser.addini(f"modelbench_{dest}", f"default for {flag}", type="bool", default=None)
        else:
            parser.addini(f"modelbench_{dest}", f"default for {flag}", type="string", default=None)


def _raw(config: pytest.Config, dest: str) -> Any:
    value = config.getoption(f"mb_{dest}", default=None)
    if value is None:
        value = config.getini(f"modelbench_{dest}")
    return None if value in ("", None) else value


@dataclass(frozen=True)
class ReportOptions:
    progress: str
    progress_interval: float | None
    report_examples: int
    write_reports: bool

    @classmethod
    def from_config(cls, config: pytest.Config) -> ReportOptions:
        progress = str(_raw(config, "progress") or "auto").strip().lower()
        if progress not in PROGRESS_MODES:
            raise pytest.UsageError(
                f"--mb-progress: unknown mode {progress!r}; use one of {', '.join(PROGRESS_MODES)}"
            )
        interval_raw = _raw(config, "progress_interval")
        interval: float | None = None
        if interval_raw is not None:
            try:
                interval = float(interval_raw)
            except ValueError:
                interval = -1.0
            if not interval > 0:
                raise pytest.UsageError(
                    "--mb-progress-interval: expected a positive number of seconds, "
                    f"got {interval_raw!r}"
                )
        examples_raw = _raw(config, "report_examples")
        try:
            examples = 5 if examples_raw is None else int(examples_raw)
        except ValueError:
            examples = -1
        if examples < 0:
            raise pytest.UsageError(
                f"--mb-report-examples: expected a whole number >= 0, got {examples_raw!r}"
            )
        return cls(progress, interval, examples, not bool(_raw(config, "no_reports")))
