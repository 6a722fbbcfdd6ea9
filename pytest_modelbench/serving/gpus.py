"""A worker's GPUs: how many workers a node's free GPUs feed, and the worker's one claimer.

Discovery (which GPUs this process may use) is ``serving/gpu_discovery.py``; the host-local
claims (``flock`` locks, so no two workers share a GPU) are ``serving/gpu_claims.py``. Here:
``-n auto``'s worker count, the line saying what workers without a GPU do, and
:class:`GpuClaimer`, the one owner of a worker's claim. The public names of both modules
are re-exported here too (``__all__``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from pytest_modelbench.config.gpulist import GpuSpecError, parse_gpu_list
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError
from pytest_modelbench.serving.base import ServingError
from pytest_modelbench.serving.flocks import held
from pytest_modelbench.serving.gpu_claims import (
    LOCK_DIR_ENV,
    GpuClaim,
    LockNote,
    NoFreeGpuError,
    _lock_path,
    claim,
    default_lock_dir,
    held_by_session,
    lock_notes,
    session_gpus,
    tensor_parallel_warning,
    warn_if_tensor_parallel,
)
from pytest_modelbench.serving.gpu_discovery import (
    BUSY_ENV,
    DEFAULT_BUSY_MIB,
    FAKE_ENV,
    FakeGpuProvider,
    Gpu,
    GpuInventory,
    GpuProvider,
    GpuWarning,
    NvidiaSmiProvider,
    _busy,
    _unknown_usage,
    _warn_busy,
    busy_threshold,
    discover_gpus,
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
