"""What of the host the program's root holds: the interpreter, its standard library and the
shared objects they load, read-only, with every package directory under them masked.

Found once per interpreter by running it: it imports every extension module of its
standard library and lists the shared objects it then maps (``/proc/self/maps``), so
a Debian python, a pyenv or uv build and a ``/usr/local`` python each get exactly
what they need, with the symlinks that lead to them (``/lib64 -> usr/lib64``, the ELF
interpreter, sonames) and nothing else of ``/usr``. Used by
:mod:`pytest_modelbench.sandbox.bwrap` (as bubblewrap arguments) and by
:mod:`pytest_modelbench.sandbox.namespaces` (which builds the same root itself).
"""

from __future__ import annotations

import atexit
import functools
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE_DIR_GLOBS = tuple(
    f"{prefix}{name}-packages" for prefix in ("python*/", "") for name in ("site", "dist")
)
SANDBOX = Path(__file__).parent
PACKAGE_ROOT = SANDBOX.parent
# the modules the launcher runs (standard library only); bubblewrap's root gets a copy
LAUNCHER_MODULES = ("boot", "launcher", "namespaces", "candidate", "judge", "wire")
MAX_CHILDREN = 64  # entries of a home directory checked one by one
MAX_LINKS = 40  # symlinks followed for one path
SENSITIVE = ("/etc/shadow", "/etc/passwd", "/run", "/var", "/tmp", "/home", "/root", "/srv")
PT_INTERP = 3
MARK = "modelbench-layout "

# Run by the sandbox's interpreter: where its standard library is, which package directories
# it knows, what shared objects its extension modules load.
PROBE = (
    r"""
import importlib, importlib.machinery, json, os, site, sys, sysconfig
base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
        "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix}
paths = sysconfig.get_paths(vars=base)
stdlib = [paths["stdlib"], paths["platstdlib"], os.path.dirname(os.__file__)]
skip = ("_test", "_tkinter", "xx", "_xx", "_ctypes_test")
for folder in sys.path:
    if not any(folder.startswith(root) for root in stdlib) or not os.path.isdir(folder):
        continue
    for name in sorted(os.listdir(folder)):
        suffix = next((s for s in importlib.machinery.EXTENSION_SUFFIXES if name.endswith(s)), "")
        if suffix and not name.startswith(skip):
            try:
                importlib.import_module(name[: -len(suffix)])
            except BaseException:
                pass
with open("/proc/self/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if ".so" in line.split("/")[-1]})
print("""
    + repr(MARK)
    + r""" + json.dumps({
    "executable": os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable),
    "stdlib": stdlib,
    "mapped": [path for path in mapped if path.startswith("/")],
    "site": [paths["purelib"], paths["platlib"]]
    + site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]),
}))
"""
)


class LayoutError(Exception):
    """The interpreter could not be examined (it does not run, or it is not CPython on Linux)."""


@dataclass(frozen=True)
class RootLayout:
    """The host paths a sandbox root holds, each at its own path, all read-only."""

    interpreter: str
    """The interpreter the launcher runs (resolved: no venv, so the root needs no venv)."""
    dirs: tuple[str, ...]
    """Directories bound read-only: the standard library."""
    files: tuple[str, ...]
    """Files bound read-only: the interpreter and the shared objects it loads."""
    symlinks: tuple[tuple[str, str], ...]
    """``(target, path)``: the symlinks on the way to them (``/lib64 -> usr/lib64``)."""
    masks: tuple[str, ...]
    """Directories under ``dirs`` covered by an empty read-only tmpfs: every package
    directory (site-packages, dist-packages) and this package, wherever installed."""
    hidden: tuple[str, ...]
    """Host paths that must not exist in the root (checked by the launcher on every run)."""
    code: str
    """A host directory with a compiled copy of the launcher's modules (:func:`launcher_code`)."""

    def for_launcher(self) -> dict[str, Any]:
        return {
            "dirs": list(self.dirs),
            "files": list(self.files),
            "symlinks": [list(pair) for pair in self.symlinks],
            "masks": list(self.masks),
        }

    @property
    def bound(self) -> tuple[str, ...]:
        return self.dirs + self.files


