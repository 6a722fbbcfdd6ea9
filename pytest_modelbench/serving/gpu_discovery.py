"""Which GPUs this process may use: a chain of small providers, first answer wins.

``--gpus`` → the caller's ``CUDA_VISIBLE_DEVICES`` → the hardware probe (NVML through
``nvidia-ml-py``; ``nvidia-smi`` only when NVML cannot load; or the fake one named by
``MODELBENCH_FAKE_GPUS`` / passed in by tests) → none. Each returns a list or ``None``
("no opinion"); a malformed environment variable warns and is ignored. Whatever the source,
a GPU outside the caller's ``CUDA_VISIBLE_DEVICES`` is never used, and GPUs whose memory is
already in use by another process are skipped with a warning (the busy threshold below).
GPU ids are physical (as ``nvidia-smi`` numbers them, or ``GPU-<uuid>``) everywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from pytest_modelbench.config.gpulist import GPU_ID, GpuSpecError, parse_gpu_list
from pytest_modelbench.serving.base import ServingError
from pytest_modelbench.serving.holders import (
    GpuProcess,
    describe_holders,
    leftover_note,
    nvml_processes,
    nvml_utilisation,
)

FAKE_ENV = "MODELBENCH_FAKE_GPUS"  # "0:0,1:0,2:30000" = index:MiB-in-use (tests, dry runs)
BUSY_ENV = "MODELBENCH_GPU_BUSY_MIB"
DEFAULT_BUSY_MIB = 1024  # an idle GPU shows a few MiB; a loaded model, gigabytes


class GpuWarning(UserWarning):
    """A GPU setting was ignored or a GPU was skipped; the message says which and why."""


class GpuDiscoveryError(ServingError):
    """The node has GPUs whose report modelbench cannot read: an error, never a silent CPU run."""


@dataclass(frozen=True)
class Gpu:
    """One physical GPU: its id as ``CUDA_VISIBLE_DEVICES`` takes it, and memory in use."""

    id: str
    memory_used_mib: int | None = None  # None: unknown (treated as free)
    uuid: str | None = None
    memory_total_mib: int | None = None
    utilisation: int | None = None  # percent: the highest over utilisation_window_s (NVML)
    utilisation_window_s: float | None = None  # the span of NVML's samples (None: one reading)
    processes: tuple[GpuProcess, ...] = ()  # who holds memory on it (NVML's process list)

    def busy_text(self) -> str:
        """``21.2 GiB held by pid 4711 (user alice, `python train.py`), 97% utilised``, or
        the memory alone where the source lists no processes (nvidia-smi, fakes)."""
        if self.memory_used_mib is None:
            return "memory in use unknown"
        if not self.processes and self.utilisation is None:
            return f"{self.memory_used_mib} MiB in use by another process"
        text = describe_holders(self.memory_used_mib, self.processes)
        if self.utilisation is not None:
            text += f", {self.utilisation}% utilised"
        return text

    def leftover(self) -> str | None:
        """A note when the memory it holds looks left over (0% utilised for a while)."""
        return leftover_note(
            self.memory_used_mib, self.utilisation, self.utilisation_window_s, self.processes
        )

    def matches(self, other_id: str) -> bool:
        return other_id in (self.id, self.uuid)


class GpuProvider(Protocol):
    """One link of the discovery chain: the GPUs it knows of, or ``None`` for "no opinion"."""

    name: str

    def gpus(self) -> list[Gpu] | None: ...


@dataclass
class OptionProvider:
    """``--gpus 0,1,3``: an explicit choice. Malformed → :class:`GpuSpecError` (a usage error)."""

    value: str | None
    name: str = "--gpus"

    def gpus(self) -> list[Gpu] | None:
        if self.value is None:
            return None
        return [Gpu(i) for i in parse_gpu_list(self.value, "--gpus")]


@dataclass
class VisibleDevicesProvider:
    """The caller's ``CUDA_VISIBLE_DEVICES``: both a source and an upper bound."""

    environ: Mapping[str, str]
    name: str = "CUDA_VISIBLE_DEVICES"
    _parsed: tuple[list[Gpu] | None] | None = field(default=None, repr=False)

    def gpus(self) -> list[Gpu] | None:
        if self._parsed is None:  # parse (and warn) once, however often asked
            self._parsed = (self._parse(),)
        found = self._parsed[0]
        return None if found is None else list(found)

    def _parse(self) -> list[Gpu] | None:
        value = self.environ.get("CUDA_VISIBLE_DEVICES")
        if value is None:
            return None
        try:
            return [Gpu(i) for i in parse_gpu_list(value, "CUDA_VISIBLE_DEVICES")]
        except GpuSpecError as exc:
            warnings.warn(GpuWarning(f"{exc}; ignoring CUDA_VISIBLE_DEVICES"), stacklevel=4)
            return None


