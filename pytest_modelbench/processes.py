"""Process groups and the process table: who is in a group, stopping a group, finding the
processes that carry a marker in their environment.

Servers (and their watchdogs) and the sandbox both start children in a new session and stop
them by their group; this module is the one place that signals a group and the one place
that reads the process table (``/proc``). Standard library only: the server watchdog
imports it and must start fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "group_members",
    "kill_group",
    "kill_marked",
    "marked",
    "signal_group",
    "terminate_group",
]

PROC = Path("/proc")


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is gone or not ours."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def kill_group(pgid: int) -> None:
    """SIGKILL the group at once, without waiting (nothing to do when it is gone)."""
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def _pids(proc: Path) -> Iterator[int]:
    """The pids in the process table (a process may end while this is read)."""
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            yield int(entry.name)


def group_members(pgid: int, proc: Path = PROC) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    if not proc.is_dir():  # not Linux: all we can tell is whether the group exists
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            return [pgid]
        return [pgid]
    members = []
    for pid in _pids(proc):
        try:
            stat = (proc / str(pid) / "stat").read_bytes().decode("ascii", errors="replace")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold ')'
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(pid)
    return members


def terminate_group(
    pgid: int,
    grace_s: float = 15.0,
    leader: subprocess.Popen[bytes] | None = None,
    *,
    poll_s: float = 0.05,
) -> None:
    """SIGTERM the process group, wait up to ``grace_s`` for it to empty, then SIGKILL it and
    wait up to 5 s more; ``leader``, our child, is reaped (a group with an unreaped leader
    still exists)."""

    def gone() -> bool:
        if leader is not None and leader.poll() is None:
            return False
        return not group_members(pgid)

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not signal_group(pgid, sig):
            break
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            if gone():
                return
            time.sleep(poll_s)
    if leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (D state)
            leader.wait(timeout=1.0)


def marked(needle: bytes, proc: Path = PROC) -> list[int]:
    """Processes whose environment holds ``needle`` (``NAME=value``); only those this user may
    read are seen."""
    found = []
    for pid in _pids(proc):
        try:
            environ = (proc / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ:
            found.append(pid)
    return found


def kill_marked(needle: bytes, *, tries: int = 20, pause_s: float = 0.02) -> None:
    """SIGKILL every process whose environment holds ``needle``, again until none is left
    (a process may fork while it is killed), at most ``tries`` rounds."""
    for _ in range(tries):
        pids = marked(needle)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(pause_s)
