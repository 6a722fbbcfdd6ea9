"""The fault matrix: faults injected, examples, completed, errors reported, duplicates, losses.

Runs real ``pytest -n 2`` sessions of a throw-away project against simulated
servers (``pytest_modelbench.testing.faultmatrix``, the same scenarios that
``tests/reliability/test_fault_matrix.py`` asserts on) and prints one Markdown row
per scenario and session:

* the matrix: one model per fault kind (5xx, 429 + Retry-After, timeouts, resets,
  malformed JSON, 200 without choices), all of them at once, and all at once with
  one retry only (over the error budget: the item errors), then a re-run of the same
  command, which asks only for the failed examples;
* a server that starts to hang mid-run, then a re-run against the restarted server;
* a server that dies and comes back on the same port 2 s later, ridden out by the
  default retries, and again with a retry budget too short for the outage + a re-run.

"faults injected" counts the server's faulty answers plus the attempts that never
reached it (refused while it was down). Every row must show 0 duplicates, 0 wrong
answers and 0 lost examples; the script exits with status 1 (listing the breaches) if not.

    python perf/fault_matrix.py [--quick] [-n 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pytest_modelbench.testing.faultmatrix import (
    Audit,
    Phase,
    markdown_table,
    merged,
    run_hang,
    run_matrix,
    run_outage,
    subprocess_run,
)


def _row(audit: Audit, session: str, phase: Phase) -> dict[str, Any]:
    data = asdict(audit)
    for name in ("answered", "error_ids", "asked"):
        del data[name]
    data.update(
        session=session,
        faults_injected=audit.faults_injected,
        exit_status=phase.output.returncode,
        session_s=round(phase.output.duration_s, 2),
        problems=list(audit.problems),
    )
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer examples per item")
    parser.add_argument("-n", "--workers", type=int, default=2, help="xdist workers per session")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    sizes = (40, 20, 30) if args.quick else (100, 40, 60)
    matrix_n, hang_n, outage_n = sizes
    workers = args.workers
    scenarios: list[tuple[str, Callable[[Path], list[Phase]]]] = [
        (
            "matrix",
            lambda root: run_matrix(root, subprocess_run(root), examples=matrix_n, workers=workers),
        ),
        (
            "hang",
            lambda root: run_hang(root, subprocess_run(root), examples=hang_n, workers=workers),
        ),
        (
            "outage",
            lambda root: run_outage(root, subprocess_run(root), examples=outage_n, workers=workers),
        ),
        (
            "outage-budget",
            lambda root: run_outage(
                root, subprocess_run(root), examples=outage_n, workers=workers, ride_out=False
            ),
        ),
    ]
    load_before = os.getloadavg()
    started = time.monotonic()
    table: list[Audit] = []
    rows: list[dict[str, Any]] = []
    sessions: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mb-faults-") as tmp:
        for name, runner in scenarios:
            root = Path(tmp) / name
            root.mkdir()
            for phase in runner(root):
                sessions.append(
                    f"{name}/{phase.name}: exit {phase.output.returncode}, "
                    f"{phase.output.duration_s:.1f} s"
                )
                rows.extend(_row(a, f"{name}/{phase.name}", phase) for a in phase.audits)
                if name == "matrix" and phase.name == "faults":
                    table.extend(phase.audits)
                elif name == "matrix":
                    count = len(phase.audits)
                    table.append(
                        merged(f"re-run of the same command ({count} items)", phase.audits)
                    )
                else:
                    count = len(phase.audits)
                    table.append(merged(f"{phase.name} ({count} items)", phase.audits))
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()
    print(
        f"{len(sessions)} pytest sessions (-n {workers}) in {elapsed:.0f} s; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; cpus: {os.cpu_count()}\n"
    )
    print(markdown_table(table))
    total = merged("total", table)
    print(
        f"\nTotal: {total.faults_injected} faults injected over {total.examples} example slots; "
        f"{total.errors} errors reported, {total.duplicates} duplicates, {total.wrong} wrong, "
        f"{total.lost} lost.\n"
    )
    print("Sessions: " + "; ".join(sessions))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    problems = [p for a in table for p in a.problems]
    if problems:
        print("\n".join(["invariants broken:", *problems]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
