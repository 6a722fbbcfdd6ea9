"""Child side of the sandbox: isolate this process, then run one untrusted program.

Run in a fresh ``python -I -B`` by :mod:`pytest_modelbench.sandbox.boot` for
:mod:`pytest_modelbench.sandbox.host`. Standard library only (and the
stdlib-only siblings ``candidate``, ``judge`` and ``wire``). Every isolation step is
best effort and recorded in the report (JSON lines on a socket the host passed
in), so the host knows exactly what held:

1. join the host-made pids cgroup (process-count limit that also binds root);
2. ``unshare`` user + mount + network + PID namespaces (Linux, where permitted);
3. a PID-1 reaper in the new PID namespace remounts every filesystem read-only
   except the working directory, hides well-known credential folders, mounts a
   fresh ``/proc`` (other processes and their environments become invisible);
4. the worker sets rlimits (CPU, address space, file size, open files, process
   count), drops every capability, installs a Python audit hook (no sockets, no
   writes outside the working directory, no ``ctypes``; no process spawning when
   neither a cgroup nor ``RLIMIT_NPROC`` can bound it), closes every descriptor
   but stdio, then runs the program.

Plain runs report the program's exit. Judged runs (``config["judged"]``) turn
PID 1 into :mod:`pytest_modelbench.sandbox.judge`: it forks the program's
process first, then reads the tests from the host, runs them against the
program over two pipes and reports the verdict. The launcher and the judge are
non-dumpable; only the program's process is made dumpable again.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from pytest_modelbench.sandbox import candidate, judge, wire

SETUP_FAILED = 199  # exit code when the launcher itself cannot run the program

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
# statvfs f_flag bits -> mount flags that must be kept on a bind remount (locked flags)
KEPT_FLAGS = {
    1: MS_RDONLY,
    2: MS_NOSUID,
    4: MS_NODEV,
    8: MS_NOEXEC,
    1024: MS_NOATIME,
    2048: MS_NODIRATIME,
    4096: MS_RELATIME,
}

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522

CREDENTIAL_PATHS = (
    ".ssh",
    ".aws",
    ".azure",
    ".gnupg",
    ".kube",
    ".docker",
    ".netrc",
    ".pypirc",
    ".git-credentials",
    ".huggingface",
    ".cache/huggingface",
    ".config/gcloud",
    ".config/gh",
)

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PATH_EVENTS = {  # audit event -> indices of path arguments that get modified
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
}
NETWORK_EVENTS = {
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.sendmsg",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
}
MAX_FD = 1 << 16  # descriptors above this are never open (RLIMIT_NOFILE is far lower)
SPAWN_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"}
FORK_EVENTS = {"os.fork", "os.forkpty"}


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _encode(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def _mount(libc: Any, source: str | None, target: str, fstype: str | None, flags: int) -> None:
    if libc.mount(_encode(source), _encode(target), _encode(fstype), ctypes.c_ulong(flags), None):
        raise OSError(ctypes.get_errno(), f"mount {target}: {_errno_text()}")


def unshare_namespaces(network: bool) -> dict[str, Any]:
    """Enter new namespaces, trying the strongest combination first."""
    if not sys.platform.startswith("linux"):
        return {"namespaces": "unsupported platform"}
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    net = 0 if network else CLONE_NEWNET
    full = CLONE_NEWNS | CLONE_NEWPID | net
    attempts = [CLONE_NEWUSER | full, CLONE_NEWUSER | net]
    if uid == 0:  # real root may create namespaces without a user namespace
        attempts[1:1] = [full]
        attempts.append(net)
    errors = []
    for flags in attempts:
        if flags == 0:
            continue
        if libc.unshare(flags) != 0:
            errors.append(f"unshare({flags:#x}): {_errno_text()}")
            continue
        if flags & CLONE_NEWUSER:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        return {
            "userns": bool(flags & CLONE_NEWUSER),
            "mountns": bool(flags & CLONE_NEWNS),
            "pidns": bool(flags & CLONE_NEWPID),
            "netns": bool(flags & CLONE_NEWNET),
        }
    return {"namespaces": "; ".join(errors) or "not requested"}


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            field = line.split()[4]
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field))
    return points


def lock_filesystem(workdir: str, home: str) -> dict[str, Any]:
    """Read-only view of every mount except ``workdir``; hide credentials; fresh /proc."""
    libc = _libc()
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    _mount(libc, workdir, workdir, None, MS_BIND | MS_REC)
    os.chdir(workdir)  # the old cwd still points into the soon read-only parent mount
    failed = []
    for point in _mount_points():
        if point == workdir or point.startswith(workdir + "/") or point.startswith("/proc/"):
            continue
        try:
            flags = os.statvfs(point).f_flag
            kept = sum(mount_flag for bit, mount_flag in KEPT_FLAGS.items() if flags & bit)
            _mount(libc, None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | kept)
        except OSError:
            failed.append(point)
    hidden = 0
    for name in CREDENTIAL_PATHS:
        path = os.path.join(home, name)
        try:
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                _mount(libc, "tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV)
            elif stat.S_ISREG(mode):
                _mount(libc, "/dev/null", path, None, MS_BIND)
            hidden += 1
        except OSError:
            continue
    report: dict[str, Any] = {"readonly_fs": not failed, "credentials_hidden": hidden}
    if failed:
        report["readonly_failed"] = failed[:5]
    try:
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        report["private_proc"] = True
    except OSError as error:
        report["private_proc"] = False
        report["proc_error"] = str(error)
    return report


def drop_capabilities() -> bool:
    """No capabilities now or after exec, so the program cannot undo the mounts."""
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            last = int(handle.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    libc.capset(header, data)
    with open("/proc/self/status") as handle:
        effective = next(line for line in handle if line.startswith("CapEff:"))
    return int(effective.split()[1], 16) == 0


def set_dumpable(dumpable: bool) -> bool:
    """A non-dumpable process cannot be ptraced, and its ``/proc/PID/{mem,fd,environ}``
    stay closed to any process without ``CAP_SYS_PTRACE`` (the program has none)."""
    if not sys.platform.startswith("linux"):
        return False
    return bool(_libc().prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0) == 0)


def _count_processes(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _setrlimit(which: int, value: int, hard: int | None = None) -> None:
    import resource  # function-level: Unix only, and only the processes that set limits need it

    _, hard_now = resource.getrlimit(which)
    hard = value if hard is None else hard
    if hard_now != resource.RLIM_INFINITY:
        hard = min(hard, hard_now)
    resource.setrlimit(which, (min(value, hard), hard))


def set_process_limits(limits: dict[str, int]) -> None:
    """CPU time, address space, file size, open files, no core dumps."""
    import resource  # function-level: Unix only

    _setrlimit(resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_seconds"] + 1)
    _setrlimit(resource.RLIMIT_AS, limits["memory_bytes"])
    _setrlimit(resource.RLIMIT_FSIZE, limits["file_size_bytes"])
    _setrlimit(resource.RLIMIT_NOFILE, limits["open_files"])
    _setrlimit(resource.RLIMIT_CORE, 0)


def set_limits(limits: dict[str, int], host_uid: int, iso: dict[str, Any]) -> str:
    """Apply rlimits; return how the process count is bounded (cgroup/rlimit/guard)."""
    import resource  # function-level: Unix only

    set_process_limits(limits)
    if iso.get("cgroup"):
        return "cgroup"
    if host_uid == 0:
        return "guard"  # RLIMIT_NPROC never binds uid 0, even inside a user namespace
    own = 0 if iso.get("userns") else _count_processes(host_uid)
    _setrlimit(resource.RLIMIT_NPROC, own + limits["max_processes"])
    return "rlimit"


def _modifies(event: str, args: tuple[Any, ...]) -> list[Any]:
    if event == "open":
        path, mode, flags = [*args, None, None, None][:3]
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS
        )
        return [path] if writes else []
    return [args[i] for i in PATH_EVENTS.get(event, ()) if i < len(args)]


def _denied_event(
    event: str, args: tuple[Any, ...], network: bool, spawn: bool, fork: bool, own_proc: set[str]
) -> str | None:
    """What ``event`` would do that the policy forbids (writes aside), or None."""
    if event in NETWORK_EVENTS and not network:
        return f"network access ({event})"
    if event == "ctypes.dlopen":
        return "loading native libraries with ctypes"
    if event in SPAWN_EVENTS and not spawn:
        return f"starting programs ({event})"
    if event in FORK_EVENTS and not fork:
        return f"creating processes ({event})"
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        parts = path.split("/")
        is_pid = len(parts) > 2 and parts[:2] == ["", "proc"] and parts[2].isdigit()
        if is_pid and parts[2] not in own_proc:
            return f"reading other processes ({path})"
    return None


def make_guard(workdir: str, *, network: bool, spawn: bool, fork: bool) -> Callable[..., None]:
    """An audit hook enforcing the Python-level policy (a second line behind the OS)."""
    allowed = (os.path.realpath(workdir), "/dev/null")
    own_proc = {"self", "thread-self", str(os.getpid())}

    def inside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return True
        real = os.path.realpath(os.fsdecode(path))
        return any(real == root or real.startswith(root + os.sep) for root in allowed)

    def deny(what: str) -> None:
        raise PermissionError(f"modelbench sandbox: {what} is not allowed")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        denied = _denied_event(event, args, network, spawn, fork, own_proc)
        if denied is not None:
            deny(denied)
        for path in _modifies(event, args):
            if not inside(path):
                deny(f"writing outside the working directory ({os.fsdecode(path)})")

    return hook


def _report(fd: int, record: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())


def _exit_record(status: int) -> dict[str, int]:
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED}


def _close_descriptors(keep: tuple[int, ...]) -> None:
    """Close every descriptor but stdio and ``keep``: the socket to the host above all."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, MAX_FD)


