"""Child side of the sandbox: isolate this process, then run one untrusted program.

Run in a fresh ``python -I -B`` by :mod:`pytest_modelbench.sandbox.boot` for
:mod:`pytest_modelbench.sandbox.host`. Standard library only (and the stdlib-only
siblings ``candidate``, ``judge``, ``namespaces`` and ``wire``). ``config["level"]``
says what isolates the program:

* ``bwrap``: bubblewrap has built the root and the namespaces; this process is PID 1
  in them, as the sandbox user, with no capabilities;
* ``namespaces``: :func:`pytest_modelbench.sandbox.namespaces.enter` builds the same
  root and namespaces (after joining the host-made cgroup);
* ``audit-hook``: nothing but rlimits and the Python audit hook (not a security
  boundary; the code suites refuse it unless the user opts in).

PID 1 then joins a fresh session keyring, checks what holds (new namespaces, a
private read-only ``/proc``, a read-only root without the host paths the host
named, the sandbox uid, no capabilities) and, for the first two levels, ends the
run as a setup failure if anything does not: a run is never silently weaker than
its level. The program's process sets rlimits (CPU, address space, file size,
open files, process count), drops every capability, installs a Python audit hook
(no sockets, no writes outside the working directory, no ``ctypes``; no process
spawning without a network namespace, no ``fork`` when nothing bounds the process
count), loads the host-built seccomp filter, reports the isolation (JSON lines on a
socket the host passed in: the record means "confined"), closes every descriptor but stdio
and runs the program.

Plain runs report the program's exit. Judged runs (``config["judged"]``) turn
PID 1 into :mod:`pytest_modelbench.sandbox.judge`: it forks the program's
process first, then reads the tests from the host, runs them against the
program over two pipes and reports the verdict. The launcher and the judge are
non-dumpable; only the program's process is made dumpable again.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from pytest_modelbench.sandbox import candidate, judge, namespaces, wire
from pytest_modelbench.sandbox.namespaces import SANDBOX_ID, SETUP_FAILED

FULL_LEVELS = ("bwrap", "namespaces")
CGROUP_VAR = "MODELBENCH_SANDBOX_CGROUP"  # set by the shell that starts bubblewrap (bwrap.JOIN)
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
KEYCTL_JOIN_SESSION_KEYRING = 1
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219, "loongarch64": 219}
SYS_KEYCTL.update({"ppc64le": 271, "ppc64": 271, "s390x": 280})
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts")
ST_RDONLY = 1

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
# ctypes reaches native code without loading a library (ctypes.pythonapi, CDLL(None) handles
# made before the hook): every foreign call, symbol lookup and raw memory access is refused
CTYPES_EVENTS = {
    "ctypes.dlopen",
    "ctypes.dlsym",
    "ctypes.dlsym/handle",
    "ctypes.call_function",
    "ctypes.cdata",
    "ctypes.cdata/buffer",
    "ctypes.addressof",
    "ctypes.string_at",
    "ctypes.wstring_at",
}
MAX_FD = 1 << 16  # descriptors above this are never open (RLIMIT_NOFILE is far lower)
SPAWN_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"}
FORK_EVENTS = {"os.fork", "os.forkpty"}
SIGNAL_EVENTS = {"os.kill", "os.killpg"}  # os.kill of the program's own processes: allowed
# a descriptor's owner is signalled when it is ready (with O_ASYNC): naming one is a signal to
# any process (seccomp.SIGNAL_OWNER_FCNTL and SIGNAL_OWNER_IOCTL, as the filter refuses them)
SIGNAL_OWNER = {"fcntl.fcntl": (8, 10, 15), "fcntl.ioctl": (0x8901, 0x8902)}


def drop_capabilities() -> bool:
    """No capabilities now or after exec, so the program cannot undo any isolation."""
    if not sys.platform.startswith("linux"):
        return False
    lib = namespaces.libc()
    lib.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    lib.prctl(namespaces.PR_CAP_AMBIENT, namespaces.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        lib.prctl(namespaces.PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails harmlessly without caps
    namespaces.clear_capabilities(lib)
    return namespaces.effective_capabilities() == 0


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_filter(program: bytes) -> bool:
    """Load a seccomp filter (BPF built on the host by
    :func:`pytest_modelbench.sandbox.seccomp.program_filter`) into this process and its
    future children; needs ``PR_SET_NO_NEW_PRIVS`` (set by :func:`drop_capabilities`)."""
    if not sys.platform.startswith("linux") or not program or len(program) % 8:
        return False
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    lib = namespaces.libc()
    return bool(lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0)


def set_dumpable(dumpable: bool) -> bool:
    """A non-dumpable process cannot be ptraced, and its ``/proc/PID/{mem,fd,environ}``
    stay closed to any process without ``CAP_SYS_PTRACE`` (the program has none)."""
    if not sys.platform.startswith("linux"):
        return False
    return bool(namespaces.libc().prctl(PR_SET_DUMPABLE, int(dumpable), 0, 0, 0) == 0)


def join_new_keyring() -> str:
    """A fresh anonymous session keyring: the caller's (inherited across fork and exec, and
    writable by whoever holds it) would carry keys from one run to the next."""
    number = SYS_KEYCTL.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return "unsupported"
    if namespaces.libc().syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
        return "private"
    return "unsupported" if ctypes.get_errno() == 38 else "shared"  # 38: ENOSYS, no keyrings


def observe(config: dict[str, Any]) -> dict[str, Any]:
    """What holds, as seen from inside: which namespaces are new (compared with the host's),
    whether ``/proc`` is private and read-only, the root read-only, host paths absent."""
    seen: dict[str, Any] = {}
    host = config.get("host_ns") or {}
    for name in NAMESPACES:
        try:
            inode = os.stat(f"/proc/self/ns/{name}").st_ino
        except OSError:
            inode = None
        seen[f"{name}ns" if name != "mnt" else "mountns"] = inode is not None and inode != host.get(
            name
        )
    try:
        own = int(os.readlink("/proc/self")) == os.getpid()
        seen["proc_readonly"] = bool(os.statvfs("/proc").f_flag & ST_RDONLY)
        seen["root_readonly"] = bool(os.statvfs("/").f_flag & ST_RDONLY)
    except (OSError, ValueError):
        own = False
    seen["private_proc"] = own and seen["pidns"]
    seen["uid"] = os.getuid()
    seen["host_paths_visible"] = [path for path in config["hidden"] if os.path.lexists(path)]
    return seen


def missing_isolation(config: dict[str, Any], iso: dict[str, Any]) -> list[str]:
    """What a full level requires and this run lacks (empty when everything holds)."""
    wanted = ["userns", "mountns", "pidns", "ipcns", "utsns", "private_proc", "proc_readonly"]
    wanted += ["root_readonly"] + ([] if config["network"] else ["netns"])
    missing = [name for name in wanted if not iso.get(name)]
    if iso.get("uid") != SANDBOX_ID:
        missing.append(f"uid {SANDBOX_ID} (is {iso.get('uid')})")
    if iso.get("host_paths_visible"):
        missing.append("hidden host paths: " + ", ".join(iso["host_paths_visible"][:3]))
    if iso.get("keyring") == "shared":
        missing.append("a private session keyring")
    if namespaces.effective_capabilities() != 0:
        missing.append("no capabilities")
    return missing


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


def set_process_limits(limits: dict[str, int], *, cpu: bool = True) -> None:
    """CPU time (unless not ``cpu``), address space, file size, open files, no core dumps."""
    import resource  # function-level: Unix only

    if cpu:
        _setrlimit(resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_seconds"] + 1)
    _setrlimit(resource.RLIMIT_AS, limits["memory_bytes"])
    _setrlimit(resource.RLIMIT_FSIZE, limits["file_size_bytes"])
    _setrlimit(resource.RLIMIT_NOFILE, limits["open_files"])
    _setrlimit(resource.RLIMIT_CORE, 0)


def set_limits(limits: dict[str, int], iso: dict[str, Any]) -> str:
    """Apply rlimits; return how the process count is bounded (cgroup/rlimit/guard)."""
    import resource  # function-level: Unix only

    set_process_limits(limits)
    if "pids" in iso.get("cgroup", []):
        return "cgroup"
    uid = os.getuid()
    if uid == 0:
        return "guard"  # RLIMIT_NPROC never binds uid 0 (only the audit-hook level runs as root)
    own = 0 if iso.get("userns") else _count_processes(uid)
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


def is_descendant(pid: object, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (followed through each
    process's parent in ``/proc``): at the audit-hook level the program shares the host's
    processes, and may signal only its own (not its judge, the host or other runs)."""
    if not isinstance(pid, int) or pid <= 0:
        return False  # 0 and negative numbers are process groups, or every process
    try:  # relative to /proc: the audit hook, which calls this, refuses /proc/PID paths
        proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    seen: set[int] = set()
    try:
        while pid > 1 and pid != ancestor and pid not in seen:
            seen.add(pid)
            fd = os.open(f"{pid}/stat", os.O_RDONLY, dir_fd=proc)
            try:
                stat = os.read(fd, 4096)
            finally:
                os.close(fd)
            pid = int(stat.rsplit(b")", 1)[1].split()[1])  # after "(comm) state": the parent
    except (OSError, ValueError, IndexError):
        return False
    finally:
        os.close(proc)
    return pid == ancestor


def _denied_event(
    event: str,
    args: tuple[Any, ...],
    network: bool,
    spawn: bool,
    fork: bool,
    own_proc: set[str],
    program: int,
) -> str | None:
    """What ``event`` would do that the policy forbids (writes aside), or None."""
    if event in NETWORK_EVENTS and not network:
        return f"network access ({event})"
    if event in CTYPES_EVENTS:
        return f"native code through ctypes ({event})"
    if event in SPAWN_EVENTS and not spawn:
        return f"starting programs ({event})"
    if event in FORK_EVENTS and not fork:
        return f"creating processes ({event})"
    if event in SIGNAL_EVENTS and (event != "os.kill" or not is_descendant(args[0], program)):
        return f"signalling processes other than its own ({event})"
    if (
        event in SIGNAL_OWNER
        and isinstance(args[1], int)
        and args[1] & 0xFFFFFFFF in SIGNAL_OWNER[event]
    ):
        return f"naming a process to signal ({event})"
    if event == "resource.prlimit" and args[0] not in (0, os.getpid()) and args[2] is not None:
        return f"changing another process's limits ({event})"
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
    program = os.getpid()  # the program's first process: it and its descendants may be signalled

    def inside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return True
        real = os.path.realpath(os.fsdecode(path))
        return any(real == root or real.startswith(root + os.sep) for root in allowed)

    def deny(what: str) -> None:
        raise PermissionError(f"modelbench sandbox: {what} is not allowed")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        denied = _denied_event(event, args, network, spawn, fork, own_proc, program)
        if denied is not None:
            deny(denied)
        for path in _modifies(event, args):
            if not inside(path):
                deny(f"writing outside the working directory ({os.fsdecode(path)})")

    return hook


def _refusing_posixsubprocess(hook: Callable[..., None]) -> Callable[..., None]:
    """``hook`` that also refuses importing ``_posixsubprocess``, whose ``fork_exec`` starts a
    program without any audit event (where no seccomp filter refuses ``execve``)."""

    def guarded(event: str, args: tuple[Any, ...]) -> None:
        if event == "import" and args and args[0] == "_posixsubprocess":
            raise PermissionError("modelbench sandbox: starting programs is not allowed")
        hook(event, args)

    return guarded


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
        nproc = set_limits(config["limits"], iso)
        iso["nproc"] = nproc
        iso["caps_dropped"] = drop_capabilities()
        fork = nproc != "guard"
        spawn = fork and (bool(iso.get("netns")) or config["network"])
        filters = config.get("seccomp") or {}
        bpf = filters.get("spawn" if spawn else "no_spawn")
        iso["seccomp"] = isinstance(bpf, str) and load_filter(bytes.fromhex(bpf))
        hook = make_guard(config["workdir"], network=config["network"], spawn=spawn, fork=fork)
        if not spawn and not iso["seccomp"]:  # nothing refuses execve: no fork_exec either
            hook = _refusing_posixsubprocess(hook)
        set_dumpable(True)
        # last: the host reads this record as "the program's process is confined", so a
        # failure before it is the sandbox's, and anything after it the program's
        _report(config["report_fd"], {"isolation": iso})
        _close_descriptors(keep)
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
    catch_no_signals()
    silence()  # the program's stdout and stderr are its own: the judge writes none of it
    fd = config["report_fd"]
    program = judge.Program(wire.Channel(up_read, down_write))
    try:
        request = wire.Channel(fd, fd).receive()  # only now: the program's memory never held it
        # no CPU limit of its own: the program could spend it by what it sends, and a judge
        # killed before it reports is the sandbox's failure; the host's wall clock bounds it
        set_process_limits(config["limits"], cpu=False)
        verdict = judge.run(request, program)
    except Exception as error:  # a malformed request, the judge's own failure: never a pass
        verdict = {"total": 0, "passed": 0, "failure": f"the judge failed: {error!r}", "calls": 0}
        verdict["judge_error"] = True
    program.hang_up()  # the program's process sees the end of its input and exits
    _report(fd, {"verdict": verdict, "exit": _stop(child)})
    os._exit(0)


def catch_no_signals() -> None:
    """Default actions for every signal this process catches (Python's ``SIGINT`` handler):
    as PID 1 of a PID namespace it then receives from inside only the signals it catches,
    none, so the program cannot end (or interrupt) its judge by any way of signalling."""
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)


