"""The one process-group helper, on real processes: members, SIGTERM then SIGKILL, leftovers
found by the marker in their environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from pytest_modelbench import processes

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc")


def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def _group(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, env=env, stdout=subprocess.PIPE
    )


CHILD_AND_GRANDCHILD = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('up', flush=True); time.sleep(60)\n"
)


def test_members_of_a_group_and_terminate_empties_it() -> None:
    leader = _group(CHILD_AND_GRANDCHILD)
    try:
        assert leader.stdout is not None and leader.stdout.readline() == b"up\n"
        _wait_for(lambda: len(processes.group_members(leader.pid)) == 2)
        assert leader.pid in processes.group_members(leader.pid)
        assert os.getpid() not in processes.group_members(leader.pid)
        processes.terminate_group(leader.pid, grace_s=5.0, leader=leader)
        assert leader.returncode == -signal.SIGTERM
        assert processes.group_members(leader.pid) == []
    finally:
        processes.kill_group(leader.pid)
        leader.wait()


def test_terminate_kills_a_group_that_ignores_sigterm() -> None:
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    leader = _group(code)
    try:
        assert leader.stdout is not None and leader.stdout.readline() == b"up\n"
        processes.terminate_group(leader.pid, grace_s=0.3, leader=leader)
        assert leader.returncode == -signal.SIGKILL
    finally:
        processes.kill_group(leader.pid)
        leader.wait()


def test_a_zombie_leader_is_not_a_member() -> None:
    leader = _group("pass")
    try:
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        assert processes.group_members(leader.pid) == []
        assert processes.signal_group(leader.pid, 0) is True  # the unreaped leader holds it
    finally:
        leader.wait()
    assert processes.signal_group(leader.pid, 0) is False  # reaped: the group is gone


def test_kill_marked_kills_every_process_with_the_marker_and_no_other() -> None:
    token = uuid.uuid4().hex
    marked_env = {**os.environ, "MODELBENCH_TEST_MARK": token}
    other_env = {**os.environ, "MODELBENCH_TEST_MARK": "other"}
    sleeper = "print('up', flush=True)\nimport time; time.sleep(60)"
    procs = [_group(sleeper, marked_env), _group(sleeper, marked_env), _group(sleeper, other_env)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        needle = f"MODELBENCH_TEST_MARK={token}".encode()
        assert sorted(processes.marked(needle)) == sorted(p.pid for p in procs[:2])
        processes.kill_marked(needle)
        assert [p.wait(timeout=10) for p in procs[:2]] == [-signal.SIGKILL] * 2
        assert procs[2].poll() is None
    finally:
        for proc in procs:
            processes.kill_group(proc.pid)
            proc.wait()
