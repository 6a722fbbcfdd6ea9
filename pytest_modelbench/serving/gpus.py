"""Which GPUs this process may use, and host-local claims so that no two workers share one.

Discovery is a chain of small providers, first answer wins: ``--gpus`` → the caller's
``CUDA_VISIBLE_DEVICES`` → the hardware probe (NVML through ``nvidia-ml-py``; ``nvidia-smi``
only when NVML cannot load; or the fake one named by ``MODELBENCH_FAKE_GPUS`` / passed in by
tests) → none. Each returns a list or ``None``
("no opinion"); a malformed environment variable warns and is ignored. Whatever the source,
a GPU outside the caller's ``CUDA_VISIBLE_DEVICES`` is never used, and GPUs whose memory is
already in use by another process are skipped with a warning.

Claims are ``flock`` locks on files in a host-local directory (``$MODELBENCH_GPU_LOCK_DIR``,
default ``$TMPDIR/modelbench-gpu-locks``), so xdist workers and separate pytest sessions on one
node never take the same GPU; the kernel drops a lock when its process dies, even by SIGKILL.
Each host claims its own GPUs: workers on other hosts (xdist ``--tx``) never contend.
GPU ids are physical (as ``nvidia-smi`` numbers them, or ``GPU-<uuid>``) everywhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Protocol

from pytest_modelbench.config.gpulist import GPU_ID, GpuSpecError, parse_gpu_list
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.serving.base import ServingError
from pytest_modelbench.serving.flocks import held, lock_exclusive
from pytest_modelbench.serving.holders import (
    GpuProcess,
    describe_holders,
    leftover_note,
    nvml_processes,
    nvml_utilisation,
)

__all__ = [
    "BUSY_ENV",
    "DEFAULT_BUSY_MIB",
    "FAKE_ENV",
    "LOCK_DIR_ENV",
    "FakeGpuProvider",
    "Gpu",
    "GpuClaim",
    "GpuClaimer",
    "GpuInventory",
    "GpuProvider",
    "GpuSpecError",
    "GpuWarning",
    "LockNote",
    "NoFreeGpuError",
    "NvidiaSmiProvider",
    "auto_num_workers",
    "claim",
    "default_lock_dir",
    "discover_gpus",
    "free_gpu_count",
    "held_by_session",
    "lock_notes",
    "parse_gpu_list",
    "session_gpus",
    "sharing_plan",
    "tensor_parallel_warning",
    "warn_if_tensor_parallel",
]

FAKE_ENV = "MODELBENCH_FAKE_GPUS"  # "0:0,1:0,2:30000" = index:MiB-in-use (tests, dry runs)
BUSY_ENV = "MODELBENCH_GPU_BUSY_MIB"
LOCK_DIR_ENV = "MODELBENCH_GPU_LOCK_DIR"  # must be host-local: GPU ids only mean something per host
DEFAULT_BUSY_MIB = 1024  # an idle GPU shows a few MiB; a loaded model, gigabytes


class GpuWarning(UserWarning):
    """A GPU setting was ignored or a GPU was skipped; the message says which and why."""


class NoFreeGpuError(ServingError):
    """GPUs exist, but not enough of them are free for one server."""

    def __init__(self, message: str, taken: Sequence[str] = (), busy: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.taken = tuple(taken)  # claimed by modelbench processes: given back when they end
        self.busy = tuple(busy)  # memory in use by another program


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


# --------------------------------------------------------------------------- claims


def default_lock_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$MODELBENCH_GPU_LOCK_DIR``, else ``$TMPDIR/modelbench-gpu-locks``.

    Host-local and shared by all users of the node (created sticky and world-writable, like
    /tmp). Never point it at a shared filesystem: GPU 0 of one host is not GPU 0 of another.
    """
    environ = os.environ if environ is None else environ
    override = environ.get(LOCK_DIR_ENV, "").strip()
    if override:
        return Path(override).expanduser()
    return Path(tempfile.gettempdir()) / "modelbench-gpu-locks"


