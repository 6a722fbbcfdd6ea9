"""``flock`` probes for the GPU claim files (``gpu_claims.py``): the locks that coordinate
independent pytest sessions and users on a host, which the kernel drops when a process dies."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

LOCK_TRIES = 3  # a probe (held) holds a lock for microseconds: try again that soon
LOCK_RETRY_S = 0.005

__all__ = ["held", "lock_exclusive"]


def held(path: Path) -> bool:
    """Whether some process holds the ``flock`` lock at ``path`` (False when it is missing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def lock_exclusive(fd: int) -> bool:
    """Take an exclusive ``flock`` on ``fd`` without waiting, trying ``LOCK_TRIES`` times
    (a concurrent :func:`held` probe is not a holder); False when someone holds it."""
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < LOCK_TRIES:
                time.sleep(LOCK_RETRY_S)
    return False
