"""With full isolation, generated code reaches nothing of the host's: the classes of issue 27.

Each hostile program is what a model trained against our scores could learn to write:
it reads the suite's answers from the installed package or an earlier run's
``results.jsonl``, keeps state from one rollout to the next (SysV shared memory,
keyrings, files, abstract sockets), connects to the host's Unix sockets (also from a
child interpreter, which has no audit hook), writes ``/proc/sys`` (also through
``dir_fd``), reads the host's secrets, or relies on running as host root. Each runs
at both full levels, ``bwrap`` and ``namespaces`` (in CI neither may be skipped:
see ``conftest.sandbox_for``); where the attack works at the ``audit-hook`` level,
that is checked too, so each test is known to have teeth.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_modelbench.sandbox import (
    FULL_LEVELS,
    HiddenTests,
    Sandbox,
    SandboxLimits,
    WeakSandboxError,
    WeakSandboxWarning,
    policy,
)
from pytest_modelbench.sandbox.layout import root_layout
from pytest_modelbench.sandbox.namespaces import SANDBOX_ID
from pytest_modelbench.suites import coding
from pytest_modelbench.suites.coding import MBPP, HumanEval
from pytest_modelbench.suites.contract import Example
from pytest_modelbench.suites.vendored import data_root

LIMITS = SandboxLimits(cpu_seconds=10, wall_seconds=20, memory_bytes=512 << 20)
MakeSandbox = Callable[..., Sandbox]


@pytest.fixture(params=FULL_LEVELS, scope="module")
def full(request: pytest.FixtureRequest, make_sandbox: MakeSandbox) -> Sandbox:
    return make_sandbox(request.param, LIMITS)


@pytest.fixture(scope="module")
def weak(make_sandbox: MakeSandbox) -> Sandbox:
    return make_sandbox("audit-hook", LIMITS)


def _he(index: int) -> tuple[HumanEval, Example]:
    suite = HumanEval()
    example = suite.examples({}, 0)[index]
    gold = {**example.gold, "timeout": 10}
    return suite, Example(example.id, example.messages, gold, example.prompt)


def _score(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, code: str, index: int = 0
) -> tuple[float, str]:
    """pass@1 of ``code`` as a reply to HumanEval/index, and its stderr tail."""
    monkeypatch.setattr(coding, "default_sandbox", lambda: sandbox)
    monkeypatch.setattr(policy, "_state", {"allowed": True, "warned": True})
    suite, example = _he(index)
    score = suite.score(example, f"```python\n{code}```")
    return score.metrics["pass@1"], str(score.detail.get("stderr_tail", ""))


# -- answers on disk ---------------------------------------------------------------------

# One generic snippet for every HumanEval task: find the suite's data (the installed
# package, its absolute path on the host, anywhere on the disk), find this task by its
# prompt in the program's own source, run the canonical solution.
ANSWER_THIEF = r"""
import glob, gzip, json, os, sys

def _candidates():
    yield HOST_DATA
    try:
        from pytest_modelbench.suites.vendored import data_root
        yield str(data_root().joinpath("humaneval", "test.jsonl.gz"))
    except Exception as error:
        print("no package:", error, file=sys.stderr)
    for root, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
        if "test.jsonl.gz" in files and "humaneval" in root:
            yield os.path.join(root, "test.jsonl.gz")

def _steal():
    source = open(__file__).read()
    for path in _candidates():
        try:
            rows = [json.loads(line) for line in gzip.open(path, "rt")]
        except Exception:
            continue
        for row in rows:
            if row["prompt"].strip() in source:
                print("STOLE", row["task_id"], file=sys.stderr)
                return row["prompt"] + row["canonical_solution"]
    return None

def has_close_elements(numbers, threshold):
    return False

_code = _steal()
if _code:
    exec(_code, globals())