def confine(
    config: dict[str, Any], iso: dict[str, Any], keep: tuple[int, ...] = ()
) -> Callable[..., None]:
    """Limits, no capabilities, the isolation report, no inherited descriptors, dumpable
    again (this is the untrusted process); the audit hook to install last."""
    try:
        nproc = set_limits(config["limits"], config["host_uid"], iso)
        iso["nproc"] = nproc
        iso["caps_dropped"] = drop_capabilities()
        fork = nproc != "guard"
        hook = make_guard(
            config["workdir"],
            network=config["network"],
            spawn=fork and (bool(iso.get("netns")) or config["network"]),
            fork=fork,
        )
        _report(config["report_fd"], {"isolation": iso})
        _close_descriptors(keep)
        set_dumpable(True)
    except Exception as error:  # setup failed: the program must not run unconfined
        print(f"modelbench sandbox setup failed: {error!r}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    return hook


def worker(config: dict[str, Any], iso: dict[str, Any]) -> NoReturn:
    """The process that becomes the program of a plain run (never returns)."""
    sys.addaudithook(confine(config, iso))
    try:
        candidate.run_program(os.path.join(config["workdir"], config["program"]))
        code = 0
    except SystemExit as error:
        code = candidate.exit_code(error)
    candidate.finish(code)


def _stop(pid: int, grace: float = 1.0) -> dict[str, int]:
    """The exit record of the program's process, which should end once its input ends;
    after ``grace`` seconds it is killed and the record says ``stopped``."""
    deadline = time.monotonic() + grace
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return _exit_record(status)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"stopped": 1}
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def init_judged(config: dict[str, Any], iso: dict[str, Any]) -> NoReturn:
    """PID 1 of a judged run: fork the program's process, judge it, report the verdict."""
    down_read, down_write = os.pipe()  # judge -> program
    up_read, up_write = os.pipe()  # program -> judge
    child = os.fork()
    if child == 0:  # the program's process: confined like worker(), the pipes its only descriptors
        os.close(down_write)
        os.close(up_read)
        sys.addaudithook(confine(config, iso, keep=(down_read, up_write)))
        path = os.path.join(config["workdir"], config["program"])
        candidate.serve(wire.Channel(down_read, up_write), path)
    os.close(down_read)
    os.close(up_write)
    fd = config["report_fd"]
    try:
        request = wire.Channel(fd, fd).receive()  # only now: the program's memory never held it
        set_process_limits(config["limits"])
        verdict = judge.run(request, judge.Program(wire.Channel(up_read, down_write)))
    except Exception as error:  # a malformed request, the judge's own failure: never a pass
        verdict = {"total": 0, "passed": 0, "failure": f"the judge failed: {error!r}", "calls": 0}
    os.close(down_write)  # the program's process sees the end of its input and exits
    _report(fd, {"verdict": verdict, "exit": _stop(child)})
    os._exit(0)


