"""The sandbox contains hostile programs and reports them; the host is unharmed.

Every hostile case runs at each isolation level: ``bwrap`` and ``namespaces`` (a
minimal root, every namespace, the sandbox user) and ``audit-hook``, the fallback
where only rlimits and the Python audit hook hold. What only the full levels stop
(answers on disk, host sockets, sysctls, files, state between runs) is in
``test_sandbox_isolation.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_modelbench.sandbox import Sandbox, SandboxLimits
from pytest_modelbench.sandbox.host import TOKEN_VAR

SECRET = "sk-modelbench-test-secret-0123456789"
PRINT_TOKEN = f"import os\nprint('TOKEN=' + os.environ['{TOKEN_VAR}'], flush=True)\n"


@pytest.fixture(params=["bwrap", "namespaces", "audit-hook"], scope="module")
def hostile_sandbox(
    request: pytest.FixtureRequest, make_sandbox: Callable[..., Sandbox]
) -> Sandbox:
    return make_sandbox(
        request.param, SandboxLimits(cpu_seconds=2, wall_seconds=4, memory_bytes=512 << 20)
    )


def _processes_with(token: str) -> list[int]:
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _token(stdout: str) -> str:
    return next(line[6:] for line in stdout.splitlines() if line.startswith("TOKEN="))


def test_basic_verdicts(sandbox: Sandbox) -> None:
    assert sandbox.run("print('hi')").status == "passed"
    failed = sandbox.run("assert 1 + 1 == 3, 'arithmetic'")
    assert failed.status == "failed" and "AssertionError: arithmetic" in failed.reason
    assert sandbox.run("import sys; sys.exit(3)").returncode == 3
    crashed = sandbox.run("import faulthandler, os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert crashed.status == "crashed" and "SIGSEGV" in crashed.reason
    syntax = sandbox.run("def f(:\n  pass")
    assert syntax.status == "failed" and "SyntaxError" in syntax.stderr_tail


def test_infinite_loop_is_stopped_by_cpu_limit(hostile_sandbox: Sandbox) -> None:
    result = hostile_sandbox.run("while True:\n    pass")
    assert result.status == "timeout"
    assert "CPU-time limit" in result.reason or "wall-clock" in result.reason
    assert result.duration_s < 10


def test_sleeping_program_is_stopped_by_wall_clock(hostile_sandbox: Sandbox) -> None:
    result = hostile_sandbox.run("import time\ntime.sleep(60)")
    assert result.status == "timeout" and "wall-clock" in result.reason
    assert result.duration_s < 8


def test_fork_bomb_is_contained(hostile_sandbox: Sandbox) -> None:
    bomb = (
        PRINT_TOKEN
        + "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    result = hostile_sandbox.run(bomb)
    assert result.status in ("timeout", "failed", "crashed")
    assert result.duration_s < 15
    token = _token(result.stdout_tail)
    deadline = time.monotonic() + 5
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(token) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def test_background_process_does_not_outlive_the_run(hostile_sandbox: Sandbox) -> None:
    program = PRINT_TOKEN + (
        "import time\n"
        "try:\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        time.sleep(120)\n"
        "except OSError as error:\n"
        "    print(error)\n"
    )
    result = hostile_sandbox.run(program)
    time.sleep(0.2)
    assert _processes_with(_token(result.stdout_tail)) == []


def test_huge_allocation_is_refused(hostile_sandbox: Sandbox) -> None:
    result = hostile_sandbox.run("data = bytearray(10 * 1024**3)\nprint(len(data))")
    assert result.status in ("failed", "crashed")
    assert "MemoryError" in result.stderr_tail or "memory" in result.reason.lower()


def test_writing_outside_the_working_directory_is_blocked(
    hostile_sandbox: Sandbox, tmp_path: Path
) -> None:
    targets = [tmp_path / "escape.txt", Path.cwd() / "modelbench-escape.txt"]
    program = (
        "import os\n"
        + "".join(
            f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('WROTE')\n"
            f"except OSError as error:\n    print('blocked', error)\n"
            for t in targets
        )
        + "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\n"
    )
    result = hostile_sandbox.run(program)
    assert result.status == "passed", result.stderr_tail
    assert "WROTE" not in result.stdout_tail
    assert result.stdout_tail.count("blocked") == 2 and result.stdout_tail.endswith("ok\n")
    assert not any(target.exists() for target in targets)


def test_environment_secrets_are_not_visible(
    hostile_sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    program = (
        "import os\nprint(sorted(os.environ))\nprint(os.environ.get('OPENAI_API_KEY'))\n"
        "for pid in [os.getppid(), 1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n"
        "        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as error:\n"
        "        print('denied', pid)\n"
    )
    result = hostile_sandbox.run(program)
    assert SECRET not in result.stdout_tail + result.stderr_tail
    assert "'OPENAI_API_KEY'" not in result.stdout_tail
    assert "OPENAI_API_KEY" in os.environ  # the host's own environment is untouched


@pytest.fixture
def listener() -> Iterator[tuple[int, list[object]]]:
    """A local TCP server that records any connection the sandbox manages to open."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


def test_network_is_blocked(hostile_sandbox: Sandbox, listener: tuple[int, list[object]]) -> None:
    port, accepted = listener
    program = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "s.sendall(b'leak')\nprint('CONNECTED')\n"
    )
    result = hostile_sandbox.run(program)
    time.sleep(0.3)
    assert result.status == "failed"
    assert "CONNECTED" not in result.stdout_tail
    assert accepted == []


def test_native_code_through_ctypes_is_refused(hostile_sandbox: Sandbox) -> None:
    """``ctypes.pythonapi`` and ``CDLL(None)`` need no ``dlopen`` of their own: the hook
    refuses every foreign call, symbol lookup and raw memory access instead."""
    attempts = {
        "pythonapi": "ctypes.pythonapi.Py_GetVersion()",
        "libc": "ctypes.CDLL(None).getpid()",
        "memory": "ctypes.string_at(id(0), 8)",
    }
    program = "import ctypes\n" + "".join(
        f"try:\n    {code}\n    print('RAN {name}')\n"
        f"except PermissionError as error:\n    print('refused {name}', error)\n"
        for name, code in attempts.items()
    )
    result = hostile_sandbox.run(program)
    assert result.status == "passed", result.stderr_tail
    assert "RAN" not in result.stdout_tail and result.stdout_tail.count("refused") == 3


def test_output_flood_is_bounded(hostile_sandbox: Sandbox) -> None:
    result = hostile_sandbox.run("while True:\n    print('x' * 1000)")
    assert result.status in ("failed", "crashed", "timeout")
    assert len(result.stdout_tail) <= hostile_sandbox.limits.tail_chars


def test_parallelism_is_bounded() -> None:
    sandbox = Sandbox(workers=2)
    start = time.monotonic()
    results = sandbox.run_many(["import time\ntime.sleep(0.6)"] * 4)
    elapsed = time.monotonic() - start
    assert all(result.passed for result in results)
    assert elapsed >= 1.2  # 4 programs, 2 at a time