"""


def test_the_suites_answers_are_not_on_the_programs_disk(
    full: Sandbox, weak: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_data = str(data_root().joinpath("humaneval", "test.jsonl.gz"))
    thief = f"HOST_DATA = {host_data!r}\n{ANSWER_THIEF}"
    assert _score(weak, monkeypatch, thief)[0] == 1.0  # the attack works without isolation
    passed, stderr = _score(full, monkeypatch, thief)
    assert passed == 0.0, stderr
    assert "STOLE" not in stderr and "No module named 'pytest_modelbench" in stderr


def test_earlier_runs_results_and_host_files_are_unreadable(
    full: Sandbox, weak: Sandbox, tmp_path: Path
) -> None:
    secret = f"modelbench-secret-{uuid.uuid4().hex}"
    results = tmp_path / "runs" / "run-1" / "items" / "humaneval" / "results.jsonl"
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps({"completion": secret}) + "\n")
    planted = tmp_path / "key"
    planted.write_text(secret)
    home = Path.home()
    targets = [
        results,
        planted,
        Path("/etc/shadow"),
        home / ".npmrc",
        home / ".gitconfig",
        home / ".config" / "openai" / "key",
        home / ".ssh" / "id_ed25519",
    ]
    program = "".join(
        f"try:\n    print('READ', {str(t)!r}, open({str(t)!r}).read()[:200])\n"
        "except OSError as error:\n    print('denied', type(error).__name__)\n"
        for t in targets
    )
    assert secret in weak.run(program).stdout_tail  # readable without isolation
    result = full.run(program)
    assert result.status == "passed", result.stderr_tail
    assert secret not in result.stdout_tail and "READ" not in result.stdout_tail


# Walks the whole visible tree (not /proc, /sys, /dev) and names what must not be there.
CENSUS = r"""
import os, re, stat, sys
bad = re.compile(r"humaneval|mbpp|results\.jsonl|summary\.json|\.npmrc|\.gitconfig|\.ssh|"
                 r"/shadow$|pytest_modelbench/suites|-packages/.")
