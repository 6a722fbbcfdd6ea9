"""``kill -9`` of the xdist controller (issue 43): its workers notice and stop their item within
seconds, settling it as interrupted, instead of evaluating on until execnet's ``os._exit``
(15 s later, the item left "running") or, for a worker that ignores SIGINT, longer. The run is
started as a script's background job starts it: with SIGINT ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from pytest_modelbench.testing.fixtures import SimServerFactory
from tests.conftest import Project, configure
from tests.resume.conftest import argv_for, clean_env, kill_group


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _journal_rows(root: Path) -> int:
    return sum(len(p.read_bytes().splitlines()) for p in root.glob("runs/r1/*/results.jsonl"))


def test_workers_stop_their_item_when_the_controller_is_killed(
    project: Project, sim: SimServerFactory
) -> None:
    server = sim(accuracy=1.0, lookup={}, latency=0.25, slots=1)
    configure(project, server.base_url, n=400, max_concurrent=1)  # 100 s of requests
    log = project.root / "pytest.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(  # a script's background job: SIGINT ignored
            argv_for("benchmarks/", "--model", "alpha", "--run-id", "r1", "-n", "2"),
            cwd=project.root,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_ignore_sigint,
        )
    try:
        deadline = time.monotonic() + 60
        while _journal_rows(project.root) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _journal_rows(project.root) >= 3, log.read_text()
        found = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
        )
        workers = [int(pid) for pid in found.stdout.split()]
        assert len(workers) == 2, found
        os.kill(proc.pid, signal.SIGKILL)  # the controller alone
        proc.wait()
        killed = time.monotonic()
        while any(map(_alive, workers)) and time.monotonic() - killed < 60:
            time.sleep(0.1)
        gone_after = time.monotonic() - killed
        assert not any(map(_alive, workers))
        items = json.loads((project.root / "runs" / "r1" / "run_manifest.json").read_text())
        # settled by the worker itself; execnet's os._exit (after 15 s) would leave "running"
        assert [entry["status"] for entry in items["items"].values()] == ["interrupted"], (
            gone_after,
            log.read_text(),
        )
        assert _journal_rows(project.root) < 400
    finally:
        kill_group(proc)