def init(config: dict[str, Any], iso: dict[str, Any]) -> None:
    """PID 1 of the new namespace (or a plain parent): set up mounts, reap, report."""
    fd = config["report_fd"]
    if iso.get("mountns"):
        try:
            iso.update(lock_filesystem(config["workdir"], config["home"]))
        except OSError as error:
            iso["readonly_fs"] = False
            iso["mount_error"] = str(error)
    if config.get("judged"):
        init_judged(config, iso)
    child = os.fork()
    if child == 0:
        worker(config, iso)
    while True:  # as PID 1 we also reap orphans; stop when the worker is done
        pid, status = os.wait()
        if pid == child:
            break
    _report(fd, {"exit": _exit_record(status)})
    os._exit(0)


def main() -> None:
    """Entry point of the launcher process (run by :mod:`pytest_modelbench.sandbox.boot`)."""
    config: dict[str, Any] = json.loads(sys.argv[1])
    iso: dict[str, Any] = {"cgroup": False}
    if config.get("cgroup_procs"):
        try:
            _write(config["cgroup_procs"], str(os.getpid()))
            iso["cgroup"] = True
        except OSError as error:
            iso["cgroup_error"] = str(error)
    if config["isolate"]:
        try:
            iso.update(unshare_namespaces(config["network"]))
        except OSError as error:
            iso["namespaces"] = str(error)
    set_dumpable(False)  # only now: writing the user namespace's maps needs a dumpable process
    child = os.fork()  # after CLONE_NEWPID only children enter the new namespace
    if child == 0:
        try:
            init(config, iso)
        finally:
            os._exit(SETUP_FAILED)
    os.close(config["report_fd"])  # PID 1 reports; this process must not hold the socket
    _, status = os.waitpid(child, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else SETUP_FAILED)