found = []
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    for name in dirs + files:
        path = os.path.join(root, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if bad.search(path) or stat.S_ISSOCK(mode):
            found.append(path)
print("TOP", sorted(os.listdir("/")))
for path in found[:20]:
    print("FOUND", path)
print("COUNT", len(found))
print("CMDLINE", open("/proc//1/cmdline", "rb").read())  # // passes the audit hook
"""

# From a child interpreter (no audit hook): every directory but /work and /dev/shm refuses
# a new file.
WRITABLE = r"""
import os
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/work", "/dev/shm")]
    try:
        os.close(os.open(os.path.join(root, ".mb-written"), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        print("WRITABLE", root)
    except OSError:
        pass
print("WALKED")
"""


def test_the_root_holds_the_interpreter_and_libraries_only(full: Sandbox) -> None:
    result = full.run(CENSUS)
    assert result.status == "passed", result.stderr_tail
    assert "COUNT 0" in result.stdout_tail, result.stdout_tail
    cmdline = result.stdout_tail.split("CMDLINE ", 1)[1]
    assert ".npmrc" not in cmdline and "hidden" not in cmdline  # the config is not in argv
    top = result.stdout_tail.split("TOP ", 1)[1].splitlines()[0]
    layout = root_layout(full.python)
    allowed = {p.split("/")[1] for p in [*layout.bound, *(s for _, s in layout.symlinks)]}
    allowed |= {"proc", "dev", "work", "opt"}
    assert set(ast.literal_eval(top)) <= allowed, top


def test_only_the_working_directory_and_dev_shm_are_writable(full: Sandbox) -> None:
    program = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {WRITABLE!r}])\n"
    result = full.run(program)
    assert "WALKED" in result.stdout_tail, result.stderr_tail
    assert "WRITABLE" not in result.stdout_tail, result.stdout_tail


# -- state between rollouts ------------------------------------------------------------

# Run twice by the program through a child interpreter (no audit hook there): "write"
# leaves a marker wherever state could outlive a run, "read" looks for it.
STATE = r"""
import ctypes, os, sys, time
mode, marker = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
KEY, SIZE, NAME = 0x6D620027, 4096, b"mb-state"
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}.get(os.uname().machine, (0, 0))
RINGS = {"session": -3, "user": -4, "user-session": -5}
FILES = ["/dev/shm/mb-state", "/tmp/mb-state", "/var/tmp/mb-state", "/mb-state",
         "/opt/mb-state", os.path.join(os.getcwd(), "..", "mb-state"),
         os.path.expanduser("~/../mb-state")]
if mode == "write":
    shm = libc.shmget(KEY, SIZE, 0o1666)
    if shm >= 0:
        ctypes.memmove(libc.shmat(shm, None, 0), marker.encode(), len(marker))
    for ring in RINGS.values():
        if ADD_KEY:
            libc.syscall(ADD_KEY, b"user", NAME, marker.encode(), len(marker), ring)
    for path in FILES:
        try:
            with open(path, "w") as handle:
                handle.write(marker)
        except OSError:
            pass
    if os.fork() == 0:  # an abstract socket held by a process that tries to outlive the run
        os.setsid()
        import socket
        holder = socket.socket(socket.AF_UNIX)
        holder.bind(b"\0mb-state-" + marker.encode())
        time.sleep(60)
    print("WROTE", flush=True)
else:
    shm = libc.shmget(KEY, 0, 0)
    if shm >= 0:
        print("FOUND shm", ctypes.string_at(libc.shmat(shm, None, 0), 32))
    for name, ring in RINGS.items():
        found = libc.syscall(KEYCTL, 10, ring, b"user", NAME, 0) if KEYCTL else -1
        if found >= 0:
            print("FOUND key in", name)
    for path in FILES:
        if os.path.exists(path):
            print("FOUND", path)
    for line in open("/proc/net/unix"):
        if "mb-state" in line:
            print("FOUND socket", line.strip())
    print("READ", flush=True)
"""


def _state_program(mode: str, marker: str) -> str:
    return (
        "import subprocess, sys\n"
        f"done = subprocess.run([sys.executable, '-c', {STATE!r}, {mode!r}, {marker!r}])\n"
        "sys.exit(done.returncode)\n"
    )


def test_no_state_survives_between_rollouts(full: Sandbox) -> None:
    marker = uuid.uuid4().hex
    wrote = full.run(_state_program("write", marker))
    assert wrote.status == "passed" and "WROTE" in wrote.stdout_tail, wrote.stderr_tail
    read = full.run(_state_program("read", marker))
    assert read.status == "passed" and "READ" in read.stdout_tail, read.stderr_tail
    assert "FOUND" not in read.stdout_tail, read.stdout_tail
    # nor did any of it reach the host
    assert f" {0x6D620027} " not in Path("/proc/sysvipc/shm").read_text()
    assert "mb-state" not in Path("/proc/keys").read_text()
    assert "mb-state" not in Path("/proc/net/unix").read_text()


def test_the_judge_calls_every_case_whatever_the_answers(full: Sandbox) -> None:
    """A wrong answer is called exactly as often as a right one, so which calls passed
    cannot be learnt from the calls (HumanEval/0: seven asserts in one case; MBPP/11:
    three cases, the first one failing)."""
    he, example = _he(0)
    right = he.reference_completion(example)
    counts = []
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return None\n```"
    for reply in (right, wrong):
        program, tests, _ = he.program_and_tests(example, reply)
        counts.append(full.run_tests(program, tests).tests)
    assert counts[0]["passed"] == 1 and counts[1]["passed"] == 0
    assert counts[0]["calls"] == counts[1]["calls"] == 7
    mbpp = MBPP()
    first = mbpp.examples({}, 0)[0]
    raising = "```python\ndef remove_Occ(s, ch):\n    raise ValueError(s)\n```"
    program, tests, _ = mbpp.program_and_tests(first, raising)
    result = full.run_tests(program, tests)
    assert dict(result.tests) == {"total": 3, "passed": 0, "calls": 3}
    assert result.reason.startswith("ValueError") and result.reason.endswith("(test 1 of 3)")


def test_a_failed_assert_does_not_stop_the_tests(full: Sandbox) -> None:
    program = "calls = []\ndef f(x):\n    calls.append(x)\n    return len(calls)\n"
    case = "for x in range(5):\n    assert f(x) == 1, x\nassert f(9) == 6"
    result = full.run_tests(program, HiddenTests(cases=(case,)))
    assert result.status == "failed" and result.reason == "AssertionError: 1"
    assert result.tests["calls"] == 6


# -- host sockets, sysctls, uid ----------------------------------------------------------


@pytest.fixture
def unix_listeners(tmp_path: Path) -> Iterator[tuple[str, str, list[object]]]:
    """A filesystem and an abstract Unix socket on the host that record any connection."""
    path = str(tmp_path / "host.sock")
    abstract = f"mb-host-{uuid.uuid4().hex}"
    servers = []
    for address in (path, "\0" + abstract):
        server = socket.socket(socket.AF_UNIX)
        server.bind(address)
        server.listen()
        server.settimeout(0.1)
        servers.append(server)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            for server in servers:
                try:
                    accepted.append(server.accept())
                except OSError:
                    continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path, abstract, accepted
    stop.set()
    thread.join()
    for server in servers:
        server.close()


CONNECT = r"""
import glob, socket, sys
targets = sys.argv[1:] + glob.glob("/run/**/*.sock", recursive=True) + glob.glob("/tmp/**")
for target in targets:
    address = "\0" + target[1:] if target.startswith("@") else target
    try:
        client = socket.socket(socket.AF_UNIX)
        client.settimeout(1)
        client.connect(address)
        print("CONNECTED", target, flush=True)
    except OSError as error:
        print("refused", target, type(error).__name__)
"""


def test_host_unix_sockets_are_out_of_reach(
    full: Sandbox, unix_listeners: tuple[str, str, list[object]]
) -> None:
    path, abstract, accepted = unix_listeners
    args = [path, "@" + abstract]
    program = (
        f"import subprocess, sys\nCONNECT = {CONNECT!r}\nARGS = {args!r}\n"
        "try:\n    exec(CONNECT.replace('sys.argv[1:]', 'ARGS'))\n"
        "except Exception as error:\n    print('in-process', error)\n"
        "subprocess.run([sys.executable, '-c', CONNECT, *ARGS])\n"
    )
    result = full.run(program)
    time.sleep(0.3)
    assert result.status == "passed", result.stderr_tail
    assert "CONNECTED" not in result.stdout_tail and result.stdout_tail.count("refused") >= 2
    assert accepted == []


SYSCTLS = r"""
import os, socket, sys
for name in ("core_pattern", "hostname"):
    path = "/proc/sys/kernel/" + name
    value = open(path).read()  # written back unchanged: harmless even if a write got through
    folder = os.open("/proc/sys/kernel", os.O_RDONLY)
    for how, write in (
        ("path", lambda: open(path, "w").write(value)),
        ("dir_fd", lambda: os.write(os.open(name, os.O_WRONLY, dir_fd=folder), value.encode())),
    ):
        try:
            write()
            print("WROTE", name, how, flush=True)
        except OSError as error:
            print("refused", name, how, type(error).__name__)
try:
    socket.sethostname(socket.gethostname())
    print("WROTE hostname sethostname", flush=True)
except OSError as error:
    print("refused hostname sethostname", type(error).__name__)
"""


def test_proc_sys_and_the_hostname_cannot_be_written(full: Sandbox) -> None:
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    hostname = socket.gethostname()
    program = (
        f"import subprocess, sys\nSYSCTLS = {SYSCTLS!r}\nexec(SYSCTLS)\n"
        "subprocess.run([sys.executable, '-c', SYSCTLS])\n"  # no audit hook in a child
    )
    result = full.run(program)
    assert result.status == "passed", result.stderr_tail
    assert "WROTE" not in result.stdout_tail, result.stdout_tail
    assert result.stdout_tail.count("refused") == 10, result.stdout_tail
    assert Path("/proc/sys/kernel/core_pattern").read_text() == core_pattern
    assert socket.gethostname() == hostname


NESTED = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, flag in (("user", 0x10000000), ("mount", 0x00020000), ("net", 0x40000000)):
    if libc.unshare(flag) == 0:
        print("UNSHARED", name, flush=True)
    else:
        print("refused", name, os.strerror(ctypes.get_errno()))
"""


def test_no_new_namespaces_inside(full: Sandbox) -> None:
    """Nested user namespaces are disabled (the kernel's largest attack surface for an
    unprivileged process), and without capabilities no other namespace can be made."""
    program = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {NESTED!r}])\n"
    result = full.run(program)
    assert result.stdout_tail.count("refused") == 3, (result.stdout_tail, result.stderr_tail)


