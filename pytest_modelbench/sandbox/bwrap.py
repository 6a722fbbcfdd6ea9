"""The sandbox through bubblewrap (``bwrap``, Debian's ``bubblewrap`` package), where installed.

bubblewrap builds the same minimal root as :mod:`pytest_modelbench.sandbox.namespaces`
(from a :class:`~pytest_modelbench.sandbox.layout.RootLayout`) in new user, mount, PID,
network, IPC, UTS and cgroup namespaces, maps the program to uid/gid 65534 ("nobody"),
disables nested user namespaces, mounts a private ``/proc`` read-only and runs the launcher
as PID 1. bubblewrap maps the sandbox user to the uid that starts it, so a root caller starts
it as the sandbox user: nothing in the sandbox is host uid 0, and it sees only what that
user may read (an interpreter under ``/root`` is out of its reach: then our own namespaces
are used).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from pytest_modelbench.sandbox.layout import RootLayout
from pytest_modelbench.sandbox.namespaces import INSIDE_WORKDIR, SANDBOX_ID, SHM_BYTES

CODE_DIR = "/opt/modelbench"  # where the launcher's modules appear in the sandbox
CGROUP_VAR = "MODELBENCH_SANDBOX_CGROUP"  # "1": the run's cgroup was joined (see joining)
# waits until the host has moved it into the run's cgroups (a line on stdin: the sandbox user
# may not move itself out of root's cgroup on cgroup v2), checks that /proc/self/cgroup shows
# the run's cgroup in each hierarchy, then runs bubblewrap, telling the launcher whether it
# does (bubblewrap's child stays in the cgroups it starts in)
JOIN = (
    "read -r go; name=$1; k=$2; shift 2; c=0; while read -r line; do case $line in "
    '*/"$name") c=$((c + 1));; esac; done < /proc/self/cgroup; ok=0; [ "$c" -eq "$k" ] && ok=1; '
    f'b=$1; shift; exec "$b" --setenv {CGROUP_VAR} "$ok" "$@" < /dev/null'
)
HOSTNAME = "sandbox"


def find_bwrap() -> str | None:
    """The ``bwrap`` executable on ``PATH`` (or the usual places), if installed."""
    return shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")


def work_files(workdir: str) -> list[tuple[int, str]]:
    """(a descriptor open for reading, its path relative to ``workdir``) per file the host
    wrote there (folders first), for :func:`command`; the caller closes them (-1: a folder)."""
    found: list[tuple[int, str]] = []
    try:
        for folder, dirs, names in os.walk(workdir):
            relative = os.path.relpath(folder, workdir)
            prefix = "" if relative == "." else relative + "/"
            found += [(-1, prefix + name) for name in sorted(dirs)]
            found += [(os.open(os.path.join(folder, n), os.O_RDONLY), prefix + n) for n in names]
    except BaseException:
        for fd, _ in found:
            if fd >= 0:
                os.close(fd)
        raise
    return found


def command(
    bwrap: str,
    layout: RootLayout,
    files: list[tuple[int, str]],
    config_fd: int,
    *,
    network: bool,
    work_bytes: int,
) -> list[str]:
    """The ``bwrap`` command line that runs the launcher (its configuration on the inherited
    descriptor ``config_fd``) in a fresh root, with ``files`` (from :func:`work_files`)
    copied into a tmpfs of ``work_bytes`` (plus their own size) at the working directory."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    if network:
        args.append("--share-net")
    args += ["--die-with-parent", "--new-session", "--as-pid-1", "--hostname", HOSTNAME]
    args += ["--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID)]
    for target, path in layout.symlinks:
        args += ["--symlink", target, path]
    for path in layout.bound:
        args += ["--ro-bind", path, path]
    for path in layout.masks:
        args += ["--tmpfs", path, "--remount-ro", path]
    args += ["--ro-bind", layout.code, CODE_DIR]
    args += ["--proc", "/proc", "--remount-ro", "/proc"]
    args += [
        "--dev",
        "/dev",
        "--size",
        str(SHM_BYTES),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
    ]
    # the files copied in come on top of the program's own space: a reply larger than the
    # working directory is the program's to run (and fail), never a set-up failure
    copied = sum(os.fstat(fd).st_size for fd, _ in files if fd >= 0)
    size = work_bytes + copied
    args += ["--size", str(size), "--perms", "0755", "--tmpfs", INSIDE_WORKDIR]
    for fd, name in files:
        target = f"{INSIDE_WORKDIR}/{name}"
        args += ["--dir", target] if fd < 0 else ["--perms", "0644", "--file", str(fd), target]
    args += ["--chdir", INSIDE_WORKDIR, "--remount-ro", "/"]
    boot = f"{CODE_DIR}/pytest_modelbench/sandbox/boot.py"
    return [*args, "--", layout.interpreter, "-I", "-B", boot, str(config_fd)]


def joining(count: int, name: str, argv: list[str]) -> list[str]:
    """``argv`` (bubblewrap's) run by a shell that waits for a line on its stdin, sent once
    the host has moved it into the cgroups named ``name`` (``count`` hierarchies: the
    launcher, inside, can no longer reach them), and checks that it is inside each."""
    shell = shutil.which("sh", path="/bin:/usr/bin") or "/bin/sh"
    return [shell, "-c", JOIN, "sh", name, str(count), *argv]


def popen_options() -> dict[str, Any]:
    """How ``subprocess.Popen`` starts bubblewrap: as the sandbox user when we are root (it
    maps the sandbox to its own uid), with no supplementary groups."""
    if os.geteuid() != 0:
        return {}
    return {"user": SANDBOX_ID, "group": SANDBOX_ID, "extra_groups": []}
