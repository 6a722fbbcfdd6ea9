"""Live progress: what users see with and without ``-n``, on a terminal, in CI logs, with ``-q``."""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_modelbench.reporting.live import (
    LiveProgress,
    format_duration,
    session_view,
    status_line,
)
from pytest_modelbench.running.progress import (
    FileProgress,
    ItemSnapshot,
    RecordingProgress,
    read_progress_dir,
)
from tests.conftest import Project, configure

SESSION_LINE = "[[]modelbench] items */2 · examples */* * req/s · * tok/s · ETA *"
ITEM_RATE = re.compile(
    r"\[modelbench\]   (\S+) (\d+)/80 \(\d+%\) · ([\d.,]+) req/s · ([\d.,]+) tok/s"
)


def slow_project(project: Project, sim: Any) -> None:
    """Two items of 80 examples, 2 in flight, 30 ms each: about 1.2 s per item."""
    configure(project, "http://placeholder", ("alpha", "beta"), n=80)
    server = sim(accuracy=0.8, lookup=project.lookup("qa"), latency=0.03)
    configure(project, server.base_url, ("alpha", "beta"), n=80, max_concurrent=2)


def run(project: Project, *args: str) -> pytest.RunResult:
    return project.pytester.runpytest_subprocess(
        "benchmarks/", "--model", "alpha,beta", "-p", "no:cacheprovider", *args, timeout=120
    )


def rates(output: str) -> dict[str, list[tuple[int, float, float]]]:
    found: dict[str, list[tuple[int, float, float]]] = {}
    for item_id, done, req, tok in ITEM_RATE.findall(output):
        found.setdefault(item_id, []).append(
            (int(done), float(req.replace(",", "")), float(tok.replace(",", "")))
        )
    return found


def test_plain_lines_without_xdist(project: Project, sim: Any) -> None:
    slow_project(project, sim)
    result = run(project, "--mb-progress-interval", "0.2")
    result.assert_outcomes(passed=2)
    output = result.stdout.str()
    result.stdout.fnmatch_lines(
        [SESSION_LINE, "[[]modelbench]   alpha-qa-seed0 */80 (*%) · *ETA *"]
    )
    assert "\x1b[" not in output  # stdout is a pipe: no cursor movement
    seen = rates(output)
    assert set(seen) == {"alpha-qa-seed0", "beta-qa-seed0"}
    for samples in seen.values():
        assert any(0 < done < 80 and req > 0 and tok > 0 for done, req, tok in samples)
    (run_dir,) = project.run_dirs()
    assert not (run_dir / ".progress").exists()


def test_plain_lines_with_two_workers(project: Project, sim: Any) -> None:
    slow_project(project, sim)
    result = run(project, "-n", "2", "--mb-progress-interval", "0.2")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([SESSION_LINE])
    seen = rates(result.stdout.str())
    # both workers reported through their progress files while their items ran
    assert set(seen) == {"alpha-qa-seed0", "beta-qa-seed0"}
    assert all(any(0 < done < 80 and req > 0 for done, req, _ in s) for s in seen.values())
    (run_dir,) = project.run_dirs()
    assert not (run_dir / ".progress").exists()


def test_quiet_is_silent(project: Project, sim: Any) -> None:
    slow_project(project, sim)
    result = run(project, "-q", "--mb-progress-interval", "0.2")
    result.assert_outcomes(passed=2)
    assert "[modelbench]" not in result.stdout.str()


def test_status_line_on_a_terminal(project: Project, sim: Any) -> None:
    """Under a pseudo-terminal ``auto`` draws one status line below pytest's line and erases it."""
    pty = pytest.importorskip("pty")
    slow_project(project, sim)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "benchmarks/",
            "--model",
            "alpha,beta",
            "-p",
            "no:cacheprovider",
            "--mb-progress-interval",
            "0.2",
        ],
        cwd=project.root,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm"},
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(master)
    output = b"".join(chunks).decode("utf-8", "replace")
    assert process.returncode == 0, output
    drawn = re.findall(r"\n\r\x1b\[2K(\[modelbench\] items [^\x1b]*)\x1b\[1A\x1b\[\d+G", output)
    assert drawn, output
    assert any(" | alpha-qa-seed0 " in line or " | beta-qa-seed0 " in line for line in drawn)
    assert "\n\r\x1b[2K\x1b[1A" in output  # erased before pytest wrote again
    assert all(len(line) <= 200 for line in drawn)


def test_forced_terminal_mode_through_a_pipe_with_workers(project: Project, sim: Any) -> None:
    slow_project(project, sim)
    result = run(project, "-n", "2", "--mb-progress", "tty", "--mb-progress-interval", "0.2")
    result.assert_outcomes(passed=2)
    # (pytester splits lines at "\r" too, so the carriage return is not visible here)
    assert re.search(r"\x1b\[2K\[modelbench\] items \d/2 .*\x1b\[1A", result.stdout.str())


