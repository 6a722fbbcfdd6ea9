"""A per-execution pids cgroup: a process-count limit that also binds root, and a kill list.

``RLIMIT_NPROC`` is never enforced for uid 0, so when the host may create
cgroups (root in most containers, or a delegated cgroup v2 subtree) each
sandboxed execution gets its own ``pids`` cgroup with ``pids.max``. Killing
every pid listed in it also reaches processes that left the process group.
Unsupported hosts get ``None`` and the sandbox falls back to rlimits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PARENT_NAME = "modelbench-sandbox"
_lock = threading.Lock()
_base: list[Path | None] = []  # memo: [] = not probed yet, [None] = unsupported


def _own_cgroup_dirs() -> list[Path]:
    """Candidate folders in which this process may create child cgroups with a pids controller."""
    candidates = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):  # cgroup v1 pids hierarchy
            candidates.append(Path("/sys/fs/cgroup/pids") / path.lstrip("/"))
        elif hierarchy == "0" and controllers == "":  # cgroup v2 unified hierarchy
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                candidates.append(mount / path.lstrip("/"))
    return candidates


def _probe() -> Path | None:
    for own in _own_cgroup_dirs():
        parent = own / PARENT_NAME
        if not (own / "cgroup.procs").is_file():
            continue  # not a cgroup filesystem (e.g. the tmpfs above v1 hierarchies)
        try:
            parent.mkdir(exist_ok=True)
            if not (parent / "pids.max").exists() and (parent / "cgroup.subtree_control").exists():
                # cgroup v2: the pids controller must be enabled for our children
                (parent / "cgroup.subtree_control").write_text("+pids")
            probe = parent / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            usable = (probe / "pids.max").exists()
            probe.rmdir()
            if usable:
                return parent
        except OSError:
            continue
    return None


def cgroup_base() -> Path | None:
    """The folder under which per-execution cgroups are made, or None (probed once)."""
    with _lock:
        if not _base:
            _base.append(_probe())
        return _base[0]


@dataclass(frozen=True)
class PidsCgroup:
    """One execution's cgroup: created with a limit, emptied and removed afterwards."""

    path: Path

    @classmethod
    def create(cls, name: str, max_pids: int) -> PidsCgroup | None:
        base = cgroup_base()
        if base is None:
            return None
        path = base / name
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(max_pids))
        except OSError:
            return None
        return cls(path)

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in Path(self.procs_file).read_text().split()]
        except OSError:
            return []

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill everything inside (repeatedly: a fork bomb keeps forking) and remove the cgroup."""
        deadline = time.monotonic() + timeout
        kill_file = self.path / "cgroup.kill"  # cgroup v2 kills atomically
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    pass  # exiting processes still count; retry shortly
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
