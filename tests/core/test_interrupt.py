"""Ctrl-C (SIGINT) or SIGTERM during a run: the items in flight are recorded as ``interrupted``
in the manifest, not left ``running``; finished items keep their status."""

from __future__ import annotations

import json
import signal
import time
import types
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
    # the summary lists the item stopped mid-run, says where the run is and how to resume it
    summary = output.split("modelbench summary")[-1].splitlines()
    assert any(
        line.split()[:3] + line.split()[-1:] == ["alpha", "qa", "0", "interrupted"]
        for line in summary
    ), output
    assert f"run store: {run_dir}" in summary, output
    hint = (
        "interrupted: the run store keeps every finished example; "
        "re-running the same command resumes it"
    )
    assert summary[summary.index(f"run store: {run_dir}") + 1] == hint, output


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


def _deep(n: int) -> None:
    if n == 0:
        try:
            raise ConnectionResetError("a reply in flight")
        except ConnectionResetError:
            raise KeyboardInterrupt  # noqa: B904  # as Ctrl-C lands: inside another exception
    _deep(n - 1)


def where(crash: Any) -> tuple[str, int, str]:
    return (crash.path, crash.lineno, crash.message)


@pytest.mark.parametrize("fulltrace", [False, True])
def test_ctrl_c_formats_only_where_it_stopped(fulltrace: bool) -> None:
    """pytest formats the whole traceback of a Ctrl-C (each frame's source and arguments, and
    the exception it interrupted) to print only where it stopped, unless --full-trace: the
    session keeps that frame alone, so the same line prints, at once."""
    from pytest_modelbench.session.core import ModelbenchSession

    try:
        _deep(30)
    except KeyboardInterrupt:
        excinfo = pytest.ExceptionInfo.from_current()
    before = where(excinfo.getrepr(funcargs=True).reprcrash)
    assert len(excinfo.traceback) > 30 and excinfo.value.__context__ is not None
    config = types.SimpleNamespace(option=types.SimpleNamespace(fulltrace=fulltrace))
    ModelbenchSession.pytest_keyboard_interrupt(types.SimpleNamespace(config=config), excinfo)  # type: ignore[arg-type]
    after = excinfo.getrepr(funcargs=True)
    assert where(after.reprcrash) == before  # what pytest prints without --full-trace
    if fulltrace:
        assert len(excinfo.traceback) > 30 and not excinfo.value.__suppress_context__
    else:
        assert len(excinfo.traceback) == 1 and excinfo.value.__suppress_context__
        assert excinfo.traceback[0].name == "_deep"