def test_bad_progress_option(project: Project) -> None:
    result = project.pytester.runpytest("--mb-progress", "fancy")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--mb-progress: unknown mode 'fancy'; use one of auto, tty, lines, off"]
    )
    result = project.pytester.runpytest("--mb-progress-interval", "0")
    result.stderr.fnmatch_lines(
        ["*--mb-progress-interval: expected a positive number of seconds, got '0'"]
    )


# --------------------------------------------------------------------------- pure parts


def snap(
    item_id: str,
    total: int,
    done: int,
    *,
    start: int = 0,
    elapsed: float = 10.0,
    finished: bool = False,
    tokens: int = 0,
) -> ItemSnapshot:
    return ItemSnapshot(
        item_id, total, done, start, 0, 0, tokens, 1000.0, 1000.0 + elapsed, finished
    )


def test_session_view_estimates_unstarted_items_from_their_variant() -> None:
    planned = {
        "a-qa-seed0": "qa",
        "b-qa-seed0": "qa",
        "a-math-seed0": "math",
        "b-math-seed0": "math",
    }
    view = session_view(
        [
            snap("a-qa-seed0", 100, 100, finished=True, tokens=500),
            snap("a-math-seed0", 40, 10, start=0, elapsed=5.0, tokens=200),
        ],
        finished={"a-qa-seed0"},
        planned=planned,
        elapsed_s=20.0,
    )
    # b-qa is guessed at 100 (same variant as a-qa), b-math at 40
    assert (view.items_done, view.items_total) == (1, 4)
    assert (view.examples_done, view.examples_total, view.estimated) == (110, 280, True)
    assert view.rate == pytest.approx(2.0) and view.token_rate == pytest.approx(
        40.0
    )  # running item
    assert view.eta_s == pytest.approx(170 / 2.0)
    (running,) = view.running
    assert running.eta_s == pytest.approx(30 / 2.0)


def test_session_view_counts_resumed_examples_as_done_but_not_in_the_rate() -> None:
    view = session_view([snap("x", 100, 90, start=80, elapsed=5.0)], set(), {"x": "qa"}, 5.0)
    assert view.examples_done == 90 and view.rate == pytest.approx(2.0)
    assert view.eta_s == pytest.approx(5.0) and not view.estimated


def test_formatting() -> None:
    assert [format_duration(s) for s in (None, 4.6, 75, 3725)] == ["?", "5s", "1m15s", "1h02m"]
    view = session_view([snap("item-with-a-long-name", 1000, 10, elapsed=1.0)], set(), {}, 1.0)
    line = status_line(view, 60)
    assert len(line) == 60 and line.endswith("...")


def test_progress_files_round_trip(tmp_path: Path) -> None:
    sink = FileProgress(tmp_path / "gw0.json", "gw0", min_interval_s=0.0)
    sink.start("a-qa-seed0", 10, 4)
    for _ in range(3):
        sink.advance(prompt_tokens=7, completion_tokens=5)
    sink.advance(error=True)
    (tmp_path / "gw1.json").write_text("{not json")  # a torn file is skipped
    (item,) = read_progress_dir(tmp_path)
    assert (item.total, item.done, item.done_at_start, item.errors) == (10, 8, 4, 1)
    assert (item.prompt_tokens, item.completion_tokens, item.finished) == (21, 15, False)
    sink.finish()
    (item,) = read_progress_dir(tmp_path)
    assert item.finished and json.loads((tmp_path / "gw0.json").read_text())["worker"] == "gw0"


def _log_lines(live: LiveProgress, read_end: int) -> list[str]:
    os.close(live.fd)
    text = b""
    while chunk := os.read(read_end, 65536):
        text += chunk
    return [line for line in text.decode().splitlines() if line.startswith("[modelbench] items")]


def test_log_lines_back_off_and_skip_ticks_where_nothing_finished() -> None:
    """Issue 43: a 5-minute run wrote 20 progress lines into a CI log."""
    local = RecordingProgress()
    local.start("alpha-qa-seed0", 100, 0)
    read_end, write_end = os.pipe()
    live = LiveProgress("lines", 15.0, write_end, local, None, backoff=True)
    assert list(itertools.islice(live.intervals(), 8)) == [15, 30, 60, 120, 240, 300, 300, 300]
    live.tick()
    live.tick()  # nothing finished since the last line: no new line
    local.advance()
    live.tick()
    live._last_line_at -= 301  # five minutes without a finished example (a server starting)
    live.tick()  # a heartbeat line all the same
    live.tick()  # and then nothing new again
    assert len(_log_lines(live, read_end)) == 3


def test_an_interval_the_user_gives_is_kept() -> None:
    read_end, write_end = os.pipe()
    live = LiveProgress("lines", 0.2, write_end, RecordingProgress(), None)
    assert list(itertools.islice(live.intervals(), 3)) == [0.2, 0.2, 0.2]
    os.close(write_end)
    os.close(read_end)
