"""A per-execution cgroup: process-count and memory limits for the program as a whole, and a
kill list.

``RLIMIT_NPROC`` is never enforced for uid 0 and ``RLIMIT_AS`` binds each process alone (a
program of 32 processes could hold 32 times the limit), so when the host may create cgroups
(root in most containers, or a delegated cgroup v2 subtree) each sandboxed execution gets
its own cgroup with ``pids.max`` and a memory limit (cgroup v2 ``memory.max`` with no swap;
v1 ``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` where swap is accounted)
over every process of the sandbox, the files of its tmpfs included. Killing every pid listed
in it also reaches processes that left the process group. Each controller is used where the
host has it (a v1 hierarchy of its own, or the v2 unified one); a host with neither gets
``None`` and the sandbox falls back to rlimits.
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
CONTROLLERS = ("pids", "memory")
_lock = threading.Lock()
_bases: dict[str, Path | None] = {}  # controller -> folder for per-execution cgroups (memo)


def _own_cgroup_dirs(controller: str) -> list[Path]:
    """Candidate folders in which this process may create child cgroups with ``controller``."""
    candidates = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):  # a cgroup v1 hierarchy of its own
            candidates.append(Path("/sys/fs/cgroup") / controller / path.lstrip("/"))
        elif hierarchy == "0" and controllers == "":  # cgroup v2 unified hierarchy
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                candidates.append(mount / path.lstrip("/"))
    return candidates


def _limit_file(controller: str, folder: Path) -> Path:
    if controller == "pids":
        return folder / "pids.max"
    v2 = folder / "memory.max"
    return (
        v2
        if v2.exists() or not (folder / "memory.limit_in_bytes").exists()
        else (folder / "memory.limit_in_bytes")
    )


def _probe(controller: str) -> Path | None:
    for own in _own_cgroup_dirs(controller):
        parent = own / PARENT_NAME
        if not (own / "cgroup.procs").is_file():
            continue  # not a cgroup filesystem (e.g. the tmpfs above v1 hierarchies)
        try:
            parent.mkdir(exist_ok=True)
            subtree = parent / "cgroup.subtree_control"
            if subtree.exists() and controller not in subtree.read_text().split():
                subtree.write_text(f"+{controller}")  # cgroup v2: enabled for our children
            probe = parent / f"probe-{os.getpid()}"
            probe.mkdir(exist_ok=True)
            usable = _limit_file(controller, probe).exists()
            probe.rmdir()
            if usable:
                return parent
        except OSError:
            continue
    return None


def cgroup_base(controller: str = "pids") -> Path | None:
    """The folder under which per-execution cgroups with ``controller`` are made, or None
    (probed once)."""
    with _lock:
        if controller not in _bases:
            _bases[controller] = _probe(controller)
        return _bases[controller]


def _write(path: Path, value: str) -> None:
    path.write_text(value)


@dataclass(frozen=True)
class ProgramCgroup:
    """One execution's cgroups (one folder per hierarchy: one on cgroup v2, one per
    controller on v1): created with the limits, emptied and removed afterwards."""

    paths: tuple[Path, ...]
    controllers: tuple[str, ...]
    """The controllers that bind: ``pids``, ``memory``."""

    @classmethod
    def create(cls, name: str, max_pids: int, memory_bytes: int) -> ProgramCgroup | None:
        """A cgroup with whichever of the limits this host supports, or None (none)."""
        made: dict[Path, list[str]] = {}
        for controller in CONTROLLERS:
            base = cgroup_base(controller)
            if base is None:
                continue
            path = base / name
            try:
                if path not in made:
                    path.mkdir()
                    made[path] = []
                if controller == "pids":
                    _write(path / "pids.max", str(max_pids))
                else:
                    cls._limit_memory(path, memory_bytes)
                made[path].append(controller)
            except OSError:
                continue
        if not any(made.values()):
            for path in made:
                with contextlib.suppress(OSError):
                    path.rmdir()
            return None
        controllers = tuple(c for c in CONTROLLERS if any(c in got for got in made.values()))
        return cls(tuple(made), controllers)

    @staticmethod
    def _limit_memory(path: Path, memory_bytes: int) -> None:
        if (path / "memory.max").exists():  # cgroup v2: no swap either
            _write(path / "memory.max", str(memory_bytes))
            with contextlib.suppress(OSError):
                _write(path / "memory.swap.max", "0")
            return
        _write(path / "memory.limit_in_bytes", str(memory_bytes))
        with contextlib.suppress(OSError):  # present only where swap is accounted
            _write(path / "memory.memsw.limit_in_bytes", str(memory_bytes))

    @property
    def name(self) -> str:
        """The cgroup's name, the same in every hierarchy (the last part of its path in
        ``/proc/PID/cgroup``)."""
        return self.paths[0].name

    @property
    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.paths]

    def pids(self) -> list[int]:
        found: set[int] = set()
        for file in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in Path(file).read_text().split())
        return sorted(found)

    def oom_kills(self) -> int:
        """Processes the kernel killed for the memory limit (``oom_kill`` in v2's
        ``memory.events`` or v1's ``memory.oom_control``; 0 where neither says)."""
        count = 0
        for path in self.paths:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError, ValueError):
                    for line in (path / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            count += int(value)
        return count

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill everything inside (repeatedly: a fork bomb keeps forking) and remove the
        cgroups."""
        deadline = time.monotonic() + timeout
        left = list(self.paths)
        while left and time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                for path in list(left):
                    try:
                        path.rmdir()
                        left.remove(path)
                    except OSError:
                        pass  # exiting processes still count; retry shortly
                if not left:
                    return
            for path in left:
                kill_file = path / "cgroup.kill"  # cgroup v2 kills atomically
                if kill_file.exists():
                    with contextlib.suppress(OSError):
                        kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
