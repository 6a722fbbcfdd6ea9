"""Sharing a running server with the workers of the same session on this node that have no
GPU of their own, and the ``flock`` helpers of the GPU claims.

(Lending a server, and every other coordination between the workers of a session, goes
through the session's exchange: ``serving/exchange.py``.) A worker that finds no free GPU
shares a running server (:func:`share`): every worker's server is published while it runs,
in a host-local directory next to the GPU locks (``<lock dir>/session-<id>/``), and shared
by any number of workers at once, with ``flock`` locks, which the kernel drops when a
process dies:

* ``serving-<worker>-<pid>.json``: a running server of ``key`` at ``url``;
* ``serving-<worker>-<pid>.lock``: a shared lock held by each worker sending to it while an
  item runs; its owner withdraws the record, then waits for them to let go before stopping it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

OFFER_POLL_S = 0.2  # how often a withdrawn shared server looks whether its sharers let go

__all__ = ["Published", "Shared", "held", "launch_key", "lock_exclusive", "share"]


def launch_key(fields: Mapping[str, Any]) -> str:
    """Servers started from equal launches are interchangeable."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def session_dir(session: str, lock_dir: Path) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in session)
    return lock_dir / f"session-{safe}"


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


LOCK_TRIES = 3  # a probe (held) holds a lock for microseconds: try again that soon
LOCK_RETRY_S = 0.005


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


def _lock(path: Path, *, create: bool = True) -> int | None:
    """A held exclusive lock on ``path``, or None when another holds it (or, without
    ``create``, when the file is gone)."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        return None
    if lock_exclusive(fd):
        return fd
    os.close(fd)
    return None


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _tidy(directory: Path) -> None:
    """Remove the session's directory once nothing is left in it (the last one out)."""
    with contextlib.suppress(OSError):
        directory.rmdir()


def _glob(directory: Path, pattern: str) -> Iterator[Path]:
    try:
        yield from sorted(directory.glob(pattern))
    except OSError:
        return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Published:
    """The owner's side of sharing: its running server of ``key``, open to the workers of the
    session on this node that have no GPU of their own (their requests join its queue)."""

    def __init__(
        self, session: str, worker: str, key: str, url: str, pid: int | None, lock_dir: Path
    ) -> None:
        self.directory = session_dir(session, lock_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = f"serving-{worker}-{pid or os.getpid()}"
        self.path = self.directory / f"{stem}.json"
        self.lock = self.directory / f"{stem}.lock"
        self.lock.touch()
        record = {"key": key, "url": url, "pid": pid, "worker": worker, "lock": self.lock.name}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)
        self._open = True

    def in_use(self) -> bool:
        """Whether an item of another worker sends to this server now."""
        fd = _lock(self.lock, create=False)
        if fd is None:
            return self.lock.exists()
        _unlock(fd)
        return False

    def close(self, *, wait: bool = True, poll_s: float = OFFER_POLL_S) -> None:
        """Withdraw the server (no new sharer finds it); with ``wait``, until every worker
        sending to it has let go (its item ended, or its process died)."""
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(OSError):
            self.path.unlink()
        try:
            while wait:
                fd = _lock(self.lock, create=False)
                if fd is not None or not self.lock.exists():
                    if fd is not None:
                        _unlock(fd)
                    break
                time.sleep(poll_s)
        finally:  # Ctrl-C while waiting leaves nothing behind either
            with contextlib.suppress(OSError):
                self.lock.unlink()
            _tidy(self.directory)


class Shared:
    """The sharer's side: another worker's running server, used until :meth:`stop`."""

    def __init__(self, url: str, pid: int | None, worker: str, fd: int) -> None:
        self.base_url = url
        self.pid = pid
        self.worker = worker
        self._fd: int | None = fd

    def is_alive(self) -> bool:
        return self._fd is not None and (self.pid is None or _alive(self.pid))

    def stop(self) -> None:
        """Let go: its owner may stop it (it stays up while other workers send to it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            _unlock(fd)

    def death_report(self) -> str | None:
        if self.pid is None or _alive(self.pid):
            return None
        return f"the server of worker {self.worker} (pid {self.pid}), shared, exited"


def share(session: str, key: str, lock_dir: Path) -> Shared | None:
    """A running server of ``key`` that a worker of the session on this node published,
    locked (shared) for this process; None when there is none."""
    directory = session_dir(session, lock_dir)
    for path in _glob(directory, "serving-*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("key") != key:
            continue
        pid = record.get("pid")
        pid = pid if isinstance(pid, int) else None
        if pid is not None and not _alive(pid):
            continue
        try:
            fd = os.open(directory / str(record.get("lock")), os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # its owner is withdrawing it
            os.close(fd)
            continue
        if not path.exists():  # withdrawn meanwhile
            _unlock(fd)
            continue
        return Shared(str(record["url"]), pid, str(record.get("worker")), fd)
    return None