def _inside(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def launcher_code(python: str) -> str:
    """:func:`_launcher_copy` for ``python``, made again when its folder is gone (a cleaner of
    the temporary directory removed it mid-session): a run never fails for want of it."""
    code = _launcher_copy(python)
    if not _complete(code):
        _launcher_copy.cache_clear()
        _root_layout.cache_clear()
        code = _launcher_copy(python)
    return code


def _complete(code: str) -> bool:
    """Whether the launcher's copy in ``code`` is all there (one stat per module)."""
    target = os.path.join(code, "pytest_modelbench", "sandbox")
    return all(os.path.isfile(os.path.join(target, f"{name}.py")) for name in LAUNCHER_MODULES)


@functools.lru_cache(maxsize=8)
def _launcher_copy(python: str) -> str:
    """A world-readable copy of the launcher's modules with bytecode for ``python``; removed
    when this process exits. The sandbox user may not be able to read this package where it
    is installed, and ``-B`` (or ``PYTHONDONTWRITEBYTECODE``) would otherwise have every
    run compile them again (some 15 ms of CPU)."""
    code = tempfile.mkdtemp(prefix="modelbench-sandbox-code-")
    atexit.register(_remove, code, os.getpid())
    target = Path(code) / "pytest_modelbench" / "sandbox"
    target.mkdir(parents=True)
    for name in LAUNCHER_MODULES:
        shutil.copyfile(SANDBOX / f"{name}.py", target / f"{name}.py")
    compile_all = (
        "import compileall, sys; sys.exit(not compileall.compile_dir(sys.argv[1], quiet=1))"
    )
    try:
        subprocess.run([python, "-I", "-S", "-c", compile_all, str(target)], timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        raise LayoutError(f"could not compile the launcher with {python}: {error}") from None
    for root, _, files in os.walk(code):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return code


def _remove(folder: str, owner: int) -> None:
    """Remove ``folder`` at exit, in the process that made it (not in a forked child)."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _examine(python: str) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        line = next(line for line in done.stdout.splitlines() if line.startswith(MARK))
        found: dict[str, Any] = json.loads(line[len(MARK) :])
    except (OSError, subprocess.SubprocessError, ValueError, StopIteration) as error:
        detail = getattr(error, "stderr", "") or error
        raise LayoutError(f"could not examine the interpreter {python}: {detail}") from None
    return found


def _masks(dirs: tuple[str, ...], known: list[str]) -> tuple[str, ...]:
    """Package directories under the bound ``dirs``: the interpreter's site directories,
    every ``python*/site-packages`` or ``dist-packages``, this package, the host's import
    path beyond the standard library."""
    found = {os.path.realpath(path) for path in known}
    for folder in dirs:
        for pattern in PACKAGE_DIR_GLOBS:
            found.update(os.path.realpath(path) for path in glob.glob(f"{folder}/{pattern}"))
    found.add(str(PACKAGE_ROOT.resolve()))
    masks = {
        path for path in found if os.path.isdir(path) and _inside(path, dirs) and path not in dirs
    }
    # a mask inside another mask is hidden already (and could not be mounted on a read-only one)
    return tuple(sorted(p for p in masks if not _inside(os.path.dirname(p), sorted(masks))))


def _import_path(stdlib: list[str]) -> list[str]:
    """The host's import path beyond the standard library (where packages are found)."""
    found = []
    for entry in sys.path:
        path = os.path.realpath(entry or ".")
        if not _inside(path, stdlib) or re.search(r"(site|dist)-packages", path):
            found.append(path)
    return found


def _hidden(bound: tuple[str, ...]) -> tuple[str, ...]:
    """Host paths that must be absent in the root: this package, the home and working
    directories, secrets, sockets; where a bound path lies under one, its other entries."""
    home = os.path.expanduser("~")
    candidates = [str(PACKAGE_ROOT.resolve()), os.getcwd(), home, *SENSITIVE]
    hidden: list[str] = []
    for path in dict.fromkeys(os.path.realpath(p) for p in candidates):
        if path == "/" or _inside(path, bound):
            continue
        if not any(_inside(b, [path]) for b in bound):
            hidden.append(path)
            continue
        try:  # an ancestor of a bound path (pyenv under the home): its other entries
            entries = sorted(os.listdir(path))[:MAX_CHILDREN]
        except OSError:
            continue
        for name in entries:
            child = os.path.join(path, name)
            if not any(_inside(b, [child]) for b in bound):
                hidden.append(child)
    return tuple(hidden)


def elf_interpreter(path: str) -> str | None:
    """The ELF program interpreter (``PT_INTERP``: the dynamic loader) of ``path``, if any."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"\x7fELF":
            return None
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        if wide:
            phoff, phentsize, phnum = struct.unpack_from(order + "Q14xHH", head, 32)
        else:
            phoff, phentsize, phnum = struct.unpack_from(order + "I10xHH", head, 28)
        for index in range(phnum):
            handle.seek(phoff + index * phentsize)
            entry = handle.read(phentsize)
            kind = struct.unpack_from(order + "I", entry)[0]
            if kind == PT_INTERP:
                offset, size = struct.unpack_from(order + ("4xQ16xQ" if wide else "I8xI"), entry, 4)
                handle.seek(offset)
                return handle.read(size).rstrip(b"\0").decode()
    return None


def reproduce(path: str, links: dict[str, str], depth: int = 0) -> str:
    """The real path behind ``path``; records in ``links`` every symlink on the way, so the
    root can hold the same path (``/lib64/ld-linux-x86-64.so.2`` ->
    ``/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2``)."""
    if depth > MAX_LINKS:
        raise LayoutError(f"too many symlinks on the way to {path}")
    parts = [part for part in path.split("/") if part]
    current = ""
    for index, part in enumerate(parts):
        current = f"{current}/{part}"
        if os.path.islink(current):
            target = os.readlink(current)
            links[current] = target
            base = (
                target if target.startswith("/") else os.path.join(os.path.dirname(current), target)
            )
            rest = os.path.join(os.path.normpath(base), *parts[index + 1 :])
            return reproduce(rest, links, depth + 1)
    return current or "/"


def _soname_links(libraries: list[str], links: dict[str, str]) -> None:
    """Symlinks beside each library that lead to it (``libffi.so.8 -> libffi.so.8.1.2``):
    the loader asks for those names."""
    by_folder: dict[str, set[str]] = {}
    for library in libraries:
        by_folder.setdefault(os.path.dirname(library), set()).add(library)
    for folder, wanted in by_folder.items():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink() and os.path.realpath(entry.path) in wanted:
                reproduce(entry.path, links)


def _outermost(paths: list[str]) -> tuple[str, ...]:
    """``paths`` without those inside another of them, in order."""
    kept: list[str] = []
    for path in sorted(dict.fromkeys(paths), key=len):
        if not _inside(path, kept):
            kept.append(path)
    return tuple(sorted(kept))


def root_layout(python: str) -> RootLayout:
    """The layout for ``python`` (examined once per interpreter and process; its launcher's
    copy made again when removed)."""
    layout = _root_layout(python)
    if not _complete(layout.code):
        _root_layout.cache_clear()
        layout = _root_layout(python)
    return layout


@functools.lru_cache(maxsize=8)
def _root_layout(python: str) -> RootLayout:
    if not sys.platform.startswith("linux"):
        raise LayoutError("a sandbox root needs Linux")
    found = _examine(python)
    links: dict[str, str] = {}
    dirs = _outermost([reproduce(p, links) for p in found["stdlib"] if os.path.isdir(p)])
    interpreter = reproduce(str(found["executable"]), links)
    loader = elf_interpreter(interpreter)
    wanted = [interpreter, *found["mapped"], *([loader] if loader else [])]
    files = {reproduce(path, links) for path in wanted if os.path.isfile(path)}
    libraries = sorted(path for path in files if not _inside(path, dirs))
    _soname_links(libraries, links)
    return RootLayout(
        interpreter=interpreter,
        dirs=dirs,
        files=tuple(libraries),
        symlinks=tuple(sorted((target, path) for path, target in links.items())),
        masks=_masks(dirs, [*found["site"], *_import_path(found["stdlib"])]),
        hidden=_hidden((*dirs, *libraries)),
        code=launcher_code(python),
    )
