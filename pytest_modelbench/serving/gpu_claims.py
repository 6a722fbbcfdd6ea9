"""Host-local GPU claims, so that no two workers share a GPU.

Claims are ``flock`` locks on files in a host-local directory (``$MODELBENCH_GPU_LOCK_DIR``,
default ``$TMPDIR/modelbench-gpu-locks``), so xdist workers and separate pytest sessions on one
node never take the same GPU; the kernel drops a lock when its process dies, even by SIGKILL.
Each host claims its own GPUs: workers on other hosts (xdist ``--tx``) never contend. The GPUs
come from discovery (``serving/gpu_discovery.py``); a claim of more than one GPU per server warns
about tensor parallelism.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from pytest_modelbench.serving.base import ServingError
from pytest_modelbench.serving.flocks import held, lock_exclusive
from pytest_modelbench.serving.gpu_discovery import (
    Gpu,
    GpuInventory,
    GpuProvider,
    GpuWarning,
    _busy,
    _unknown_usage,
    _warn_busy,
    busy_threshold,
    discover_gpus,
)

LOCK_DIR_ENV = "MODELBENCH_GPU_LOCK_DIR"  # must be host-local: GPU ids only mean something per host


class NoFreeGpuError(ServingError):
    """GPUs exist, but not enough of them are free for one server."""

    def __init__(self, message: str, taken: Sequence[str] = (), busy: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.taken = tuple(taken)  # claimed by modelbench processes: given back when they end
        self.busy = tuple(busy)  # memory in use by another program


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