class _GpuLock:
    def __init__(self, path: Path, fd: int, note: str | None = None) -> None:
        self.path = path
        self.fd: int | None = fd
        self.note = note  # what the lock file says while held (None: not ours to write)

    def release(self, given_back: str | None = None) -> None:
        """Unlock; ``given_back`` (a session id) first notes that the session gave the GPU
        back (:func:`session_gpus`)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                if given_back and self.note is not None:
                    with contextlib.suppress(OSError):
                        os.pwrite(fd, f"{self.note} given-back={given_back}\n".encode(), 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def _lock_path(lock_dir: Path, gpu_id: str) -> Path:
    return lock_dir / f"gpu-{re.sub(r'[^0-9A-Za-z._-]', '_', gpu_id)}.lock"


def _ensure_lock_dir(lock_dir: Path) -> None:
    try:
        lock_dir.mkdir(parents=True)
    except FileExistsError:
        return
    with contextlib.suppress(OSError):  # other users' sessions must be able to lock here too
        os.chmod(lock_dir, 0o1777)


def _try_lock(lock_dir: Path, gpu_id: str, session: str | None = None) -> _GpuLock | None:
    path = _lock_path(lock_dir, gpu_id)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        writable = True
    except PermissionError:  # another user's lock file: flock works read-only too
        fd = os.open(path, os.O_RDONLY)
        writable = False
    if not lock_exclusive(fd):
        os.close(fd)
        return None
    if not writable:
        return _GpuLock(path, fd)
    note = (
        f"pid={os.getpid()} host={socket.gethostname()} since={time.strftime('%FT%T')} gpu={gpu_id}"
    )
    if session:
        note += f" session={session}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, (note + "\n").encode(), 0)
    return _GpuLock(path, fd, note)


def _holder(lock_dir: Path, gpu_id: str) -> str:
    try:
        text = _lock_path(lock_dir, gpu_id).read_text().strip()
    except OSError:
        return ""
    return f" ({text})" if text else ""


@dataclass
class GpuClaim:
    """GPUs this process holds until :meth:`release` (or its exit). Empty = serve on CPU."""

    gpus: tuple[str, ...]
    source: str = "none"
    _locks: list[_GpuLock] = field(default_factory=list, repr=False, compare=False)

    @property
    def cpu(self) -> bool:
        return not self.gpus

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.gpus)

    def release(self) -> None:
        locks, self._locks = self._locks, []
        for lock in locks:
            lock.release()

    def give_back(self, session: str) -> None:
        """Release, noting that ``session`` gave these GPUs back: its other workers may start
        replicas on them (:func:`session_gpus`). Only claims a worker held to serve are given
        back, never ones it merely tried or that were busy."""
        locks, self._locks = self._locks, []
        for lock in locks:
            lock.release(given_back=session)

    def __enter__(self) -> GpuClaim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def claim(
    n_per_server: int,
    lock_dir: Path | None = None,
    *,
    option: str | None = None,
    environ: Mapping[str, str] | None = None,
    probe: GpuProvider | None = None,
    busy_mib: int | None = None,
    wait_s: float = 0.0,
    warn_tensor_parallel: bool = True,
    warn_busy: bool = True,
    session: str | None = None,
) -> GpuClaim:
    """Lock ``n_per_server`` free GPUs for this process (``session``: noted in the claim
    file, so the session's other workers know the GPU is theirs to wait for).

    ``warn_tensor_parallel=False``: the caller warns itself (ServerPool, naming the model).
    ``warn_busy=False``: busy GPUs are skipped quietly (replicas look every second).

    Returns an empty (CPU) claim when the host has no GPU at all; raises
    :class:`NoFreeGpuError` when GPUs exist but fewer than ``n_per_server`` are free within
    ``wait_s`` seconds (claimed by another worker/session, or busy).
    """
    if n_per_server < 1:
        raise ValueError(f"serve.gpus must be at least 1 to claim GPUs, got {n_per_server}")
    lock_dir = default_lock_dir(environ) if lock_dir is None else Path(lock_dir)
    busy_mib = busy_threshold(environ) if busy_mib is None else busy_mib
    end = time.monotonic() + wait_s
    warned: set[str] = set()
    while True:
        inventory = discover_gpus(option, environ=environ, probe=probe)
        if not inventory.gpus:
            return GpuClaim((), inventory.source)
        _check_enough(n_per_server, inventory)
        if n_per_server > 1 and warn_tensor_parallel:
            warn_if_tensor_parallel(n_per_server)
        _ensure_lock_dir(lock_dir)
        held: list[tuple[Gpu, _GpuLock]] = []
        taken: list[str] = []
        busy: list[Gpu] = []
        for gpu in inventory.gpus:
            lock = _try_lock(lock_dir, gpu.id, session)
            if lock is None:
                taken.append(gpu.id)
                continue
            if _busy(gpu, busy_mib) or _unknown_usage(gpu, inventory):
                lock.release()
                busy.append(gpu)
                if warn_busy and gpu.id not in warned:
                    warned.add(gpu.id)
                    _warn_busy(gpu, busy_mib)
                continue
            held.append((gpu, lock))
            if len(held) == n_per_server:
                return GpuClaim(
                    tuple(g.id for g, _ in held), inventory.source, [lk for _, lk in held]
                )
        for _, lock in held:
            lock.release()
        if time.monotonic() >= end:
            raise NoFreeGpuError(
                _no_free_message(n_per_server, inventory, taken, busy, lock_dir, busy_mib),
                taken,
                [g.id for g in busy],
            )
        time.sleep(min(2.0, max(0.05, end - time.monotonic())))


def _check_enough(n_per_server: int, inventory: GpuInventory) -> None:
    """More GPUs per server than the node has are never free, however long one waits."""
    if n_per_server > len(inventory.gpus):
        raise ServingError(
            f"serve.gpus is {n_per_server}, but this node has {len(inventory.gpus)} "
            f"GPU(s) ({inventory.source}): set serve.gpus to at most {len(inventory.gpus)}"
        )


def held_by_session(gpus: Sequence[str], session: str, lock_dir: Path | None = None) -> bool:
    """Whether a process of ``session`` holds any of ``gpus`` now (its claim file says so):
    only then is a GPU worth waiting for; another session's run may hold it for hours."""
    notes = lock_notes(lock_dir)
    return any(
        note.held and note.fields.get("session") == session
        for gpu in gpus
        if (note := notes.get(gpu)) is not None
    )


def session_gpus(session: str, lock_dir: Path | None = None) -> tuple[str, ...]:
    """GPUs of this host that a process of ``session`` gave back (:meth:`GpuClaim.give_back`)
    and that nobody holds now: the note stays until another claim rewrites it."""
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    host = socket.gethostname()
    found: list[str] = []
    try:
        paths = sorted(lock_dir.glob("gpu-*.lock"))
    except OSError:
        return ()
    for path in paths:
        try:
            fields = dict(part.split("=", 1) for part in path.read_text().split() if "=" in part)
        except OSError:
            continue
        gpu = fields.get("gpu")
        if fields.get("given-back") != session or fields.get("host") != host or gpu is None:
            continue
        if not held(path):  # held: a process of the session still uses it
            found.append(gpu)
    return tuple(found)


@dataclass(frozen=True)
class LockNote:
    """What a GPU's claim file says: who claimed it last, and whether that claim still holds."""

    gpu: str
    fields: Mapping[str, str]
    held: bool

    def describe(self) -> str:
        who = " ".join(f"{k}={v}" for k, v in self.fields.items() if k in ("pid", "host", "since"))
        return f"claimed by {who}" if self.held else "-"


def lock_notes(lock_dir: Path | None = None) -> dict[str, LockNote]:
    """Every GPU claim file in ``lock_dir`` by GPU id: modelbench's own claims on this node."""
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    notes: dict[str, LockNote] = {}
    try:
        paths = sorted(lock_dir.glob("gpu-*.lock"))
    except OSError:
        return notes
    for path in paths:
        try:
            fields = dict(part.split("=", 1) for part in path.read_text().split() if "=" in part)
        except OSError:
            continue
        gpu = fields.get("gpu") or path.stem.removeprefix("gpu-")
        notes[gpu] = LockNote(gpu, fields, held(path))
    return notes


def _no_free_message(
    n: int,
    inventory: GpuInventory,
    taken: list[str],
    busy: list[Gpu],
    lock_dir: Path,
    busy_mib: int,
) -> str:
    parts = [
        f"need {n} free GPU(s) for one server, found {len(inventory.gpus) - len(taken) - len(busy)}"
    ]
    parts.append(f"candidates {','.join(inventory.ids)} (from {inventory.source})")
    if taken:
        holders = "; ".join(f"{g}{_holder(lock_dir, g)}" for g in taken)
        parts.append(
            f"claimed by other modelbench workers/sessions: {holders} (locks in {lock_dir})"
        )
    if busy:
        parts.append(f"busy (> {busy_mib} MiB in use): {','.join(g.id for g in busy)}")
        parts.extend(f"GPU {g.id}: {g.busy_text()}" for g in busy if g.processes)
    parts.append("use fewer xdist workers (-n), free GPUs, or pick them with --gpus")
    return "; ".join(parts)


def auto_num_workers(
    gpus_per_server: int = 1,
    lock_dir: Path | None = None,
    *,
    option: str | None = None,
    environ: Mapping[str, str] | None = None,
    probe: GpuProvider | None = None,
    busy_mib: int | None = None,
) -> int:
    """Workers for ``-n auto``: one per group of free, unclaimed GPUs; 1 when there are none."""
    if gpus_per_server < 1:
        return 1
    free = free_gpu_count(
        lock_dir, option=option, environ=environ, probe=probe, busy_mib=busy_mib, warn=True
    )
    return max(1, free // gpus_per_server)


def free_gpu_count(
    lock_dir: Path | None = None,
    *,
    option: str | None = None,
    environ: Mapping[str, str] | None = None,
    probe: GpuProvider | None = None,
    busy_mib: int | None = None,
    warn: bool = False,
) -> int:
    """How many candidate GPUs are neither busy nor claimed by a modelbench process now."""
    lock_dir = default_lock_dir(environ) if lock_dir is None else Path(lock_dir)
    busy_mib = busy_threshold(environ) if busy_mib is None else busy_mib
    inventory = discover_gpus(option, environ=environ, probe=probe)
    free = 0
    for gpu in inventory.gpus:
        if _busy(gpu, busy_mib) or _unknown_usage(gpu, inventory):
            if warn:
                _warn_busy(gpu, busy_mib)
            continue
        if lock_dir.is_dir() and held(_lock_path(lock_dir, gpu.id)):
            continue
        free += 1
    return free


def sharing_plan(workers: int, free_gpus: int, gpus_per_server: int = 1) -> str | None:
    """One line for a session with more local workers than free GPU groups, saying what the
    workers without GPUs do; None when every worker can start its own server."""
    servers = free_gpus // max(1, gpus_per_server)
    if workers <= servers or free_gpus == 0:
        return None  # no GPU at all: every worker serves on the CPU (or uses endpoints)
    extra = workers - servers
    per = f" ({gpus_per_server} per server)" if gpus_per_server > 1 else ""
    return (
        f"{workers} workers, {_count(free_gpus, 'free GPU')}{per}: "
        f"{_count(extra, 'worker')} will share servers of their model with the others on "
        "this node, or wait for a GPU the session gives back"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def tensor_parallel_warning(gpus_per_server: int, model: str | None = None) -> str | None:
    """The warning for tensor parallel > 1 (``model`` names the models.yaml entry), or None."""
    if gpus_per_server <= 1:
        return None
    key = f"models.{model}.serve.gpus" if model else "serve.gpus"
    return (
        f"{key}: {gpus_per_server} runs every server with tensor parallel size "
        f"{gpus_per_server}. For a model that fits on one GPU this changes results (a different "
        f"reduction order, so different greedy outputs) and is usually slower than "
        f"{gpus_per_server} servers of 1 GPU each; use serve.gpus: 1 unless the model does not fit"
    )


def warn_if_tensor_parallel(gpus_per_server: int, model: str | None = None) -> None:
    message = tensor_parallel_warning(gpus_per_server, model)
    if message:
        warnings.warn(GpuWarning(message), stacklevel=3)


class GpuClaimer:
    """One worker's GPUs: claimed once for servers of ``n`` GPUs (again when ``n`` changes),
    extra claims of the GPUs its session gave back (replicas), and at the end given back to
    the session (or released, outside a session). The one owner of the worker's claim."""

    def __init__(self, option: str | None = None, session: str | None = None) -> None:
        """``option``: ``--gpus``; ``session``: the pytest session's id (None: no sharing)."""
        self.option = option
        self.session = session
        self.held: GpuClaim | None = None
        self._tp_warned: set[str] = set()
        # told the GPUs this worker gives back to its session (the session's exchange)
        self.on_give_back: Callable[[tuple[str, ...]], None] = lambda _gpus: None

    @property
    def cpu(self) -> bool:
        """Whether the worker holds a claim that serves on the CPU (the host has no GPU)."""
        return self.held is not None and self.held.cpu

    def gpus(self, n: int, model: str) -> tuple[str, ...]:
        """This worker's GPUs for a server of ``n`` GPUs (claimed once, re-claimed when ``n``
        changes); warns once per model when the server would span several. No free GPU:
        :class:`NoFreeGpuError` when workers of this session hold them (share or wait),
        else an :class:`EvaluationError`; a bad ``--gpus`` is a usage error."""
        gpus = self.claimed(n)
        if len(gpus) > 1 and model not in self._tp_warned:
            self._tp_warned.add(model)
            warn_if_tensor_parallel(len(gpus), model)
        return gpus

    def claimed(self, n: int) -> tuple[str, ...]:
        """:meth:`gpus` without the tensor-parallel warning."""
        if self.held is None or len(self.held.gpus) not in (0, n):
            if self.held is not None:
                self.held.release()
                self.held = None
            try:
                self.held = self._claim(n)
            except NoFreeGpuError as exc:
                if self.session is not None and held_by_session(exc.taken, self.session):
                    raise  # workers of this session hold them: share a server, or wait
                raise EvaluationError(str(exc)) from None  # another session's: fail at once
            except ServingError as exc:
                raise EvaluationError(str(exc)) from None
        # an empty claim: the host has no GPU (busy GPUs raise NoFreeGpuError), which the
        # session's header says once (session.core), not a warning per worker
        return tuple(self.held.gpus)

    def reserve(self, n: int) -> None:
        """Claim GPUs for servers of ``n`` GPUs now, before any item runs, so that a worker
        that ends up with nothing to run gives them back to its session (for replicas). A
        claim that fails here is tried again, and reported, by the first item."""
        if self.held is not None:
            return
        with contextlib.suppress(GpuSpecError, ServingError):
            self.held = claim(
                n, option=self.option, warn_tensor_parallel=False, session=self.session
            )

    def try_claim(self, n: int) -> tuple[str, ...]:
        """One quiet attempt (busy GPUs are skipped without a warning) while the worker waits
        for a GPU to come free; :class:`ServingError` when none is."""
        self.held = self._claim(n, warn_busy=False)
        return tuple(self.held.gpus)

    def spare(self, n: int, among: Collection[str] | None = None) -> GpuClaim | None:
        """A claim of ``n`` GPUs this session gave back (for a replica; ``among``: of those
        only), or None."""
        assert self.session is not None
        given_back = session_gpus(self.session)
        if among is not None:
            given_back = tuple(gpu for gpu in given_back if gpu in among)
        if len(given_back) < n:
            return None
        try:
            found = claim(
                n,
                option=",".join(given_back),
                warn_tensor_parallel=False,
                warn_busy=False,
                session=self.session,
            )
        except (GpuSpecError, ServingError):  # taken meanwhile, or busy: look again later
            return None
        return None if found.cpu else found

    def close(self) -> None:
        """Give the worker's GPUs back to its session (for replicas), or release them."""
        held, self.held = self.held, None
        if held is None:
            return
        if self.session is not None:
            held.give_back(self.session)
            if held.gpus and not held.cpu:
                self.on_give_back(tuple(held.gpus))
        else:
            held.release()

    def _claim(self, n: int, *, warn_busy: bool = True) -> GpuClaim:
        try:
            return claim(
                n,
                option=self.option,
                warn_tensor_parallel=False,
                warn_busy=warn_busy,
                session=self.session,
            )
        except GpuSpecError as exc:
            raise ModelbenchUsageError(str(exc)) from None  # names --gpus and the value
