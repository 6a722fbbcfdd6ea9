"""Host side of the sandbox: spawn the launcher, enforce wall-clock time, classify the outcome.

Each execution gets a throw-away directory, a scrubbed environment (no API
keys: only PATH, HOME, TMPDIR and locale), output captured to files (bounded
by the file-size limit, so a chatty program cannot exhaust host memory), its
own pids cgroup where the host allows, and a wall-clock timeout after which
the whole process group, cgroup and PID namespace are killed. A semaphore
bounds how many executions run at once.

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
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_modelbench.sandbox.cgroups import PidsCgroup
from pytest_modelbench.sandbox.launcher import SETUP_FAILED

Status = Literal["passed", "failed", "timeout", "crashed"]
LAUNCHER = Path(__file__).with_name("boot.py")
WORKERS_VAR = "MODELBENCH_SANDBOX_WORKERS"
TOKEN_VAR = "MODELBENCH_SANDBOX_TOKEN"


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

    def for_launcher(self) -> dict[str, int]:
        return {
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_bytes,
            "max_processes": self.max_processes,
            "file_size_bytes": self.file_size_bytes,
            "open_files": self.open_files,
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
        return {"prelude": self.prelude, "cases": list(self.cases), "bind": list(self.bind)}


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
    tests: Mapping[str, int] = field(default_factory=dict)
    """Judged runs: ``total`` cases, how many ``passed``, the program ``calls`` they made."""

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


def _tail(path: Path, chars: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4 * chars))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def _receive_all(sock: socket.socket) -> bytes:
    """What the launcher's processes wrote (all of them have ended)."""
    sock.setblocking(False)
    chunks = []
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more was written
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    return b"".join(chunks)


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


def _wait_unreaped(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for the process to exit without reaping it (its group id stays ours); False on
    timeout. Platforms without ``waitid`` fall back to an ordinary, reaping wait."""
    pid = process.pid
    if not hasattr(os, "waitid"):
        try:
            process.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        pidfd = os.pidfd_open(pid)  # Linux >= 5.3: readable once the process has exited
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            ready, _, _ = select.select([pidfd], [], [], timeout)
            return bool(ready)
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def _sweep(token: str) -> None:
    """Kill leftovers that carry this execution's token (when no cgroup or PID namespace)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    for _ in range(20):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if needle in environ:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(int(entry), signal.SIGKILL)
        if not found:
            return
        time.sleep(0.02)


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


class Sandbox:
    """Runs untrusted Python programs, at most ``workers`` at a time."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        workers: int | None = None,
        allow_network: bool = False,
        isolate: bool = True,
        python: str | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.workers = workers or default_workers()
        self.allow_network = allow_network
        self.isolate = isolate
        self.python = python or sys.executable
        self._slots = threading.BoundedSemaphore(self.workers)

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
        with self._slots:
            return self._run(program, dict(files or {}), limits or self.limits, None)

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
        with self._slots:
            return self._run(program, dict(files or {}), limits or self.limits, tests)

    def run_many(self, programs: Sequence[str]) -> list[ExecutionResult]:
        """Run several programs concurrently (bounded by ``workers``), results in order."""
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(self.run, programs))

    def _env(self, workdir: Path, token: str) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            TOKEN_VAR: token,
        }

    def _config(
        self, workdir: Path, limits: SandboxLimits, cgroup: PidsCgroup | None, judged: bool
    ) -> dict[str, Any]:
        return {
            "workdir": str(workdir),
            "program": "program.py",
            "limits": limits.for_launcher(),
            "host_uid": os.geteuid(),
            "home": os.path.expanduser("~"),
            "network": self.allow_network,
            "isolate": self.isolate,
            "cgroup_procs": cgroup.procs_file if cgroup else None,
            "judged": judged,
        }

    def _launch(
        self, root: Path, config: dict[str, Any], token: str, request: bytes | None, wall: float
    ) -> tuple[bool, bytes]:
        """Start the launcher, hand the judge its request, wait for the end or the wall clock,
        kill what is left; whether it timed out, and what the launcher reported."""
        ours, theirs = socket.socketpair()  # a socket: no other process can reopen it via /proc
        config = {**config, "report_fd": theirs.fileno()}
        with ours, open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            start = time.monotonic()
            with theirs:
                process = subprocess.Popen(
                    [self.python, "-I", "-B", str(LAUNCHER), json.dumps(config)],
                    cwd=config["workdir"],
                    env=self._env(Path(config["workdir"]), token),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
            try:
                if request is not None:
                    with contextlib.suppress(OSError):  # the launcher died: no verdict follows
                        ours.settimeout(wall)
                        ours.sendall(request)
                left = max(0.0, wall - (time.monotonic() - start))
                timed_out = not _wait_unreaped(process, left)
            finally:
                _kill_group(process.pid)  # the unreaped leader keeps the group id ours
                process.wait()
            return timed_out, _receive_all(ours)

    def _run(
        self, program: str, files: dict[str, str], limits: SandboxLimits, tests: HiddenTests | None
    ) -> ExecutionResult:
        token = uuid.uuid4().hex
        with tempfile.TemporaryDirectory(
            prefix="modelbench-sandbox-", ignore_cleanup_errors=True
        ) as tmp:
            root = Path(tmp)
            workdir = _write_files(root / "work", {**files, "program.py": program})
            cgroup = (
                PidsCgroup.create(f"run-{token}", limits.max_processes) if self.isolate else None
            )
            config = self._config(workdir, limits, cgroup, judged=tests is not None)
            request = None if tests is None else (json.dumps(tests.request()) + "\n").encode()
            start = time.monotonic()
            try:
                timed_out, data = self._launch(root, config, token, request, limits.wall_seconds)
            finally:
                if cgroup is not None:
                    cgroup.destroy()
            duration = time.monotonic() - start
            isolation, exit_info, verdicts = _read_report(data)
            if cgroup is None and not isolation.get("pidns"):
                _sweep(token)
            stderr = _tail(root / "stderr", limits.tail_chars)
            stdout = _tail(root / "stdout", limits.tail_chars)
        if tests is None:
            status, reason, code = classify(timed_out, exit_info, stderr, limits)
            return ExecutionResult(status, reason, code, stdout, stderr, duration, isolation)
        verdict = valid_verdict(verdicts, len(tests.cases))
        status, reason, code = classify_judged(timed_out, verdict, exit_info, limits)
        counts = {k: verdict[k] for k in ("total", "passed", "calls")} if verdict else {}
        return ExecutionResult(status, reason, code, stdout, stderr, duration, isolation, counts)


def _write_files(workdir: Path, files: Mapping[str, str]) -> Path:
    """Create the working directory with ``files``; none may leave it."""
    workdir.mkdir()
    for name, text in files.items():
        target = (workdir / name).resolve()
        if workdir.resolve() not in target.parents:
            raise ValueError(f"sandbox file name {name!r} leaves the working directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return workdir


_default: list[Sandbox] = []
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    """The process-wide sandbox the code suites share (so ``workers`` bounds them all)."""
    with _default_lock:
        if not _default:
            _default.append(Sandbox())
        return _default[0]


def probe(sandbox: Sandbox | None = None) -> ExecutionResult:
    """Run a trivial program and return what isolation this host provides."""
    return (sandbox or default_sandbox()).run("print('ok')")