def _sandbox_processes(marker: bytes) -> list[dict[str, str]]:
    """``/proc/PID/status`` (from the host) of every process in the PID namespace of the
    process whose environment holds ``marker``; empty until that process exists."""
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    namespace = None
    for pid in pids:
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/environ").read_bytes():
                namespace = os.stat(f"/proc/{pid}/ns/pid").st_ino
    found = []
    for pid in pids if namespace is not None else []:
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace:
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
                found.append(dict(line.split(":\t", 1) for line in lines if ":\t" in line))
    return found


def test_no_process_of_the_program_is_host_root(full: Sandbox) -> None:
    """Seen from the host: while the program runs, every process in its PID namespace (the
    launcher, the judge, the program and its child) runs as a non-zero uid with no
    capabilities; inside, the program is uid and gid 65534 with no other group."""
    key, value = "MB_MARK", uuid.uuid4().hex
    program = (
        "import os, subprocess, sys\n"
        "print('UID', os.getuid(), os.getgid(), set(os.getgroups()) - {os.getgid()}, flush=True)\n"
        f"env = {{**os.environ, {key!r}: {value!r}}}\n"
        "subprocess.run([sys.executable, '-c', 'import time; time.sleep(4)'], env=env)\n"
    )
    views: list[list[dict[str, str]]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            found = _sandbox_processes(f"{key}={value}".encode())
            if found:
                views.append(found)
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = full.run(program)
    done.set()
    watcher.join()
    assert result.status == "passed", result.stderr_tail
    assert f"UID {SANDBOX_ID} {SANDBOX_ID} set()" in result.stdout_tail
    assert views, "the program's process was never seen from the host"
    assert len(views[0]) >= 3  # PID 1, the program, its child
    for status in views[0]:
        assert all(uid != "0" for uid in status["Uid"].split()), status
        assert int(status["CapEff"], 16) == 0, status


# -- the level is stated, the fallback never silent --------------------------------------


def test_ci_runs_with_full_isolation() -> None:
    """In CI the default sandbox must isolate fully: a host that silently fell back to the
    audit hook would skip nothing and prove nothing."""
    if os.environ.get("CI", "").strip().lower() in ("", "0", "false", "no"):
        pytest.skip("not in CI ($CI unset)")
    sandbox = Sandbox()
    assert sandbox.level in FULL_LEVELS, sandbox.unavailable


def test_code_suites_refuse_the_audit_hook_unless_accepted(
    weak: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coding, "default_sandbox", lambda: weak)
    monkeypatch.setattr(policy, "_state", {"allowed": False, "warned": False})
    monkeypatch.delenv(policy.ALLOW_WEAK_VAR, raising=False)
    suite, example = _he(0)
    reply = suite.reference_completion(example)
    with pytest.raises(WeakSandboxError, match=r"no OS isolation.*--mb-allow-weak-sandbox"):
        suite.preflight()
    with pytest.raises(WeakSandboxError, match="MODELBENCH_ALLOW_WEAK_SANDBOX=1"):
        suite.score(example, reply)
    monkeypatch.setenv(policy.ALLOW_WEAK_VAR, "1")
    with pytest.warns(WeakSandboxWarning, match="audit-hook sandbox"):
        score = suite.score(example, reply)
    assert score.metrics["pass@1"] == 1.0
    assert score.detail["isolation"]["level"] == "audit-hook"
    weak_fields = suite.summary_fields()["sandbox"]
    assert (weak_fields["isolation"], weak_fields["full"]) == ("audit-hook", False)
    assert "work_bytes" not in weak_fields["limits"]  # no tmpfs at this level


def test_the_level_is_in_each_row_and_the_summary(
    full: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coding, "default_sandbox", lambda: full)
    suite, example = _he(0)
    suite.preflight()
    score = suite.score(example, suite.reference_completion(example))
    assert score.metrics["pass@1"] == 1.0
    assert score.detail["isolation"]["level"] == full.level
    fields = suite.summary_fields()["sandbox"]
    assert fields["isolation"] == full.level and fields["full"] is True
    assert fields["limits"]["work_bytes"] == full.limits.work_bytes
    assert fields["limits"]["memory_bytes"] == full.limits.memory_bytes
    assert fields["limits"]["memory_scope"].startswith(("whole program (cgroup)", "per process"))
