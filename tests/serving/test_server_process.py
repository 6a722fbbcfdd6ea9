"""Server lifecycle with a fake vLLM: health wait, failures with the log tail, restart, stop,
and the watchdog that kills the server group when its parent is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_modelbench.processes import group_members
from pytest_modelbench.serving import ServerStartError, VllmServer
from pytest_modelbench.serving.process import ServerProcess, death_cause
from pytest_modelbench.serving.vllm import VLLM_ENTRYPOINT
from tests.serving.conftest import pid_alive, requires_proc

pytestmark = requires_proc


def _server(fake: Path, tmp_path: Path, mode: str, name: str = "tiny", **extra: str) -> VllmServer:
    return VllmServer(
        "org/model",
        name,
        {"max_model_len": 256},
        ["3"],
        tmp_path / "logs" / "server.log",
        tmp_path / "cache",
        python=str(fake),
        env={"FAKE_VLLM_MODE": mode, **extra},
        stop_grace_s=3,
        check_installed=False,
    )


def _wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        alive = [p for p in pids if pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if pid_alive(p)]


def test_start_serve_restart_stop(fake_vllm_python: Path, tmp_path: Path) -> None:
    server = _server(fake_vllm_python, tmp_path, "serve")
    server.start(30)
    try:
        assert server.is_alive() and server.is_healthy()
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        pgid = server.process.pgid
        assert pgid is not None
        members = group_members(pgid)
        assert len(members) >= 2  # the server and its `sleep` grandchild
        log = server.log_path.read_text()
        assert "fake vllm CUDA_VISIBLE_DEVICES='3'" in log
        assert f"-m {VLLM_ENTRYPOINT} --model org/model --served-model-name tiny" in log
        assert "[modelbench" in log and "ready at http://127.0.0.1:" in log
        watchdog = server.process.watchdog_pid
        assert watchdog is not None and pid_alive(watchdog)

        url = server.base_url
        server.restart()
        assert server.base_url == url  # same port when it is free again
        assert server.is_healthy()
        assert _wait_gone(members, 10) == []  # the old group is gone entirely
        assert _wait_gone([watchdog], 10) == []
    finally:
        pgid = server.process.pgid
        watchdog = server.process.watchdog_pid
        members = group_members(pgid) if pgid else []
        server.stop()
    assert not server.is_alive()
    assert members and _wait_gone(members, 5) == []
    assert watchdog is not None and _wait_gone([watchdog], 5) == []
    server.stop()  # idempotent
    assert "stopped (exit code" in server.log_path.read_text()


def test_health_timeout_reports_command_and_log_tail(
    fake_vllm_python: Path, tmp_path: Path
) -> None:
    server = _server(fake_vllm_python, tmp_path, "hang")
    started = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        server.start(3)
    assert time.monotonic() - started < 20
    message = str(info.value)
    assert "vLLM server for 'tiny' on GPU 3 was not healthy after 3 s; stopped it." in message
    assert " CUDA_VISIBLE_DEVICES=3 " in message.splitlines()[1]
    assert f"-m {VLLM_ENTRYPOINT} --model org/model" in message
    assert f"log: {server.log_path} (this start, last 40 lines):" in message
    assert "log line 59" in message and "log line 30" in message
    assert "log line 05" not in message  # only the tail
    assert not server.is_alive()


def test_crash_while_starting_fails_fast(fake_vllm_python: Path, tmp_path: Path) -> None:
    server = _server(fake_vllm_python, tmp_path, "crash")
    started = time.monotonic()
    with pytest.raises(ServerStartError, match=r"exited with code 3 while starting") as info:
        server.start(120)
    assert time.monotonic() - started < 20
    assert "head_dim 16 is not supported" in str(info.value)


def test_lost_port_race_is_retried(fake_vllm_python: Path, tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    with _server(fake_vllm_python, tmp_path, "port-race", FAKE_VLLM_COUNTER=str(counter)) as server:
        assert server.is_healthy()
    assert counter.read_text() == "2"


def test_foreign_server_on_port_is_not_ours(fake_vllm_python: Path, tmp_path: Path) -> None:
    """/health from someone else's server must not count: the served name has to match."""
    other = _server(fake_vllm_python, tmp_path / "other", "serve", name="someone-else")
    other.start(30)
    try:
        assert other.process.port is not None
        mine = _server(fake_vllm_python, tmp_path, "hang")
        with pytest.raises(ServerStartError, match="was not healthy"):
            mine.process.start(2, port=other.process.port)
    finally:
        other.stop()


PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pytest_modelbench.serving.process import ServerProcess
    server = ServerProcess(
        lambda port: ["sh", "-c", sys.argv[2]],
        env={"PATH": "/usr/bin:/bin"},
        log_path=Path(sys.argv[1]),
        ready=lambda url: True,
        stop_grace_s=float(sys.argv[3]),
    )
    server.start(5)
    print(server.pgid, server.watchdog_pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize(
    ("script", "grace"),
    [
        ("sleep 600 & sleep 600 & wait", "10"),
        # ignores SIGTERM (inherited by the sleeps): the watchdog must escalate to SIGKILL
        ("trap '' TERM; sleep 600 & sleep 600 & wait", "1"),
    ],
    ids=["sigterm", "needs-sigkill"],
)
def test_watchdog_kills_group_when_parent_is_sigkilled(
    tmp_path: Path, script: str, grace: str
) -> None:
    log = tmp_path / "server.log"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(log), script, grace],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    pgid_text, dog_text = parent.stdout.readline().split()
    pgid, dog = int(pgid_text), int(dog_text)
    time.sleep(0.5)
    members = group_members(pgid)
    assert len(members) >= 3  # sh + 2 sleeps
    assert pid_alive(dog)

    os.kill(parent.pid, signal.SIGKILL)  # no finalizers, no atexit: only the watchdog can help
    parent.wait()
    assert _wait_gone(members, 30) == [], f"orphans left: {members}"
    assert _wait_gone([dog], 10) == []
    assert f"parent {parent.pid} is gone: killed server process group {pgid}" in log.read_text()


def test_watchdog_stands_down_when_server_stops(tmp_path: Path) -> None:
    server = ServerProcess(
        lambda _port: ["sleep", "600"],
        env={"PATH": "/usr/bin:/bin"},
        log_path=tmp_path / "log",
        ready=lambda _url: True,
    )
    server.start(5)
    dog = server.watchdog_pid
    pgid = server.pgid
    assert dog is not None and pgid is not None
    os.killpg(pgid, signal.SIGKILL)  # the server dies on its own
    assert _wait_gone([dog], 10) == []  # the watchdog notices and exits
    assert not server.is_alive()
    server.stop()


@pytest.mark.parametrize(
    ("present", "why"),
    [
        (False, "could not start: '{}' not found (No such file or directory)"),
        (True, "could not start: cannot run '{}' (Permission denied)"),  # not chmod +x
    ],
    ids=["missing", "not-executable"],
)
def test_a_program_that_cannot_run_is_a_start_error_not_an_os_error(
    tmp_path: Path, present: bool, why: str
) -> None:
    """Popen's FileNotFoundError / PermissionError would read as a run-directory failure."""
    program = tmp_path / "server"
    if present:
        program.write_text("#!/bin/sh\n")
    process = ServerProcess(
        lambda port: [str(program), str(port)], env={}, log_path=tmp_path / "s.log", label="srv"
    )
    with pytest.raises(ServerStartError) as caught:
        process.start(5.0)
    assert f"srv {why.format(program)}" in str(caught.value)
    assert not process.is_alive()


def test_a_probe_that_refuses_a_live_server_leaves_no_server_and_no_retry(tmp_path: Path) -> None:
    """The probe raises while the server lives (a wrong health path): the server is stopped
    before anything else, and an earlier session's "Address already in use" in the same log
    is not taken for this start's lost port (a retry that would orphan the first server)."""
    log = tmp_path / "s.log"
    log.write_text("OSError: [Errno 98] Address already in use\n")  # an earlier session's
    pids: list[int] = []

    def refuse(_url: str) -> bool:
        pids.append(process.pid or 0)
        raise ServerStartError("serve.health '/helth' answers 404")

    process = ServerProcess(
        lambda _port: ["sleep", "600"], env={"PATH": "/usr/bin:/bin"}, log_path=log, ready=refuse
    )
    with pytest.raises(ServerStartError, match="answers 404"):
        process.start(5.0)
    assert len(set(pids)) == 1  # one start: no retry on another port
    assert _wait_gone(pids[:1], 10) == []  # and it was stopped
    assert log.read_text().count(": starting: ") == 1


def test_a_slow_start_names_no_cause_from_a_live_servers_log(tmp_path: Path) -> None:
    """A server still alive at its deadline: an exception it logged and recovered from is not
    given as the cause, nor is a compiler's ``cc1: error:`` line (no argparse usage before)."""
    script = "echo 'OSError: hub offline, using the cache'; echo 'cc1: error: bad flag'; sleep 600"
    process = ServerProcess(
        lambda _port: ["sh", "-c", script],
        env={"PATH": "/usr/bin:/bin"},
        log_path=tmp_path / "s.log",
        ready=lambda _url: False,
        label="srv",
    )
    with pytest.raises(ServerStartError) as caught:
        process.start(1.0)
    assert str(caught.value).startswith("srv was not healthy after 1 s; stopped it.\n")
    assert death_cause("cc1: error: bad flag\n") is None
    assert death_cause("usage: srv [--port P]\nsrv: error: unrecognized arguments: --x\n") == (
        "error: unrecognized arguments: --x"
    )
