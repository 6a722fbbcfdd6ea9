"""Atomic, durable file writes and tolerant JSON reads: the store's primitives.

A write goes to a temporary file, is fsync'd and renamed over the target, so
readers see the old or the new file, never a torn one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from pytest_modelbench.secrets import redact


class StoreWarning(UserWarning):
    """Something in the run store was damaged and has been worked around."""


class StoreWriteError(OSError):
    """Writing to the run store failed (disk full, I/O error); names the file."""


def _umask_at_import() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_at_import()


def current_umask() -> int:
    """The process umask, read without changing it (``/proc/self/status`` on Linux; else the
    umask when this module was imported), so writes from other threads never see it altered."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _UMASK_AT_IMPORT


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never a torn one.

    ``durable`` also fsyncs the data (survives a machine crash, not only a process kill).
    """
    tmp = ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~current_umask())  # as open() would: teammates can read reports
        # a lone surrogate (text from a network) as its escape "\udXXX": in JSON text, where
        # only a string can hold one, that reads back as the same text
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(redact(text))
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_directory(path.parent)
    except BaseException as exc:  # a full disk, text it cannot encode, Ctrl-C: no .tmp left
        if tmp:
            with suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            raise StoreWriteError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc
        raise


def fsync_directory(directory: Path) -> None:
    """Make a rename or new file in ``directory`` durable (best effort: not every OS allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write_text(
        path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"
    )


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's object, or None when missing; a damaged file warns and reads as None."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        warnings.warn(StoreWarning(f"{path}: damaged JSON ignored"), stacklevel=2)
        return None
    return data if isinstance(data, dict) else None


def link_or_copy(src: Path, dst: Path, *, link: bool = True) -> None:
    """Put ``src``'s content at ``dst`` atomically: a hard link when allowed and possible,
    else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.seed.tmp")
    try:
        with suppress(FileNotFoundError):
            tmp.unlink()
        if link:
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copy2(src, tmp)
        else:
            shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except BaseException as exc:  # a full disk or Ctrl-C mid-copy: no .tmp left
        with suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise StoreWriteError(exc.errno, f"cannot copy {src} to {dst}: {exc.strerror}") from exc
        raise


def unshare(path: Path) -> None:
    """Replace a hard-linked file by a private copy, so appending never changes another run."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.unshare.tmp")
    try:
        shutil.copy2(path, tmp)
        os.replace(tmp, path)
    except BaseException as exc:  # a full disk or Ctrl-C mid-copy: no .tmp left
        with suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise StoreWriteError(exc.errno, f"cannot copy {path}: {exc.strerror}") from exc
        raise
