"""Who holds a GPU: the processes NVML lists on it, their user and command, its utilisation.

A busy GPU is reported with its holders ("GPU 3 is busy: 21.2 GiB held by pid 4711 (user
alice, ``python train.py``), 97% utilised"), and memory held at 0% utilisation over a
sustained window is flagged as a likely leftover process, with its pid and command, so that
its owner can end it. modelbench never stops another process.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LEFTOVER_WINDOW_S",
    "GpuProcess",
    "describe_holders",
    "gib",
    "leftover_note",
    "nvml_processes",
    "nvml_utilisation",
    "process_info",
]

LEFTOVER_WINDOW_S = 10.0  # memory held at 0% utilisation this long: likely a leftover
COMMAND_CHARS = 80  # a command line is shown up to this length
PROC = Path("/proc")


@dataclass(frozen=True)
class GpuProcess:
    """One process holding memory on a GPU, as NVML lists it, with what ``/proc`` says of it."""

    pid: int
    used_mib: int | None = None  # None: NVML does not say (some drivers, MIG)
    user: str | None = None  # None: not visible from here (another container, or gone)
    command: str | None = None

    def describe(self, *, memory: bool = False) -> str:
        """``pid 4711 (user alice, `python train.py`)``; ``memory`` adds its own share."""
        parts = []
        if self.user is not None:
            parts.append(f"user {self.user}")
        if self.command is not None:
            parts.append(f"`{self.command}`")
        if not parts:
            parts.append("not visible from here")
        if memory and self.used_mib is not None:
            parts.append(gib(self.used_mib))
        return f"pid {self.pid} ({', '.join(parts)})"


def gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


def process_info(pid: int, used_mib: int | None = None, proc: Path = PROC) -> GpuProcess:
    """The process ``pid`` with its user and command line read from ``/proc`` (None where it
    cannot be read: a process of another PID namespace, or one that ended)."""
    user: str | None = None
    command: str | None = None
    with contextlib.suppress(OSError):
        uid = (proc / str(pid)).stat().st_uid
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    with contextlib.suppress(OSError):
        raw = (proc / str(pid) / "cmdline").read_bytes()
        argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
        if argv:  # the program by its name, as ps -o comm shows it: python train.py
            argv[0] = os.path.basename(argv[0]) or argv[0]
        text = " ".join(argv)
        if text:
            command = text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"
    return GpuProcess(pid, used_mib, user, command)


def nvml_processes(nvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
    """Compute and graphics processes on the device (each pid once); () when NVML cannot say."""
    found: dict[int, int | None] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        call = getattr(nvml, name, None)
        if call is None:
            continue
        try:
            listed = call(handle)
        except nvml.NVMLError:  # not supported on this GPU or driver
            continue
        for entry in listed:
            used = getattr(entry, "usedGpuMemory", None)
            mib = int(used) // 2**20 if isinstance(used, int) else None
            previous = found.get(int(entry.pid))
            found[int(entry.pid)] = mib if previous is None else max(previous, mib or 0)
    own = os.getpid()
    return tuple(process_info(pid, mib) for pid, mib in sorted(found.items()) if pid != own)


def nvml_utilisation(nvml: Any, handle: Any) -> tuple[int | None, float | None]:
    """(the highest GPU utilisation in percent, the seconds it spans): over the samples the
    driver keeps (``nvmlDeviceGetSamples``), else one reading (span None); (None, None)
    when NVML cannot say."""
    samples = getattr(nvml, "nvmlDeviceGetSamples", None)
    kind = getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", 1)
    if samples is not None:
        try:
            _, values = samples(handle, kind, 0)
            readings = [(int(v.timeStamp), _sample_value(v.sampleValue)) for v in values]
        except (nvml.NVMLError, AttributeError, TypeError, ValueError):
            readings = []
        if readings:
            stamps = [t for t, _ in readings]
            span = (max(stamps) - min(stamps)) / 1e6  # microseconds
            return max(v for _, v in readings), span
    rates = getattr(nvml, "nvmlDeviceGetUtilizationRates", None)
    if rates is not None:
        with contextlib.suppress(nvml.NVMLError, AttributeError):
            return int(rates(handle).gpu), None
    return None, None


def _sample_value(value: Any) -> int:
    """NVML's sample value is a union; utilisation samples are unsigned ints."""
    return int(getattr(value, "uiVal", value))


def describe_holders(used_mib: int, processes: tuple[GpuProcess, ...]) -> str:
    """``21.2 GiB held by pid 4711 (user alice, `python train.py`)``."""
    if not processes:
        return f"{gib(used_mib)} in use by processes not listed here (another container?)"
    several = len(processes) > 1
    holders = ", ".join(p.describe(memory=several) for p in processes)
    return f"{gib(used_mib)} held by {holders}"


def leftover_note(
    used_mib: int | None,
    utilisation: int | None,
    window_s: float | None,
    processes: tuple[GpuProcess, ...],
) -> str | None:
    """A note when memory is held at 0% utilisation for at least ``LEFTOVER_WINDOW_S``: likely
    a process left over from an earlier run (a crashed job, a notebook kernel); None otherwise."""
    if not used_mib or utilisation != 0 or window_s is None or window_s < LEFTOVER_WINDOW_S:
        return None
    who = ", ".join(p.describe() for p in processes) or "a process not listed here"
    return (
        f"0% utilised over the last {window_s:.0f} s while holding {gib(used_mib)}: likely a "
        f"leftover process, {who}; modelbench never stops another process, end it if it is "
        "yours (or ask its owner)"
    )
