"""A server child process in its own process group, with a log file, a health wait and a watchdog.

Engine-independent: :class:`ServerProcess` starts whatever command it is given on a free
loopback port, appends its output to a log file, waits until a readiness probe passes, and
stops the *whole process group* (SIGTERM, then SIGKILL). A watchdog process
(:mod:`pytest_modelbench.serving.watchdog`) kills the group if this process dies without
stopping it, e.g. when pytest is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from pytest_modelbench.processes import terminate_group
from pytest_modelbench.running import blocking
from pytest_modelbench.secrets import masked_argv
from pytest_modelbench.serving.base import ServerStartError

__all__ = [
    "ServerProcess",
    "ctrl_c_raises",
    "death_cause",
    "free_port",
    "log_tail",
    "port_is_free",
]

LOG_TAIL_LINES = 40
_PORT_IN_USE = ("Address already in use", "[Errno 98]", "address already in use")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now (the OS picks it); the server binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Could a server bind ``port`` now? (SO_REUSEADDR, as servers set it: TIME_WAIT is fine.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def log_tail(
    path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64 * 1024, start: int = 0
) -> str:
    """The last ``lines`` lines of a log file from byte ``start`` on (one start's lines in a
    log that later starts and sessions append to); empty if it does not exist."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, start if start <= size else 0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


# "(EngineCore pid=7) ERROR 11-24 04:14:22 [core.py:1512] RuntimeError: ..." or a bare traceback line
_LOG_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s+)?"
    r"(?:(?:ERROR|CRITICAL|WARNING|INFO|DEBUG)\s+\d\d-\d\d\s+[\d:.]+\s+\[[^\]]*\]\s+)?"
)
_EXCEPTION_LINE = re.compile(r"((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit)): (\S.*)$")
# argparse's refusal, the last line a server prints for a flag it does not know:
# "usage: ...\nllama-server: error: unrecognized arguments: --bogus"
_USAGE_ERROR = re.compile(r"^\S[^:]{0,200}: (error): (\S.*)$")
CAUSE_MAX_CHARS = 300


def death_cause(log_text: str, wrappers: Sequence[str] = ()) -> str | None:
    """The root exception in a dead server's log tail (``RuntimeError: CPU Generator does not
    use offset``): the first exception line that is not one of ``wrappers`` (exception names or
    message fragments of errors that only report another's death), else the last wrapper."""
    found: list[str] = []
    usage = False  # argparse prints "usage: ..." before its "prog: error: ..." line
    for raw in log_text.splitlines():
        line = _LOG_PREFIX.sub("", raw.strip(), count=1)
        usage = usage or line.startswith("usage:")
        match = _EXCEPTION_LINE.match(line) or (_USAGE_ERROR.match(line) if usage else None)
        if match is None:
            continue
        name, message = match[1].rsplit(".", 1)[-1], match[2].strip()
        text = f"{name}: {message}"
        if text not in found:
            found.append(text)
    roots = [t for t in found if not any(w in t for w in wrappers)]
    cause = roots[0] if roots else (found[-1] if found else None)
    if cause is not None and len(cause) > CAUSE_MAX_CHARS:
        cause = cause[: CAUSE_MAX_CHARS - 1] + "…"
    return cause


