"""Our own namespace sandbox, for hosts without bubblewrap: the same minimal root, built here.

Child side, standard library only (run by :mod:`pytest_modelbench.sandbox.launcher`).
Three processes take part, so that no process of the program's is ever host uid 0:

* the launcher ``L`` (on the host, as the caller) forks ``A`` and writes ``A``'s
  uid/gid maps from outside once ``A`` has unshared (a root caller may map
  ids other than its own only from the parent namespace), then drops to the
  sandbox user and waits;
* ``A`` enters new user, mount, PID, network, IPC, UTS and cgroup namespaces,
  forks ``B``, drops to the sandbox user and waits;
* ``B`` is PID 1 of the new PID namespace: it builds the root (a tmpfs holding
  read-only binds of the interpreter, its standard library and the system
  libraries, with every package directory under them masked; the working
  directory at ``/work``; a few device nodes; a private ``/proc``, read-only,
  with nested user namespaces disabled), pivots into it, and becomes the
  sandbox user with no capabilities before anything of the program's runs.

Every step is required: a failure ends the run as a setup failure, never a
weaker sandbox.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
from typing import Any, NoReturn

SANDBOX_ID = 65534  # uid and gid of the program inside its user namespace ("nobody")
INSIDE_WORKDIR = "/work"  # where the working directory appears in the sandbox
SETUP_FAILED = 199  # exit code when the launcher itself cannot run the program

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
# statvfs f_flag bits -> mount flags a bind remount must keep (the kernel locks them)
KEPT_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC}
KEPT_FLAGS.update({1024: 1024, 2048: 2048, 4096: 1 << 21})  # noatime, nodiratime, relatime

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522

SYS_PIVOT_ROOT = {"x86_64": 155, "ppc64le": 203, "ppc64": 203, "s390x": 217}
SYS_PIVOT_ROOT.update(dict.fromkeys(("aarch64", "arm64", "riscv64", "loongarch64"), 41))
DEVICES = ("null", "zero", "full", "random", "urandom")
SHM_BYTES = 16 << 20  # /dev/shm is private memory: bounded


class SetupError(Exception):
    """A step of the sandbox's set-up failed; the program must not run."""


def libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def _encode(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def mount(
    lib: Any, source: str | None, target: str, fstype: str | None, flags: int, data: str = ""
) -> None:
    args = (_encode(source), _encode(target), _encode(fstype), ctypes.c_ulong(flags))
    if lib.mount(*args, _encode(data) if data else None):
        raise SetupError(f"mount {target}: {_errno_text()}")


def write_file(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def fail(message: str) -> NoReturn:
    """End this process as a setup failure (the host shows ``message``)."""
    print(f"modelbench sandbox setup failed: {message}", file=sys.stderr, flush=True)
    os._exit(SETUP_FAILED)


# -- L and A: new namespaces, with id maps written from outside ------------------------


def _read_byte(fd: int) -> bytes:
    data = os.read(fd, 1)
    os.close(fd)
    return data


def _id_maps(pid: int) -> None:
    """Map the sandbox user (and, for a root caller, root for ``B``'s set-up) into ``pid``'s
    user namespace; a caller that is not root can map only its own ids."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        both = f"0 0 1\n{SANDBOX_ID} {SANDBOX_ID} 1\n"
        uid_map = gid_map = both
    else:
        write_file(f"/proc/{pid}/setgroups", "deny")
        uid_map, gid_map = f"{SANDBOX_ID} {uid} 1\n", f"{SANDBOX_ID} {gid} 1\n"
    write_file(f"/proc/{pid}/uid_map", uid_map)
    write_file(f"/proc/{pid}/gid_map", gid_map)


def become_sandbox_user(setgroups: bool) -> None:
    """Drop to the sandbox uid/gid (and, where allowed, no supplementary groups)."""
    if setgroups:
        os.setgroups([])
    os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
    os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)


def enter(network: bool, report_fd: int) -> None:
    """Return in ``B`` (PID 1 of the new namespaces); ``L`` and ``A`` wait and exit with it."""
    if not sys.platform.startswith("linux"):
        fail("namespaces need Linux")
    root = os.geteuid() == 0
    up_read, up_write = os.pipe()  # A -> L: unshared (or why not)
    go_read, go_write = os.pipe()  # L -> A: maps written
    a = os.fork()
    if a == 0:
        os.close(up_read)
        os.close(go_write)
        _unshare(network, up_write, go_read)
        b = os.fork()
        if b == 0:
            return  # B: PID 1 of the new PID namespace
        os.close(report_fd)  # B reports; no process outside the sandbox holds the socket
        _exit_like(b, drop=True, setgroups=root)
    os.close(up_write)
    os.close(go_read)
    reply = os.read(up_read, 512)
    os.close(up_read)
    if reply == b"u":
        try:
            _id_maps(a)
            os.write(go_write, b"g")
        except OSError as error:
            print(f"modelbench sandbox setup failed: id maps: {error}", file=sys.stderr)
    os.close(go_write)
    os.close(report_fd)
    _exit_like(a, drop=root, setgroups=True)


def _unshare(network: bool, up_write: int, go_read: int) -> None:
    """``A``: enter the new namespaces, tell ``L``, wait until ``L`` has written the maps."""
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    flags |= CLONE_NEWCGROUP | (0 if network else CLONE_NEWNET)
    if libc().unshare(flags) != 0:
        message = f"unshare: {_errno_text()}"
        os.write(up_write, message.encode())
        fail(message)
    os.write(up_write, b"u")
    os.close(up_write)
    if _read_byte(go_read) != b"g":
        fail("the launcher could not write the user namespace's id maps")


def _exit_like(pid: int, *, drop: bool, setgroups: bool) -> NoReturn:
    """Drop to the sandbox user where asked (nothing privileged is left to do), wait for
    ``pid`` and exit with its status."""
    if drop:
        try:
            become_sandbox_user(setgroups)
        except OSError as error:
            os.kill(pid, 9)
            fail(f"dropping to the sandbox user: {error}")
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED)


# -- B: the root -----------------------------------------------------------------------


def _kept_flags(path: str) -> int:
    flags = os.statvfs(path).f_flag
    return sum(mount_flag for bit, mount_flag in KEPT_FLAGS.items() if flags & bit)


def _readonly(lib: Any, point: str) -> None:
    extra = MS_RDONLY | MS_NOSUID | MS_NODEV
    mount(lib, None, point, None, MS_BIND | MS_REMOUNT | extra | _kept_flags(point))


def _mountpoint(path: str, directory: bool) -> None:
    os.makedirs(path if directory else os.path.dirname(path), mode=0o755, exist_ok=True)
    if not directory and not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o444))


def _mount_points(under: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if point == under or point.startswith(under + "/"):
                points.append(point)
    return points


def _make_dev(lib: Any, dev: str) -> list[str]:
    """A small /dev: bound device nodes, the usual symlinks, a private bounded /dev/shm."""
    os.mkdir(dev)
    mount(lib, "tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        _mountpoint(f"{dev}/{name}", directory=False)
        mount(lib, f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{dev}/{name}")
    os.symlink("/proc/self/fd/1", f"{dev}/stdout")
    os.symlink("/proc/self/fd/2", f"{dev}/stderr")
    os.mkdir(f"{dev}/shm")
    shm = f"mode=1777,size={SHM_BYTES}"
    mount(lib, "tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, shm)
    return [f"{dev}/{name}" for name in DEVICES] + [f"{dev}/shm"]


def _pivot(lib: Any, new: str) -> None:
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise SetupError(f"pivot_root: unknown system call number on {platform.machine()}")
    os.chdir(new)
    if lib.syscall(number, b".", b".") != 0:
        raise SetupError(f"pivot_root: {_errno_text()}")
    if lib.umount2(b".", MNT_DETACH) != 0:
        raise SetupError(f"detaching the host's root: {_errno_text()}")
    os.chdir("/")


def _copy_work(source: str, target: str) -> None:
    """The host's files for the program, copied into its tmpfs working directory (the host's
    folder is never mounted: nothing the program writes reaches the host's disk)."""
    for folder, dirs, names in os.walk(source):
        relative = os.path.relpath(folder, source)
        into = target if relative == "." else os.path.join(target, relative)
        for name in dirs:
            os.mkdir(os.path.join(into, name), 0o755)
            os.chown(os.path.join(into, name), SANDBOX_ID, SANDBOX_ID)
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                data = handle.read()
            path = os.path.join(into, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
                os.fchown(fd, SANDBOX_ID, SANDBOX_ID)
            finally:
                os.close(fd)


def build_root(config: dict[str, Any]) -> dict[str, Any]:
    """Build the program's root from ``config["layout"]`` and pivot into it (in ``B``)."""
    lib = libc()
    layout, new = config["layout"], config["root_dir"]
    mount(lib, None, "/", None, MS_REC | MS_PRIVATE)
    mount(lib, "tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for target, path in layout["symlinks"]:
        os.makedirs(os.path.dirname(new + path), mode=0o755, exist_ok=True)
        os.symlink(target, new + path)
    for path, directory in [(d, True) for d in layout["dirs"]] + [
        (f, False) for f in layout["files"]
    ]:
        _mountpoint(new + path, directory)
        mount(lib, path, new + path, None, MS_BIND | MS_REC)
    for path in layout["masks"]:
        mount(lib, "tmpfs", new + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0555")
    work = new + INSIDE_WORKDIR
    os.mkdir(work)
    size = config["limits"]["work_bytes"] + _tree_bytes(config["host_workdir"])  # see bwrap
    options = f"mode=0755,size={size},uid={SANDBOX_ID},gid={SANDBOX_ID}"
    mount(lib, "tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, options)
    _copy_work(config["host_workdir"], work)
    writable = [work, *_make_dev(lib, new + "/dev")]
    os.mkdir(new + "/proc")
    mount(lib, "proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    write_file(new + "/proc/sys/user/max_user_namespaces", "0")  # this namespace's own limit
    for point in _mount_points(new):
        if point not in writable:
            _readonly(lib, point)
    _pivot(lib, new)
    os.chdir(INSIDE_WORKDIR)
    return {"root": "minimal", "nested_userns": False}


def _tree_bytes(top: str) -> int:
    """The bytes of the files under ``top`` (what is copied into the working directory)."""
    total = 0
    for folder, _, names in os.walk(top):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def drop_privileges(setgroups: bool) -> None:
    """No capabilities, now or after exec; the sandbox user; no way to regain either."""
    lib = libc()
    lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    lib.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(_last_cap() + 1):
        lib.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # needs CAP_SETPCAP: before the uid changes
    become_sandbox_user(setgroups)
    clear_capabilities(lib)


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63


def clear_capabilities(lib: Any) -> None:
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    lib.capset(header, data)


def effective_capabilities() -> int:
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("CapEff:"))
    return int(line.split()[1], 16)
