"""Host side of the sandbox: choose the isolation level, spawn the launcher, enforce
wall-clock time, classify the outcome.

The level is the strongest this host provides, found once per :class:`Sandbox` by running a
trivial program: ``bwrap`` (bubblewrap), else ``namespaces`` (our own), else ``audit-hook``
(rlimits and the Python audit hook only: not a security boundary). Both full levels give the
program the same minimal root (:mod:`pytest_modelbench.sandbox.layout`) and fail a run
rather than run it with less. Each execution gets a throw-away directory, a scrubbed
environment (no API keys: only PATH, HOME, TMPDIR and locale), output captured to files
(bounded by the file-size limit, so a chatty program cannot exhaust host memory), at the
full levels a size-limited tmpfs working directory and its own cgroup (process count and
memory for the whole program) where the host allows, a seccomp filter where libseccomp is
available, and a wall-clock timeout after which the whole process group, cgroup and PID
namespace are killed. A semaphore bounds how many executions run at
once.

:meth:`Sandbox.run` judges a program by its exit code, which the program
controls. :meth:`Sandbox.run_tests` is for scoring untrusted code: the tests go
to :mod:`pytest_modelbench.sandbox.judge` over a Unix socket (which no other
process can reopen through ``/proc``), and only the judge's verdict on that
socket can make a run pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from pytest_modelbench.processes import kill_group
from pytest_modelbench.sandbox import bwrap
from pytest_modelbench.sandbox.cgroups import CONTROLLERS, ProgramCgroup, cgroup_base
from pytest_modelbench.sandbox.judge import guard_asserts
from pytest_modelbench.sandbox.layout import LayoutError, RootLayout, launcher_code, root_layout
from pytest_modelbench.sandbox.namespaces import (
    INSIDE_WORKDIR,
    SANDBOX_ID,
    SETUP_FAILED,
    SHM_BYTES,
)
from pytest_modelbench.sandbox.processes import (
    TOKEN_VAR,
    receive_all,
    sweep,
    tail,
    wait_unreaped,
)
from pytest_modelbench.sandbox.seccomp import program_filter

Status = Literal["passed", "failed", "timeout", "crashed"]
Level = Literal["bwrap", "namespaces", "audit-hook"]
LEVELS: tuple[Level, ...] = ("bwrap", "namespaces", "audit-hook")
FULL_LEVELS: tuple[Level, ...] = ("bwrap", "namespaces")
LAUNCHER = Path("pytest_modelbench", "sandbox", "boot.py")  # in launcher_code's copy
WORKERS_VAR = "MODELBENCH_SANDBOX_WORKERS"
ISOLATION_VAR = "MODELBENCH_SANDBOX_ISOLATION"
PROBE_PROGRAM = "print('ok')\n"
PROBE_LIMITS_WALL = 30.0
PIPE_BYTES = 1 << 16  # the launcher's configuration must fit in a pipe (written before it runs)
MACHINERY_RETRIES = 1  # a judged run the sandbox's machinery spoilt is run once more


class SandboxFailure(RuntimeError):
    """The sandbox's own machinery failed (its set-up, its launcher, the judge before it
    reported): nothing is known about the program, so the run is an error for the caller to
    retry or count, never a wrong answer."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one execution (each process gets the rlimits)."""

    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_bytes: int = 1 << 30
    max_processes: int = 32
    file_size_bytes: int = 16 << 20
    open_files: int = 256
    tail_chars: int = 2000
    work_bytes: int = 64 << 20
    """Size of the working directory at the full levels: a tmpfs in the sandbox's own mount
    namespace, gone with it (what a program writes never reaches the host's disk)."""

    def for_launcher(self) -> dict[str, int]:
        return {
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_bytes,
            "max_processes": self.max_processes,
            "file_size_bytes": self.file_size_bytes,
            "open_files": self.open_files,
            "work_bytes": self.work_bytes,
        }


