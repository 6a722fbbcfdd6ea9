"""Ctrl-C (SIGINT) or SIGTERM during a run: the items in flight are recorded as ``interrupted``
in the manifest, not left ``running``; finished items keep their status."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Project, configure, manifest
from tests.resume.conftest import completions, kill_group, start_pytest


def item_status(run_dir: Path, item_id: str) -> str | None:
    try:
        entry = manifest(run_dir).get("items", {}).get(item_id) or {}
    except (OSError, json.JSONDecodeError):  # not written yet, or being replaced
        return None
    status = entry.get("status")
    return str(status) if status is not None else None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_marks_items_in_flight_interrupted(
    project: Project, sim: Any, signum: signal.Signals
) -> None:
    configure(project, "http://placeholder", n=200)
    # 200 examples at 2 in flight x 0.2 s: about 20 s per item, so the signal lands mid-item
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), latency=0.2)
    configure(project, server.base_url, n=200, seeds=[0, 1], max_concurrent=2)
    log = project.root / "interrupted.log"
    proc = start_pytest(project.root, "benchmarks/", "--model", "alpha", "--run-id", "r", log=log)
    run_dir = project.root / "runs" / "r"
    try:
        deadline = time.monotonic() + 60
        while item_status(run_dir, "alpha-qa-seed0") != "running" or len(completions(server)) < 4:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the item never started"
            time.sleep(0.05)
        proc.send_signal(signum)
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
    output = log.read_text(errors="replace")
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    items = manifest(run_dir)["items"]
    assert items["alpha-qa-seed0"]["status"] == "interrupted", output
    assert "alpha-qa-seed1" not in items or items["alpha-qa-seed1"]["status"] != "running"
    assert "Traceback" not in output.split("KeyboardInterrupt")[0]


def test_resume_after_an_interrupt_finishes_the_item(project: Project, sim: Any) -> None:
    configure(project, "http://placeholder", n=60)
    server = sim(accuracy=1.0, lookup=project.lookup("qa"), latency=0.1)
    configure(project, server.base_url, n=60, max_concurrent=2)
    log = project.root / "first.log"
    proc = start_pytest(project.root, "benchmarks/", "--model", "alpha", "--run-id", "r", log=log)
    run_dir = project.root / "runs" / "r"
    try:
        deadline = time.monotonic() + 60
        while len(completions(server)) < 6:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
    assert item_status(run_dir, "alpha-qa-seed0") == "interrupted"
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "--run-id", "r")
    result.assert_outcomes(passed=1)
    assert item_status(run_dir, "alpha-qa-seed0") == "finished"