def silence() -> None:
    """Point this process's stdout and stderr at ``/dev/null``: what it would print (the
    tests' tracebacks, a warning) goes to the host in the verdict, or nowhere, never into
    the files the program shares (which it may reopen through ``/proc/self/fd``)."""
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def init(config: dict[str, Any], iso: dict[str, Any]) -> NoReturn:
    """PID 1 of the sandbox (a plain parent at the audit-hook level): check what holds,
    then judge or run the program, reap, report."""
    set_dumpable(False)
    iso["keyring"] = join_new_keyring()
    iso.update(observe(config))
    if config["level"] in FULL_LEVELS:
        missing = missing_isolation(config, iso)
        if missing:
            namespaces.fail(f"{config['level']} did not provide " + "; ".join(missing))
    if config.get("judged"):
        init_judged(config, iso)
    child = os.fork()
    if child == 0:
        worker(config, iso)
    catch_no_signals()
    while True:  # as PID 1 we also reap orphans; stop when the worker is done
        pid, status = os.wait()
        if pid == child:
            break
    _report(config["report_fd"], {"exit": _exit_record(status)})
    os._exit(0)


def in_cgroups(name: str, count: int) -> bool:
    """Whether ``/proc/self/cgroup`` shows this process in a cgroup called ``name`` in
    ``count`` hierarchies (the check behind "limited for the whole program")."""
    with open("/proc/self/cgroup") as lines:
        return sum(line.rstrip("\n").endswith("/" + name) for line in lines) == count


