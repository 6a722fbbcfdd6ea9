"""The launcher's processes seen from the host: waiting without reaping, killing leftovers
(through :mod:`pytest_modelbench.processes`), reading what they wrote (output tails, the
report socket)."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import time
from pathlib import Path

from pytest_modelbench.processes import kill_marked

TOKEN_VAR = "MODELBENCH_SANDBOX_TOKEN"


def tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of an output file (undecodable bytes replaced)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4 * chars))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def receive_all(sock: socket.socket) -> bytes:
    """What the launcher's processes wrote (all of them have ended)."""
    sock.setblocking(False)
    chunks = []
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more was written
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks)


def wait_unreaped(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for the process to exit without reaping it (its group id stays ours); False on
    timeout. Platforms without ``waitid`` fall back to an ordinary, reaping wait."""
    pid = process.pid
    if not hasattr(os, "waitid"):
        try:
            process.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        pidfd = os.pidfd_open(pid)  # Linux >= 5.3: readable once the process has exited
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            ready, _, _ = select.select([pidfd], [], [], timeout)
            return bool(ready)
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def sweep(token: str) -> None:
    """Kill leftovers that carry this execution's token (when no cgroup or PID namespace)."""
    kill_marked(f"{TOKEN_VAR}={token}".encode())