@dataclass(frozen=True)
class HiddenTests:
    """Trusted test code for :meth:`Sandbox.run_tests`: run by the judge, never shown to the program.

    The judge executes ``prelude``, then each case in order in the same
    namespace; names the code uses but does not define (and every name in
    ``bind``, even one the prelude defines) are taken from the program, as
    plain values or as objects that can only be called and passed back.
    """

    cases: tuple[str, ...]
    """Test code, one unit per entry; the run passes only if every one completes."""
    prelude: str = ""
    """Trusted definitions the cases use (HumanEval's prompt helpers and ``check``)."""
    bind: tuple[str, ...] = ()
    """Names always taken from the program (the function under test)."""

    def request(self) -> dict[str, Any]:
        """What the judge receives: the code with every ``assert`` guarded, so that a failed
        one is counted and the tests go on (:func:`~pytest_modelbench.sandbox.judge.guard_asserts`)."""
        return {
            "prelude": guard_asserts(self.prelude),
            "cases": [guard_asserts(case) for case in self.cases],
            "bind": list(self.bind),
        }


@dataclass(frozen=True)
class ExecutionResult:
    """What happened to one program: status, why, and the tails of its output."""

    status: Status
    reason: str
    returncode: int | None
    stdout_tail: str
    stderr_tail: str
    duration_s: float
    isolation: Mapping[str, Any] = field(default_factory=dict)
    """What held, as the launcher saw it: ``level`` (``bwrap``, ``namespaces``,
    ``audit-hook``), each namespace, ``uid``, ``private_proc``, ``proc_readonly``, ..."""
    tests: Mapping[str, int] = field(default_factory=dict)
    """Judged runs: ``total`` cases, how many ``passed``, the program ``calls`` they made."""
    judge_tail: str = ""
    """Judged runs: the tracebacks of the first failed asserts, as the judge wrote them for
    the host (never to the program's stdout or stderr, which it may read back)."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["isolation"] = dict(self.isolation)
        data["tests"] = dict(self.tests)
        data["duration_s"] = round(self.duration_s, 3)
        return data


def default_workers() -> int:
    """Concurrent executions: ``$MODELBENCH_SANDBOX_WORKERS`` or half the CPUs (1..8)."""
    value = os.environ.get(WORKERS_VAR, "")
    if value.strip().isdigit() and int(value) > 0:
        return int(value)
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def machinery_failure(
    reported: bool,
    timed_out: bool,
    verdicts: Sequence[Any],
    verdict: Mapping[str, Any] | None,
    stderr: str,
) -> str | None:
    """Why a judged run says nothing about the program, or None when it does.

    Only the sandbox writes on the report socket: the isolation record once the program's
    process is confined (before any of the program's code runs), then the judge's verdict.
    No record: the set-up failed. A record and no well-formed verdict without a timeout: the
    judge (PID 1 of the sandbox, which no process of the program's can signal) ended before
    it reported. A verdict marked ``judge_error``: the judge could not run the tests."""
    if not reported:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        return "the sandbox was not set up: " + (lines[-1] if lines else "no output")[:300]
    if timed_out:
        return None
    for raw in verdicts:  # the judge's own error comes in a verdict without tests
        if isinstance(raw, Mapping) and raw.get("judge_error"):
            return f"the sandbox's judge could not run the tests: {raw.get('failure')}"[:400]
    if verdict is None:
        count = len(verdicts)
        return f"the sandbox's judge ended before it reported ({count} verdicts)"
    if verdict.get("judge_error"):
        return f"the sandbox's judge could not run the tests: {verdict['failure']}"[:400]
    return None


def _read_report(data: bytes) -> tuple[dict[str, Any], dict[str, int] | None, list[Any]]:
    """The launcher's records: the isolation that held, how the program ended, verdicts."""
    isolation: dict[str, Any] = {}
    exit_info: dict[str, int] | None = None
    verdicts: list[Any] = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        isolation = record.get("isolation", isolation)
        exit_info = record.get("exit", exit_info)
        if "verdict" in record:
            verdicts.append(record["verdict"])
    return isolation, exit_info, verdicts


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signalled(number: int, limits: SandboxLimits) -> tuple[Status, str, int]:
    name = _signal_name(number)
    if number == signal.SIGXCPU or number == signal.SIGKILL:
        return "timeout", f"CPU-time limit of {limits.cpu_seconds}s exceeded ({name})", -number
    if number == signal.SIGXFSZ:
        return "crashed", f"file-size limit exceeded ({name})", -number
    return "crashed", f"killed by {name}", -number


def classify(
    timed_out: bool, exit_info: Mapping[str, int] | None, stderr: str, limits: SandboxLimits
) -> tuple[Status, str, int | None]:
    """Map the raw outcome to passed/failed/timeout/crashed and a one-line reason."""
    if timed_out:
        return "timeout", f"wall-clock limit of {limits.wall_seconds:g}s exceeded", None
    if exit_info is None:
        return "crashed", "the sandbox launcher died before reporting", None
    if "signal" in exit_info:
        return _signalled(exit_info["signal"], limits)
    code = exit_info.get("code", SETUP_FAILED)
    if code == 0:
        return "passed", "exit code 0", 0
    if code == SETUP_FAILED:
        return "crashed", "sandbox setup failed: " + stderr.strip()[-300:], code
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit code {code}"
    return "failed", last[:300], code


def valid_verdict(verdicts: Sequence[Any], total: int) -> dict[str, Any] | None:
    """The judge's one verdict on ``total`` cases, or None if there is not exactly one
    well-formed verdict (a launcher that died, or anything else, never passes)."""
    if len(verdicts) != 1 or not isinstance(verdicts[0], dict):
        return None
    verdict = verdicts[0]
    counts = [verdict.get(key) for key in ("total", "passed", "calls")]
    if not all(type(count) is int and count >= 0 for count in counts):
        return None
    failure = verdict.get("failure")
    if verdict["total"] != total or not (failure is None or isinstance(failure, str)):
        return None
    if not isinstance(verdict.get("output", ""), str):
        return None
    return verdict


def classify_judged(
    timed_out: bool,
    verdict: Mapping[str, Any] | None,
    exit_info: Mapping[str, int] | None,
    limits: SandboxLimits,
) -> tuple[Status, str, int | None]:
    """Passed only when the judge saw every case complete; otherwise why not."""
    code = exit_info.get("code") if exit_info else None
    if timed_out:
        return "timeout", f"wall-clock limit of {limits.wall_seconds:g}s exceeded", None
    if verdict is not None and verdict["failure"] is None and verdict["passed"] == verdict["total"]:
        return "passed", f"{verdict['total']} of {verdict['total']} tests passed", code
    if exit_info is not None and "signal" in exit_info:
        return _signalled(exit_info["signal"], limits)
    if code == SETUP_FAILED:
        return "crashed", "sandbox setup failed: see the stderr tail", code
    if verdict is None:
        return "crashed", "the sandbox's judge died before reporting", code
    return "failed", str(verdict["failure"] or "not every test passed")[:300], code


def _pipe_holding(config: dict[str, Any]) -> int:
    """A pipe's read end holding ``config`` as JSON (not the command line, which every
    process in the sandbox can read in ``/proc/1/cmdline``)."""
    data = json.dumps(config).encode()
    if len(data) >= PIPE_BYTES:
        raise ValueError(f"the launcher's configuration is too large ({len(data)} bytes)")
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def host_namespaces() -> dict[str, int]:
    """Inode numbers of this process's namespaces (the launcher checks that its own differ)."""
    found = {}
    for name in ("user", "mnt", "pid", "net", "ipc", "uts"):
        with contextlib.suppress(OSError):
            found[name] = os.stat(f"/proc/self/ns/{name}").st_ino
    return found


def _give_to_sandbox_user(root: Path, workdir: Path) -> None:
    """As root: the sandbox user owns the working directory and may pass through ``root``."""
    root.chmod(0o711)
    for folder, _, names in os.walk(workdir):
        os.chown(folder, SANDBOX_ID, SANDBOX_ID)
        for name in names:
            os.chown(os.path.join(folder, name), SANDBOX_ID, SANDBOX_ID)


class Sandbox:
    """Runs untrusted Python programs, at most ``workers`` at a time.

    ``isolation`` is ``auto`` (the strongest level this host provides, found on first use)
    or one level to use as is: ``bwrap``, ``namespaces`` (a run fails as a setup failure if
    the level cannot be set up) or ``audit-hook`` (no OS isolation; tests and measurements).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        workers: int | None = None,
        allow_network: bool = False,
        isolation: str = "auto",
        python: str | None = None,
    ) -> None:
        if isolation != "auto" and isolation not in LEVELS:
            raise ValueError(f"isolation must be auto or one of {', '.join(LEVELS)}: {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.workers = workers or default_workers()
        self.allow_network = allow_network
        self.requested = isolation
        self.python = python or sys.executable
        self.unavailable: dict[str, str] = {}
        """Why each stronger level was not used (filled when ``auto`` chooses)."""
        self._level: Level | None = None if isolation == "auto" else cast(Level, isolation)
        self._level_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(self.workers)
        self._joined_lock = threading.Lock()
        self._joined: dict[Level, dict[str, bool]] = {}
        """Per full level and controller: whether every run so far was inside its cgroup
        with it (as the launcher or the shell before bubblewrap checked)."""

    @property
    def level(self) -> Level:
        """The isolation level runs get (chosen on first use when ``auto``)."""
        with self._level_lock:
            if self._level is None:
                self._level = self._choose()
            return self._level

    def describe(self) -> dict[str, Any]:
        """The isolation level as a record for summaries: level, whether it is full, the
        interpreter, and why stronger levels were not available."""
        level = self.level
        info: dict[str, Any] = {"isolation": level, "full": level in FULL_LEVELS}
        if level in FULL_LEVELS:
            info["python"] = self._layout().interpreter
        info["limits"] = self.stated_limits(level)
        if self.unavailable:
            info["unavailable"] = dict(self.unavailable)
        return info

    def stated_limits(self, level: Level) -> dict[str, Any]:
        """The limits a run gets at ``level``, and what each one binds (the CPU time is each
        suite's own, per program)."""
        limits = self.limits
        stated: dict[str, Any] = {
            "memory_bytes": limits.memory_bytes,
            "processes": limits.max_processes,
            "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files,
            "wall_seconds": limits.wall_seconds,
        }
        stated["seccomp"] = self._seccomp() is not None
        whole = level in FULL_LEVELS
        joined = self._joined_cgroups(level) if whole else {}
        for limit, controller in (("memory", "memory"), ("processes", "pids")):
            scope = "per process"
            if joined.get(controller):
                scope = "whole program (cgroup)"
            elif whole and cgroup_base(controller) is not None:
                scope += " (the run's cgroup could not be joined)"
            stated[f"{limit}_scope"] = scope
        if whole:
            stated["work_bytes"] = limits.work_bytes  # a tmpfs: the whole program's disk
            stated["shm_bytes"] = SHM_BYTES
        return stated

    def _joined_cgroups(self, level: Level) -> dict[str, bool]:
        """Per controller, whether every run at ``level`` so far was verified inside its
        cgroup (a trivial program is run first when none has been)."""
        with self._joined_lock:
            known = level in self._joined
        if not known:
            limits = SandboxLimits(cpu_seconds=10, wall_seconds=PROBE_LIMITS_WALL)
            with self._slots:
                self._run(level, PROBE_PROGRAM, {}, limits, None)
        with self._joined_lock:
            return dict(self._joined.get(level, {}))

    def _note_cgroup(self, level: Level, isolation: Mapping[str, Any]) -> None:
        """Remember whether a run at a full level was inside its cgroup, per controller."""
        inside = isolation.get("cgroup") or []
        with self._joined_lock:
            joined = self._joined.setdefault(level, {})
            for controller in CONTROLLERS:
                joined[controller] = joined.get(controller, True) and controller in inside

    def _choose(self) -> Level:
        for level in FULL_LEVELS:
            reason = self.unusable(level)
            if reason is None:
                return level
            self.unavailable[level] = reason
        return "audit-hook"

    def unusable(self, level: Level) -> str | None:
        """Why ``level`` cannot be used here (None: a trivial program ran with it)."""
        if not sys.platform.startswith("linux"):
            return "needs Linux"
        if level == "bwrap" and bwrap.find_bwrap() is None:
            return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        limits = SandboxLimits(cpu_seconds=10, wall_seconds=PROBE_LIMITS_WALL)
        try:
            result = self._run(level, PROBE_PROGRAM, {}, limits, None)
        except LayoutError as error:
            return str(error)
        if result.passed:
            return None
        lines = [line.strip() for line in result.stderr_tail.splitlines() if line.strip()]
        return f"{result.reason}: {lines[-1] if lines else 'no output'}"[:400]

    def _layout(self) -> RootLayout:
        return root_layout(self.python)

    def run(
        self,
        program: str,
        *,
        files: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
    ) -> ExecutionResult:
        """Run ``program`` (Python source) as ``program.py`` in a fresh directory; it passes
        if it exits with 0, which the program controls (score untrusted code with
        :meth:`run_tests`)."""
        level = self.level
        with self._slots:
            return self._run(level, program, dict(files or {}), limits or self.limits, None)

    def run_tests(
        self,
        program: str,
        tests: HiddenTests,
        *,
        files: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
    ) -> ExecutionResult:
        """Run ``program`` and judge it with ``tests``: it passes only if the judge, which
        never runs the program's code, saw every case complete (see :mod:`.judge`)."""
        if not tests.cases:
            raise ValueError("HiddenTests need at least one case (a run without any would pass)")
        level = self.level
        for _ in range(1 + MACHINERY_RETRIES):
            with self._slots:
                result = self._run(level, program, dict(files or {}), limits or self.limits, tests)
            failure = result.isolation.get("machinery_failure")
            if failure is None:
                return result
        raise SandboxFailure(f"{failure} (tried {1 + MACHINERY_RETRIES} times)")

    def run_many(self, programs: Sequence[str]) -> list[ExecutionResult]:
        """Run several programs concurrently (bounded by ``workers``), results in order."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(self.run, programs))

    def _env(self, workdir: str, token: str) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            TOKEN_VAR: token,
        }

    def _config(
        self, level: Level, workdir: Path, limits: SandboxLimits, judged: bool
    ) -> dict[str, Any]:
        config: dict[str, Any] = {
            "level": level,
            "workdir": str(workdir),
            "program": "program.py",
            "limits": limits.for_launcher(),
            "network": self.allow_network,
            "judged": judged,
            "host_ns": host_namespaces(),
            "hidden": [],
            "seccomp": self._seccomp(),
        }
        if level in FULL_LEVELS:
            layout = self._layout()
            config.update(workdir=INSIDE_WORKDIR, hidden=list(layout.hidden))
            if level == "namespaces":
                config.update(host_workdir=str(workdir), layout=layout.for_launcher())
                config["root_dir"] = str(workdir.parent / "root")
        return config

    @staticmethod
    def _seccomp() -> dict[str, str] | None:
        """The program's seccomp filters (with and without ``execve``) for the launcher, or
        None where libseccomp is not available."""
        spawn, no_spawn = program_filter(spawn=True), program_filter(spawn=False)
        if spawn is None or no_spawn is None:
            return None
        return {"spawn": spawn.hex(), "no_spawn": no_spawn.hex()}

    def _cgroup(self, level: Level, token: str, limits: SandboxLimits) -> ProgramCgroup | None:
        """The run's own cgroup at the full levels where the host allows one: the launcher
        joins it (``namespaces``), or this process moves the shell that starts bubblewrap into
        it (``bwrap``: as the sandbox user it could not move itself out of root's cgroup on
        cgroup v2); each checks ``/proc/self/cgroup`` before the program starts."""
        if level not in FULL_LEVELS:
            return None
        return ProgramCgroup.create(f"run-{token}", limits.max_processes, limits.memory_bytes)

    def _command(
        self, level: Level, config_fd: int, workdir: Path, limits: SandboxLimits
    ) -> tuple[list[str], dict[str, Any], list[int]]:
        """The launcher's command line (its configuration comes on ``config_fd``), how to
        start it, at ``level``, and the descriptors it inherits besides (the working
        directory's files, which bubblewrap copies into the sandbox's tmpfs)."""
        if level == "bwrap":
            found = bwrap.find_bwrap() or "bwrap"
            layout = self._layout()  # before opening the files: a LayoutError leaks nothing
            files = bwrap.work_files(str(workdir))
            try:
                argv = bwrap.command(
                    found, layout, files, config_fd, network=self.allow_network,
                    work_bytes=limits.work_bytes,
                )  # fmt: skip
            except BaseException:
                for fd, _ in files:
                    if fd >= 0:
                        os.close(fd)
                raise
            return argv, {"cwd": "/", **bwrap.popen_options()}, [fd for fd, _ in files if fd >= 0]
        if level == "namespaces":  # site runs once the root is built (see launcher.main)
            argv = [self._layout().interpreter, "-I", "-S", "-B"]
        else:
            argv = [self.python, "-I", "-B"]
        try:
            boot = Path(launcher_code(self.python)) / LAUNCHER
        except LayoutError:
            if level != "audit-hook":
                raise
            boot = Path(__file__).with_name("boot.py")  # compiled on every run, but it runs
        return [*argv, str(boot), str(config_fd)], {"cwd": str(workdir)}, []

    def _launch(
        self,
        level: Level,
        root: Path,
        config: dict[str, Any],
        token: str,
        request: bytes | None,
        limits: SandboxLimits,
    ) -> tuple[bool, bytes]:
        """Start the launcher, hand the judge its request, wait for the end or the wall clock,
        kill what is left; whether it timed out, and what the launcher reported."""
        ours, theirs = socket.socketpair()  # a socket: no other process can reopen it via /proc
        config_fd = _pipe_holding({**config, "report_fd": theirs.fileno()})
        joins = config["cgroup_procs"] if level == "bwrap" else []
        try:
            argv, options, inherited = self._command(level, config_fd, root / "work", limits)
            if joins:
                argv = bwrap.joining(len(joins), config["cgroup_name"], argv)
        except BaseException:
            os.close(config_fd)
            raise
        with ours, open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            start = time.monotonic()
            try:
                with theirs:
                    process = subprocess.Popen(
                        argv,
                        env=self._env(config["workdir"], token),
                        stdin=subprocess.PIPE if joins else subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        pass_fds=(theirs.fileno(), config_fd, *inherited),
                        start_new_session=True,
                        **options,
                    )
            finally:
                for fd in (config_fd, *inherited):
                    os.close(fd)
            try:
                if joins:
                    _move_into(process, joins)
                if request is not None:
                    with contextlib.suppress(OSError):  # the launcher died: no verdict follows
                        ours.settimeout(limits.wall_seconds)
                        ours.sendall(request)
                left = max(0.0, limits.wall_seconds - (time.monotonic() - start))
                timed_out = not wait_unreaped(process, left)
            finally:
                kill_group(process.pid)  # the unreaped leader keeps the group id ours
                process.wait()
            return timed_out, receive_all(ours)

    def _run(
        self,
        level: Level,
        program: str,
        files: dict[str, str],
        limits: SandboxLimits,
        tests: HiddenTests | None,
    ) -> ExecutionResult:
        token = uuid.uuid4().hex
        with _scratch() as root:
            workdir = _write_files(root / "work", {**files, "program.py": program})
            config = self._config(level, workdir, limits, judged=tests is not None)
            if level == "namespaces":
                (root / "root").mkdir()
            if level in FULL_LEVELS and os.geteuid() == 0:
                _give_to_sandbox_user(root, workdir)
            cgroup = self._cgroup(level, token, limits)
            config["cgroup_procs"] = cgroup.procs_files if cgroup else []
            config["cgroup_name"] = cgroup.name if cgroup else ""
            config["cgroup_controllers"] = list(cgroup.controllers) if cgroup else []
            request = None if tests is None else (json.dumps(tests.request()) + "\n").encode()
            start = time.monotonic()
            oom_kills = 0
            try:
                timed_out, data = self._launch(level, root, config, token, request, limits)
            finally:
                if cgroup is not None:
                    oom_kills = cgroup.oom_kills()
                    cgroup.destroy()
            duration = time.monotonic() - start
            isolation, exit_info, verdicts = _read_report(data)
            reported = bool(isolation)  # sent once the program's process is confined
            if reported and level in FULL_LEVELS:
                self._note_cgroup(level, isolation)
            isolation.setdefault("level", level)
            if oom_kills:
                isolation["oom_kills"] = oom_kills
            if not isolation.get("cgroup") and not isolation.get("pidns"):
                sweep(token)
            stderr = tail(root / "stderr", limits.tail_chars)
            stdout = tail(root / "stdout", limits.tail_chars)
        if tests is None:
            status, reason, code = classify(timed_out, exit_info, stderr, limits)
            if oom_kills and status != "passed":
                status, reason = "crashed", _out_of_memory(limits, oom_kills)
            return ExecutionResult(status, reason, code, stdout, stderr, duration, isolation)
        verdict = valid_verdict(verdicts, len(tests.cases))
        status, reason, code = classify_judged(timed_out, verdict, exit_info, limits)
        if oom_kills and status != "passed":  # the judge too, maybe: the program's memory
            status, reason = "crashed", _out_of_memory(limits, oom_kills)
        else:
            failure = machinery_failure(reported, timed_out, verdicts, verdict, stderr)
            if failure is not None:
                isolation["machinery_failure"] = failure
        counts = {k: verdict[k] for k in ("total", "passed", "calls")} if verdict else {}
        judged = str(verdict.get("output", ""))[-limits.tail_chars :] if verdict else ""
        return ExecutionResult(
            status, reason, code, stdout, stderr, duration, isolation, counts, judged
        )


def _move_into(process: subprocess.Popen[bytes], procs_files: Sequence[str]) -> None:
    """Move the shell that starts bubblewrap into the run's cgroups (this process may, where
    the sandbox user could not on cgroup v2), then let it go on; it checks where it is."""
    for path in procs_files:
        with contextlib.suppress(OSError):
            Path(path).write_text(str(process.pid))
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.write(b"go\n")
            process.stdin.close()


def _out_of_memory(limits: SandboxLimits, kills: int) -> str:
    return (
        f"memory limit of {limits.memory_bytes} bytes for the whole program exceeded "
        f"({kills} processes killed)"
    )


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh host folder for one execution, removed afterwards whatever the program left
    in it (:func:`remove_tree`): a clean-up never fails because of the program."""
    root = Path(tempfile.mkdtemp(prefix="modelbench-sandbox-"))
    try:
        yield root
    finally:
        remove_tree(root)


def remove_tree(top: Path) -> None:
    """Remove ``top`` and everything under it without recursion, whatever a program left:
    any depth (each directory's entries are moved up to ``top``, so no path grows), folders
    without permissions (made accessible first), symbolic links (never followed). Never
    raises: what cannot be removed (another mount) is left."""
    try:
        shutil.rmtree(top)  # the usual case: quick
        return
    except (OSError, RecursionError):
        pass
    moved = 0
    with contextlib.suppress(OSError):
        os.chmod(top, 0o700)
    while True:
        try:
            entries = list(os.scandir(top))
        except OSError:
            break
        progress = False
        for entry in entries:
            try:
                if not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.path)
                    progress = True
                    continue
                os.chmod(entry.path, 0o700)
                for name in os.listdir(entry.path):
                    while os.path.lexists(top / f".rm{moved}"):
                        moved += 1
                    os.rename(os.path.join(entry.path, name), top / f".rm{moved}")
                os.rmdir(entry.path)
                progress = True
            except OSError:
                continue
        if not entries or not progress:
            break
    with contextlib.suppress(OSError):
        os.rmdir(top)


def _write_files(workdir: Path, files: Mapping[str, str]) -> Path:
    """Create the working directory with ``files``; none may leave it."""
    workdir.mkdir()
    for name, text in files.items():
        target = (workdir / name).resolve()
        if workdir.resolve() not in target.parents:
            raise ValueError(f"sandbox file name {name!r} leaves the working directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        # a lone surrogate (a reply's broken text) as its escape: a string literal keeps it,
        # anywhere else the program fails to compile, as it would have
        target.write_text(text, encoding="utf-8", errors="backslashreplace")
    return workdir


_default: list[Sandbox] = []
_default_lock = threading.Lock()


def default_isolation() -> str:
    """``$MODELBENCH_SANDBOX_ISOLATION`` (auto, bwrap, namespaces, audit-hook) or auto; a
    value that is none of them warns and is ignored."""
    value = os.environ.get(ISOLATION_VAR, "").strip().lower()
    if value and value != "auto" and value not in LEVELS:
        warnings.warn(
            f"{ISOLATION_VAR}={value!r} is not auto, {', '.join(LEVELS)}: using auto",
            stacklevel=2,
        )
        return "auto"
    return value or "auto"


def default_sandbox() -> Sandbox:
    """The process-wide sandbox the code suites share (so ``workers`` bounds them all)."""
    with _default_lock:
        if not _default:
            _default.append(Sandbox(isolation=default_isolation()))
        return _default[0]


def probe(sandbox: Sandbox | None = None) -> ExecutionResult:
    """Run a trivial program and return what isolation this host provides."""
    return (sandbox or default_sandbox()).run("print('ok')")