@dataclass
class FakeGpuProvider:
    """A pretend machine for tests: ``FakeGpuProvider.from_spec("0:0,1:0,2:30000")``."""

    fake: Sequence[Gpu]
    name: str = "fake"

    @classmethod
    def from_spec(cls, spec: str) -> FakeGpuProvider:
        """``index[:MiB-in-use]`` items, comma-separated; ValueError when malformed."""
        gpus = []
        for item in (t.strip() for t in spec.split(",") if t.strip()):
            index, _, used = item.partition(":")
            if not GPU_ID.match(index) or (used and not used.isdigit()):
                raise ValueError(
                    f"{FAKE_ENV}={spec!r}: bad item {item!r} (want index:MiB, e.g. 0:0)"
                )
            gpus.append(Gpu(index, int(used) if used else 0))
        return cls(gpus)

    def gpus(self) -> list[Gpu] | None:
        return list(self.fake)


@dataclass
class NvidiaSmiProvider:
    """``nvidia-smi --query-gpu=index,uuid,memory.used``; ``None`` without an NVIDIA driver."""

    executable: str = "nvidia-smi"
    timeout_s: float = 20.0
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run
    name: str = "nvidia-smi"

    def gpus(self) -> list[Gpu] | None:
        exe = shutil.which(self.executable)
        if exe is None:
            return None
        cmd = [exe, "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"]
        try:
            proc = self.run(
                cmd, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            warnings.warn(GpuWarning(f"nvidia-smi failed ({exc}); assuming no GPUs"), stacklevel=2)
            return None
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
            warnings.warn(
                GpuWarning(
                    f"nvidia-smi exited with {proc.returncode} ({why[0]}); assuming no GPUs"
                ),
                stacklevel=2,
            )
            return None
        return self.parse(proc.stdout)

    @staticmethod
    def parse(text: str) -> list[Gpu]:
        """``index, uuid, memory.used`` rows; a memory that is not a number (``[N/A]`` on MIG
        GPUs, ``[Unknown Error]``) is unknown, not zero. Other lines (driver notices) warn and
        are skipped; output without one readable row is a :class:`GpuDiscoveryError`."""
        gpus: list[Gpu] = []
        odd: list[str] = []
        for line in text.splitlines():
            if not line.strip():
                continue
            row = _SMI_ROW.match(line)
            if row is None:
                odd.append(line.strip())
                continue
            index, uuid, used = row.groups()
            gpus.append(Gpu(index, int(used) if used.isdigit() else None, uuid or None))
        if odd and not gpus:
            raise GpuDiscoveryError(
                f"nvidia-smi: cannot read its output line {odd[0]!r} (expected 'index, uuid, "
                "memory.used'); choose GPUs with --gpus 0,1 (or CUDA_VISIBLE_DEVICES), or "
                "serve on the CPU with --gpus none"
            )
        for line in odd:
            warnings.warn(GpuWarning(f"nvidia-smi line {line!r} ignored"), stacklevel=2)
        return gpus


_SMI_ROW = re.compile(r"^\s*(\d+)\s*,\s*([^,]*?)\s*,\s*([^,]*?)\s*$")


@dataclass
class NvmlProvider:
    """NVIDIA's own bindings (``nvidia-ml-py``, optional): ``None`` without them or a driver, so
    the chain goes on to ``nvidia-smi``. A MIG-enabled GPU's memory is unknown (its instances
    are the devices; name them with ``--gpus MIG-<uuid>``)."""

    name: str = "NVML"

    def gpus(self) -> list[Gpu] | None:
        try:
            # lazily: an optional package, loaded only when a worker claims GPUs
            import pynvml  # type: ignore[import-not-found,unused-ignore]  # optional: no stubs
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:  # no driver, or no library: nvidia-smi says why
            return None
        try:
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                used: int | None = memory.used // 2**20
                total = getattr(memory, "total", None)
                try:
                    if pynvml.nvmlDeviceGetMigMode(handle)[0]:
                        used = None
                except pynvml.NVMLError:  # not a MIG-capable GPU
                    pass
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                utilisation, window_s = nvml_utilisation(pynvml, handle)
                gpus.append(
                    Gpu(
                        str(i),
                        used,
                        uuid if isinstance(uuid, str) else uuid.decode(),
                        memory_total_mib=total // 2**20 if isinstance(total, int) else None,
                        utilisation=utilisation,
                        utilisation_window_s=window_s,
                        processes=nvml_processes(pynvml, handle),
                    )
                )
            return gpus
        except pynvml.NVMLError as exc:
            raise GpuDiscoveryError(
                f"NVML: cannot read the node's GPUs ({exc}); choose GPUs with --gpus 0,1, or "
                "serve on the CPU with --gpus none"
            ) from None
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()


@dataclass
class _HardwareProbe:
    """NVML where ``nvidia-ml-py`` and a driver are there, else ``nvidia-smi``."""

    name: str = "nvidia-smi"

    def gpus(self) -> list[Gpu] | None:
        for provider in (NvmlProvider(), NvidiaSmiProvider()):
            found = provider.gpus()
            if found is not None:
                self.name = provider.name
                return found
        return None


@dataclass
class NoGpuProvider:
    """The end of the chain: no GPU, serve on the CPU (or use endpoints only)."""

    name: str = "none"

    def gpus(self) -> list[Gpu] | None:
        return []


def hardware_provider(environ: Mapping[str, str]) -> GpuProvider | None:
    """The fake provider when ``MODELBENCH_FAKE_GPUS`` is set (and valid), else None."""
    spec = environ.get(FAKE_ENV)
    if spec is None:
        return None
    try:
        return FakeGpuProvider.from_spec(spec)
    except ValueError as exc:
        warnings.warn(GpuWarning(f"{exc}; ignored"), stacklevel=2)
        return None


@dataclass(frozen=True)
class GpuInventory:
    """The candidate GPUs (inside the caller's CUDA_VISIBLE_DEVICES) and who named them."""

    gpus: tuple[Gpu, ...]
    source: str

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(g.id for g in self.gpus)


def discover_gpus(
    option: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    probe: GpuProvider | None = None,
) -> GpuInventory:
    """Walk the provider chain; restrict to the caller's CUDA_VISIBLE_DEVICES; add memory use."""
    environ = os.environ if environ is None else environ
    probe = probe or hardware_provider(environ) or _HardwareProbe()
    visible = VisibleDevicesProvider(environ)
    chain: list[GpuProvider] = [OptionProvider(option), visible, probe, NoGpuProvider()]
    found: list[Gpu] = []
    source = "none"
    probed: list[Gpu] | None = None
    for provider in chain:
        got = provider.gpus()
        if got is not None:
            found, source = got, provider.name
            if provider is probe:
                probed = got
            break
    allowed = visible.gpus() if source != visible.name else None
    if allowed is not None:
        outside = [g.id for g in found if not _within(g, allowed)]
        if outside:
            warnings.warn(
                GpuWarning(
                    f"GPU(s) {','.join(outside)} from {source} are outside the caller's "
                    f"CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', '')}; not used"
                ),
                stacklevel=2,
            )
        found = [g for g in found if g.id not in outside]
    if found and probed is None and any(g.memory_used_mib is None for g in found):
        probed = probe.gpus() or []
        found = [_with_usage(g, probed) for g in found]
    return GpuInventory(tuple(found), source)


def _within(gpu: Gpu, allowed: Sequence[Gpu]) -> bool:
    return any(a.matches(gpu.id) or gpu.matches(a.id) for a in allowed)


def _with_usage(gpu: Gpu, probed: Sequence[Gpu]) -> Gpu:
    for known in probed:
        if known.matches(gpu.id):  # its memory, holders and utilisation, under the id as named
            return replace(known, id=gpu.id)
    return gpu


def busy_threshold(environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    value = environ.get(BUSY_ENV)
    if value is None:
        return DEFAULT_BUSY_MIB
    if value.strip().isdigit():
        return int(value)
    warnings.warn(
        GpuWarning(f"{BUSY_ENV}={value!r} is not a whole number of MiB; using {DEFAULT_BUSY_MIB}"),
        stacklevel=2,
    )
    return DEFAULT_BUSY_MIB


def _busy(gpu: Gpu, busy_mib: int) -> bool:
    return gpu.memory_used_mib is not None and gpu.memory_used_mib > busy_mib


def _unknown_usage(gpu: Gpu, inventory: GpuInventory) -> bool:
    """A GPU the hardware probe found but whose memory in use it could not read (``[N/A]`` on
    a MIG GPU) is not known to be free; one the user named (``--gpus``) is used as named."""
    return gpu.memory_used_mib is None and inventory.source in ("nvidia-smi", "NVML")


def _warn_busy(gpu: Gpu, busy_mib: int) -> None:
    if gpu.memory_used_mib is None:
        warnings.warn(
            GpuWarning(
                f"GPU {gpu.id} does not report its memory in use (MIG mode?), so modelbench "
                f"cannot tell whether it is free; skipped. Name it (--gpus {gpu.id}) or its MIG "
                "instances (--gpus MIG-<uuid>, see nvidia-smi -L) to use it"
            ),
            stacklevel=3,
        )
        return
    leftover = gpu.leftover()
    warnings.warn(
        GpuWarning(
            f"GPU {gpu.id} is busy: {gpu.busy_text()} (threshold {busy_mib} MiB, {BUSY_ENV}); "
            f"skipped. {leftover + '. ' if leftover else ''}Free it, or choose GPUs with --gpus"
        ),
        stacklevel=3,
    )