ReadyProbe = Callable[[str], bool]


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """While a blocking wait runs, SIGINT raises KeyboardInterrupt in it (Python's default).

    ``asyncio.run`` replaces that handler with one that cancels its main task, which happens
    only at the next ``await``: a server start inside the item's event loop would ignore
    Ctrl-C until the server is ready (up to its start timeout). Outside the main thread, or
    where SIGINT is ignored on purpose, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, signal.default_int_handler, None):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def health_probe(root_url: str) -> bool:
    """Ready when ``GET /health`` answers 200."""
    result = blocking.get(f"{root_url}/health")
    return result is not None and result[0] == 200


class ServerProcess:
    """One HTTP server in a new process group on 127.0.0.1, followed by a watchdog."""

    def __init__(
        self,
        argv_for_port: Callable[[int], Sequence[str]],
        *,
        env: Mapping[str, str],
        log_path: Path,
        ready: ReadyProbe = health_probe,
        label: str = "server",
        host: str = "127.0.0.1",
        scheme: str = "http",
        stop_grace_s: float = 15.0,
        watchdog: bool = True,
        poll_interval_s: float = 0.25,
        wrappers: Sequence[str] = (),
    ) -> None:
        """``scheme``: ``https`` for a server that serves TLS (the probe brings its context);
        ``wrappers``: log errors that only report another's death (see :func:`death_cause`)."""
        self._argv_for_port = argv_for_port
        self.env = dict(env)
        self.log_path = Path(log_path)
        self._ready = ready
        self.label = label
        self.host = host
        self.scheme = scheme
        self.stop_grace_s = stop_grace_s
        self._use_watchdog = watchdog
        self._poll_s = poll_interval_s
        self.wrappers = tuple(wrappers)
        self.log_start = 0  # where this start's lines begin in the (appended) log
        self.port: int | None = None
        self.argv: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._cancel_lock = threading.Lock()
        self._cancelled = False

    # -- public -------------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop it and never start it again, even when a start is under way in another
        thread (a replica given up): a start after this raises :class:`ServerStartError`."""
        with self._cancel_lock:
            self._cancelled = True
        self.stop(grace_s=min(self.stop_grace_s, 5.0))

    @property
    def root_url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.label} has not been started")
        here = "127.0.0.1" if self.host == "0.0.0.0" else self.host  # listens everywhere
        return f"{self.scheme}://{here}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        """The server's process group id (equal to its pid: it leads a new session)."""
        return self.pid

    @property
    def watchdog_pid(self) -> int | None:
        return self._watchdog.pid if self._watchdog is not None else None

    def command_line(self) -> str:
        """The last command, as a copy-pasteable shell line (with the variables that matter)."""
        shown = {k: v for k, v in self.env.items() if _shown_env(k) and os.environ.get(k) != v}
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(shown.items()))
        return (prefix + " " if prefix else "") + shlex.join(masked_argv(self.argv))

    def start(self, deadline_s: float, port: int | None = None) -> None:
        """Start and wait up to ``deadline_s`` seconds until ready; on failure stop and raise.

        Ctrl-C stops the starting server (its whole process group) and raises at once, even
        when this runs inside an event loop, whose own SIGINT handler would wait for an await.
        """
        if self.is_alive():
            raise RuntimeError(f"{self.label} is already running (pid {self.pid})")
        tries = 2  # a lost race for the port is retried once, on a fresh free port
        try:
            with ctrl_c_raises():
                for attempt in range(tries):
                    self.port = port if port is not None and attempt == 0 else free_port(self.host)
                    try:
                        self._launch()
                        self._wait_ready(deadline_s)
                        return
                    except ServerStartError:
                        self.stop()  # a probe that refused a live server: it goes before a retry
                        this_start = log_tail(self.log_path, 15, start=self.log_start)
                        port_lost = any(s in this_start for s in _PORT_IN_USE)
                        if not (port_lost and attempt + 1 < tries):
                            raise
        except KeyboardInterrupt:
            pid = self.pid
            self.stop(grace_s=min(self.stop_grace_s, 1.0))  # the user is waiting: SIGKILL soon
            raise KeyboardInterrupt(
                f"{self.label} (pid {pid}) was starting; stopped it and its process group "
                f"(log: {self.log_path})"
            ) from None
        except Exception:
            self.stop()  # whatever failed (an odd probe answer too), the engine does not outlive it
            raise

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def is_ready(self) -> bool:
        return self.is_alive() and self._ready(self.root_url)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the whole process group (idempotent); then the watchdog."""
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate_group(
                proc.pid, self.stop_grace_s if grace_s is None else grace_s, leader=proc
            )
            self._note(f"stopped (exit code {proc.poll()})")
        self._stop_watchdog()

    # -- internals ----------------------------------------------------------------------

    def _launch(self) -> None:
        assert self.port is not None
        self.argv = [str(a) for a in self._argv_for_port(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            self.log_start = self.log_path.stat().st_size
        self._note(f"starting: {self.command_line()}")
        with open(self.log_path, "ab") as log, self._cancel_lock:
            if self._cancelled:
                raise ServerStartError(f"{self.label} was stopped while starting")
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stop() kills all of it
                    close_fds=True,
                )
            except OSError as exc:  # not a file-system failure of the run: the program
                raise ServerStartError(_cannot_run(self.label, self.argv[0], exc)) from None
        if self._use_watchdog:
            self._start_watchdog(self._proc.pid)

    def _wait_ready(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while True:
            if self._proc is None:  # stopped from another thread (a replica given up)
                self._stop_watchdog()  # it may have started after that stop
                raise ServerStartError(f"{self.label} was stopped while starting")
            code = self.returncode()
            if code is not None:
                self.stop()
                raise self._failure(f"exited with code {code} while starting")
            if self._ready(self.root_url):
                self._note(f"ready at {self.root_url}")
                return
            if time.monotonic() >= end:
                self.stop()  # alive: an exception line in its log need not be why it is slow
                raise self._failure(f"was not healthy after {deadline_s:g} s; stopped it", False)
            time.sleep(self._poll_s)

    def _failure(self, what: str, exited: bool = True) -> ServerStartError:
        """The start failed: for a server that exited, the cause from this start's log (not
        earlier starts'), first."""
        tail = log_tail(self.log_path, start=self.log_start)
        cause = (
            death_cause(log_tail(self.log_path, 400, 256 * 1024, self.log_start), self.wrappers)
            if exited
            else None
        )
        indented = "\n".join("    " + line for line in tail.splitlines()) or "    (empty)"
        return ServerStartError(
            f"{self.label} {what}" + (f": {cause}" if cause else "") + ".\n"
            f"  command: {self.command_line()}\n"
            f"  log: {self.log_path} (this start, last {LOG_TAIL_LINES} lines):\n{indented}"
        )

    def _start_watchdog(self, pgid: int) -> None:
        argv = [
            sys.executable,
            "-m",
            "pytest_modelbench.serving.watchdog",
            str(os.getpid()),
            str(pgid),
            "--grace",
            str(self.stop_grace_s),
        ]
        with open(self.log_path, "ab") as log:
            self._watchdog = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survives Ctrl-C aimed at pytest's group
                close_fds=True,
                env=_watchdog_env(),
            )

    def _stop_watchdog(self) -> None:
        dog, self._watchdog = self._watchdog, None
        if dog is None:
            return
        if dog.poll() is None:
            dog.terminate()  # SIGTERM: the watchdog exits without touching the server group
        try:
            dog.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - defensive
            dog.kill()
            dog.wait()

    def _note(self, message: str) -> None:
        """A modelbench line in the server log, so restarts and stops are visible there."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"[modelbench {stamp}] {self.label}: {message}\n")


def _cannot_run(label: str, program: str, exc: OSError) -> str:
    """One line for a program that cannot be started (missing, not executable)."""
    why = exc.strerror or str(exc)
    if isinstance(exc, FileNotFoundError):
        where = "not found" if os.sep in program else "not found on PATH"
        return f"{label} could not start: {program!r} {where} ({why}): install it or give its full path"
    return f"{label} could not start: cannot run {program!r} ({why}): make it executable or give another program"


def _shown_env(name: str) -> bool:
    if any(word in name for word in ("KEY", "TOKEN", "SECRET", "PASSWORD")):
        return False  # VLLM_API_KEY, HF_TOKEN: never in a log or a message
    return name.startswith(("CUDA_", "VLLM_", "HF_", "TRANSFORMERS_", "OMP_"))


def _watchdog_env() -> dict[str, str]:
    """The watchdog imports this package: make sure it can, even from a source checkout."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = package_root + (os.pathsep + existing if existing else "")
    return env