def read_config(fd: int) -> dict[str, Any]:
    """The configuration the host wrote into the pipe ``fd`` (then closed: no process of the
    program's inherits it)."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    config: dict[str, Any] = json.loads(b"".join(chunks))
    return config


def main() -> None:
    """Entry point of the launcher process (run by :mod:`pytest_modelbench.sandbox.boot`)."""
    config = read_config(int(sys.argv[1]))
    iso: dict[str, Any] = {"level": config["level"], "cgroup": []}
    joined = os.environ.pop(CGROUP_VAR, None)  # bwrap: the shell that started it joined
    if joined == "1":
        iso["cgroup"] = config.get("cgroup_controllers") or []
    elif joined is not None:
        iso["cgroup_error"] = "the shell that starts bubblewrap is not in the run's cgroup"
    elif config.get("cgroup_procs") and config["level"] != "bwrap":
        try:
            for procs in config["cgroup_procs"]:
                namespaces.write_file(procs, str(os.getpid()))
            if not in_cgroups(config["cgroup_name"], len(config["cgroup_procs"])):
                raise OSError("/proc/self/cgroup does not show the run's cgroup")
            iso["cgroup"] = config.get("cgroup_controllers") or []
        except OSError as error:
            iso["cgroup_error"] = str(error)
    try:
        if config["level"] == "namespaces":
            root = os.geteuid() == 0
            namespaces.enter(config["network"], config["report_fd"])  # returns in PID 1
            iso.update(namespaces.build_root(config))
            namespaces.drop_privileges(setgroups=root)
            # started with -S (the host's site directories and .pth files are none of the
            # program's business, and cost start-up time): site's set-up, in the new root
            import site  # function-level: only now, with the root's (masked) site directories

            site.main()
        init(config, iso)
    except Exception as error:  # nothing of the program's has run: a setup failure
        namespaces.fail(repr(error))
