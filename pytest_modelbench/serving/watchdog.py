"""Kill a server's process group when the process that started it is gone.

    python -m pytest_modelbench.serving.watchdog PARENT_PID PGID [--interval S] [--grace S]

Started next to every server (in its own session, so Ctrl-C aimed at pytest does not reach
it). It polls twice a second: when the server group has ended it exits; when the parent
(pytest or an xdist worker) has died, even by SIGKILL, it sends SIGTERM to the group, waits
``--grace`` seconds, then SIGKILL. SIGTERM to the watchdog itself means "stand down".
It imports only the standard library and :mod:`pytest_modelbench.processes`, so it starts
fast.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from pytest_modelbench.processes import group_members, terminate_group


class _StandDown(Exception):
    pass


def _stand_down(_signum: int, _frame: FrameType | None) -> None:
    raise _StandDown


def parent_alive(parent_pid: int, direct_child: bool) -> bool:
    """Is the parent still there? As its child, a changed ppid is proof (no pid-reuse trap)."""
    if direct_child:
        return os.getppid() == parent_pid
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(parent_pid: int, pgid: int, interval_s: float = 0.5, grace_s: float = 15.0) -> str:
    """Block until the group ends (``"group-ended"``) or the parent dies (``"killed"``)."""
    direct_child = os.getppid() == parent_pid
    while True:
        if not group_members(pgid):
            return "group-ended"
        if not parent_alive(parent_pid, direct_child):
            terminate_group(pgid, grace_s, poll_s=0.1)
            return "killed"
        time.sleep(interval_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_modelbench.serving.watchdog")
    parser.add_argument("parent_pid", type=int)
    parser.add_argument("pgid", type=int)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--grace", type=float, default=15.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stand_down)
    try:
        outcome = watch(args.parent_pid, args.pgid, args.interval, args.grace)
    except _StandDown:
        return 0
    if outcome == "killed":
        print(
            f"[modelbench watchdog] parent {args.parent_pid} is gone: "
            f"killed server process group {args.pgid}",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
