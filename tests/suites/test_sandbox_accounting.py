"""What a judged program can learn, what it is charged with, and what it can use.

* The judge tells the program nothing: its output (the failed asserts, with the tests' source
  and expected values) goes to the host in the verdict, never to the program's stdout or
  stderr, which the program may reopen through ``/proc/self/fd`` while it runs.
* Errors are charged to whoever caused them: whatever the program leaves behind (a very deep
  directory chain, files it made unremovable) fails the program, never the host's clean-up;
  a failure of the sandbox's own machinery (its launcher's folder removed, the judge dead
  before it reports, a set-up that fails) is a :class:`SandboxFailure`, never a wrong answer.

* Whole-program limits: the working directory is a size-limited tmpfs that leaves nothing on
  the host, and memory is limited for all of the program's processes together.
* A seccomp filter refuses system calls no program needs; at the audit-hook level nothing
  starts a program (``_posixsubprocess.fork_exec`` included).

Each hostile case runs at both full levels (``bwrap`` and ``namespaces``), as users get them,
and at ``audit-hook`` where the case is one it should hold too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from pytest_modelbench.sandbox import (
    FULL_LEVELS,
    LEVELS,
    Sandbox,
    SandboxFailure,
    SandboxLimits,
    cgroups,
    host,
    launcher,
    policy,
    processes,
    seccomp,
)
from pytest_modelbench.sandbox.layout import root_layout
from pytest_modelbench.suites import coding
from pytest_modelbench.suites.coding import HumanEval
from pytest_modelbench.suites.contract import Example
from tests.suites.conftest import in_ci

LIMITS = SandboxLimits(cpu_seconds=10, wall_seconds=20, memory_bytes=512 << 20)
MakeSandbox = Callable[..., Sandbox]


@pytest.fixture(params=FULL_LEVELS, scope="module")
def full(request: pytest.FixtureRequest, make_sandbox: MakeSandbox) -> Sandbox:
    return make_sandbox(request.param, LIMITS)


@pytest.fixture(params=LEVELS)
def any_level(request: pytest.FixtureRequest, make_sandbox: MakeSandbox) -> Sandbox:
    return make_sandbox(request.param, LIMITS)


def _he(index: int = 0) -> tuple[HumanEval, Example]:
    suite = HumanEval()
    return suite, suite.examples({}, 0)[index]


# Reads every descriptor it holds and every path that leads to a stdout or stderr (its own,
# PID 1's, its parent's) on each call; says LEAKED when any of it is the tests' text.
REREAD = r"""
import os

def _look():
    found = []
    paths = [f"/proc/self/fd/{fd}" for fd in range(64)]
    paths += ["/dev/stdout", "/dev/stderr", "/proc/1/fd/1", "/proc/1/fd/2"]
    paths += [f"/proc/{os.getppid()}/fd/{fd}" for fd in (1, 2)]
    for path in paths:
        for how in (os.O_RDONLY, os.O_RDWR):
            try:
                fd = os.open(path, how | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                found.append(os.pread(fd, 1 << 20, 0))
            except OSError:
                try:
                    found.append(os.read(fd, 1 << 20))
                except OSError:
                    pass
            finally:
                os.close(fd)
    for fd in range(64):
        try:
            found.append(os.pread(fd, 1 << 20, 0))
        except OSError:
            pass
    return b"".join(found)

def has_close_elements(numbers, threshold):
    data = _look()
    for word in (b"candidate(", b"AssertionError", b"== True", b"== False"):
        if word in data:
            os.write(1, b"LEAKED " + word + b"\n")
    return None
"""


def test_the_program_cannot_read_the_judges_output_while_it_runs(any_level: Sandbox) -> None:
    suite, example = _he(0)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{REREAD}```")
    result = any_level.run_tests(program, tests)
    assert result.status == "failed" and result.tests["calls"] == 7, result
    assert "LEAKED" not in result.stdout_tail, result.stdout_tail
    assert "AssertionError" not in result.stderr_tail + result.stdout_tail
    # the host still has the judge's account of what failed
    assert "candidate(" in result.judge_tail and "AssertionError" in result.judge_tail


# A logic-free answer to HumanEval/0 with a memory across rollouts and sandboxes. Before its
# first instruction it looks for what earlier rollouts left (files in every place it may
# write, and bits in the page cache of read-only files of the minimal root, read with
# RWF_NOWAIT, set by reading, cleared by POSIX_FADV_DONTNEED: these survive the sandbox,
# and a read that misses starts a read-ahead, so each read is followed by a rewrite);
# on every call it rereads each output it can reach. An assert line it finds
# ("candidate(ARGS) == True") is learnt: the expected answer of the call with those ARGS goes
# to that call's bit, and a bit says "a rollout saw an outcome". The n-th call answers with
# the n-th bit. If the judge's output reached the program (as it did through the stderr file
# it shares), the first failing rollout would store the expected answers and later rollouts,
# in this sandbox or a fresh one, would pass; with the judge silent it learns nothing.
MEMORY = r"""
import os, re

_BASE = os.path.dirname(os.__file__)
_NAMES = NAMES  # never imported: 7 answers, "saw", a counter
_FILES = [f"{_BASE}/{name}.py" for name in _NAMES]
_SAW = 7
_LEFT = ["memo", "/dev/shm/memo", "/tmp/memo", "/var/tmp/memo", os.path.expanduser("~/memo")]
_WORDS = (b"candidate(", b"AssertionError", b"== True", b"== False", b"Traceback")

def _bit(i):
    fd = os.open(_FILES[i], os.O_RDONLY)
    try:
        os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT)
        return 1
    except BlockingIOError:
        return 0
    finally:
        os.close(fd)

def _set(i, value):
    fd = os.open(_FILES[i], os.O_RDONLY)
    try:
        os.pread(fd, 4096, 0)  # waits for a read-ahead in flight, which would set it again
        if not value:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)

def _say(*words):
    os.write(1, (" ".join(map(str, words)) + "\n").encode())

for _path in _LEFT:
    if os.path.exists(_path):
        _say("FOUND", _path)
try:
    _known = [_bit(i) for i in range(len(_FILES))]  # a miss starts a read-ahead: restore
    _count = sum(_known[8 + j] << j for j in range(4))
    _say("CHANNEL", _count)
    for i in range(_SAW + 1):
        _set(i, _known[i])
    for j in range(4):
        _set(8 + j, ((_count + 1) >> j) & 1)
except OSError as error:  # no RWF_NOWAIT here: the memory is files alone
    _say("CHANNEL unsupported", error.errno)
    _known = [0] * len(_FILES)
_say("LEARNED", sum(_known[:_SAW]), "SAW", _known[_SAW])
_calls = []

def _look():
    found = []
    paths = [f"/proc/self/fd/{fd}" for fd in range(64)]
    paths += ["/dev/stdout", "/dev/stderr", "/proc/1/fd/1", "/proc/1/fd/2"]
    paths += [f"/proc/{os.getppid()}/fd/{fd}" for fd in (1, 2)] + _LEFT
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            found.append(os.pread(fd, 1 << 20, 0))
        except OSError:
            pass
        finally:
            os.close(fd)
    return b"".join(found)

def has_close_elements(numbers, threshold):
    call = len(_calls)
    _calls.append(f"{numbers!r}, {threshold!r}")
    seen = _look()
    for n, word in enumerate(_WORDS):
        if word in seen:
            _say("OBSERVED", n)
    for args, expected in re.findall(r"candidate\((.+)\) == (True|False)", seen.decode("utf-8", "replace")):
        if args in _calls[:7]:
            _set(_calls.index(args), expected == "True")
            _set(_SAW, 1)
    for path in _LEFT:
        try:
            with open(path, "a") as memo:
                memo.write(f"call {call} answered {bool(_known[call % 7])}\n")
        except OSError:
            pass
    return bool(_known[call]) if call < _SAW else False
"""
# clears the memory's bits (the page cache of its files) before the first rollout
FORGET = MEMORY.split("def _say")[0] + "for _i in range(len(_FILES)):\n    _set(_i, 0)\n"
# the memory's files: standard-library modules no sandbox, judge or test imports, present in
# every supported Python (3.10 onwards), a set of its own for each level, so that the two
# levels' tests may run at once (-n 2) without setting each other's bits
MEMORY_FILES = {
    "namespaces": ("tabnanny", "this", "antigravity", "imaplib", "poplib", "ftplib", "wave",
                   "sched", "shelve", "netrc", "pyclbr", "pickletools"),
    "bwrap": ("modulefinder", "filecmp", "zipapp", "symtable", "graphlib", "cProfile", "pstats",
              "trace", "rlcompleter", "getpass", "webbrowser", "mailbox"),
}  # fmt: skip


def _memory(level: str) -> tuple[str, str]:
    """The memory program and its FORGET for ``level``'s own files."""
    names = MEMORY_FILES[level]
    assert all(Path(os.path.dirname(os.__file__), f"{name}.py").is_file() for name in names)
    return (MEMORY.replace("_NAMES = NAMES", f"_NAMES = {names!r}"),
            FORGET.replace("_NAMES = NAMES", f"_NAMES = {names!r}"))  # fmt: skip


@pytest.fixture
def page_cache() -> Iterator[None]:
    """The host's page cache to this test alone: one memory test at a time on this host, in
    any worker or checkout (each level's own files keep the levels apart, but two tests of
    one level would share theirs)."""
    with FileLock(os.path.join(tempfile.gettempdir(), "modelbench-page-cache-test.lock")):
        yield


def _counter_steps(results: list[Any]) -> int:
    """How many rollouts found the page-cache counter one above the previous rollout's; fails
    in CI and skips elsewhere where the counter cannot be read (no ``RWF_NOWAIT``)."""
    said = [line.split() for result in results for line in result.stdout_tail.splitlines()]
    words = [word for word in said if word[0] == "CHANNEL"]
    counts = [int(word[1]) for word in words if word[1].isdigit()]
    if not counts:  # the memory is files alone here, and the check would be moot
        errors = sorted({" ".join(word[2:]) for word in words})
        reason = f"no page-cache memory to show working here (RWF_NOWAIT reads: errno {errors})"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    return sum((b - a) % 16 == 1 for a, b in itertools.pairwise(counts))


@pytest.mark.parametrize("level", FULL_LEVELS)
@pytest.mark.usefixtures("page_cache")
def test_a_memory_across_rollouts_learns_nothing_from_a_silent_judge(
    level: str, make_sandbox: MakeSandbox
) -> None:
    """12 rollouts of a logic-free program with a memory, in two sandboxes: it never observes
    an outcome (no assert text, no file left behind, no bit set by a rollout that saw one),
    so pass@1 stays 0, while its page-cache counter shows that the memory itself works."""
    memory, forget = _memory(level)
    suite, example = _he(0)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{memory}```")
    assert make_sandbox(level, LIMITS).run(forget).passed
    results = []
    for _sandbox in range(2):
        sandbox = make_sandbox(level, LIMITS)  # a fresh Sandbox (as a new session has), same host
        results += [sandbox.run_tests(program, tests) for _ in range(6)]
    for result in results:
        lines = result.stdout_tail.splitlines()
        assert result.status == "failed" and result.tests["calls"] == 7, result
        assert not [line for line in lines if line.startswith(("FOUND", "OBSERVED"))], lines
        assert "LEARNED 0 SAW 0" in lines, lines
    assert sum(result.passed for result in results) == 0  # pass@1 over 12 rollouts: 0
    # the memory carries bits from rollout to rollout, from one sandbox to the next too
    assert _counter_steps(results) >= 8


@pytest.mark.parametrize("level", FULL_LEVELS)
@pytest.mark.usefixtures("page_cache")
def test_the_two_levels_memories_keep_apart(level: str, make_sandbox: MakeSandbox) -> None:
    """The levels' memory tests may run at once (``-n 2``) on one interpreter: rollouts with
    the two levels' files, interleaved in one sandbox, each find their own counter one step
    on (with shared files each would see the other's steps too, and move by two)."""
    sandbox = make_sandbox(level, LIMITS)
    suite, example = _he(0)
    runs = {}
    for files in MEMORY_FILES:
        memory, forget = _memory(files)
        assert sandbox.run(forget).passed
        runs[files] = suite.program_and_tests(example, f"```python\n{memory}```")[:2]
    results: dict[str, list[Any]] = {files: [] for files in MEMORY_FILES}
    for _ in range(4):
        for files, (program, tests) in runs.items():
            results[files].append(sandbox.run_tests(program, tests))
    steps = {files: _counter_steps(results[files]) for files in MEMORY_FILES}
    assert steps == dict.fromkeys(MEMORY_FILES, 3), steps


# -- errors charged to whoever caused them --------------------------------------------------

# a 10000-deep chain of folders (built through descriptors: no path is ever long), a file
# at the bottom, and the top made inaccessible
DEEP_TREE = r"""
import os

def _dig(depth):
    fd = os.open(".", os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(os.open("leftover", os.O_WRONLY | os.O_CREAT, 0o000, dir_fd=fd))
    os.close(fd)
    os.chmod("d", 0)

_dig(10000)
"""
RIGHT = """
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
"""
WRONG = "\ndef has_close_elements(numbers, threshold):\n    return False\n"


@pytest.fixture
def scratch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The host's temporary directory for this test's runs (readable by the sandbox user)."""
    folder = Path(tempfile.mkdtemp(prefix="mb-scratch-"))
    folder.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("answer", ["right", "wrong"])
def test_a_deep_unremovable_tree_is_the_programs_and_nothing_is_left(
    any_level: Sandbox, scratch: Path, answer: str
) -> None:
    suite, example = _he(0)
    code = DEEP_TREE + (RIGHT if answer == "right" else WRONG)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{code}```")
    result = any_level.run_tests(program, tests)  # never raises: nothing here is the host's
    assert result.status == ("passed" if answer == "right" else "failed"), result
    left = [p.name for p in scratch.iterdir() if not p.name.startswith("modelbench-sandbox-code")]
    assert left == []  # the host's clean-up removed all of it (the launcher's copy stays)


def test_a_program_that_kills_its_judge_at_the_weak_level_fails(make_sandbox: MakeSandbox) -> None:
    """At the audit-hook level the judge is the program's parent, not PID 1 of a namespace:
    signalling it is refused, so a program cannot turn its failure into a machinery error."""
    weak = make_sandbox("audit-hook", LIMITS)
    suite, example = _he(0)
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG
    program, tests, _ = suite.program_and_tests(example, f"```python\n{code}```")
    result = weak.run_tests(program, tests)
    assert result.status == "failed" and "signalling" in result.reason, result


# signals to a host process (not the program's) and to the judge, by the ways the weak level
# offers: os.kill (an audit event) and a process descriptor (pidfd_open, pidfd_send_signal: none)
SIGNALLER = r"""
import os, signal

def _pidfd(pid, number):
    fd = os.pidfd_open(pid)
    try:
        signal.pidfd_send_signal(fd, number)
    finally:
        os.close(fd)

for _name, _send in (
    ("kill host", lambda: os.kill(VICTIM, signal.SIGTERM)),
    ("pidfd host", lambda: _pidfd(VICTIM, signal.SIGTERM)),
    ("pidfd judge", lambda: _pidfd(os.getppid(), signal.SIGKILL)),
):
    try:
        _send()
        print(_name, "SENT", flush=True)
    except OSError as error:
        print(_name, "refused", type(error).__name__, flush=True)
"""


def test_is_descendant_follows_parents_to_the_ancestor() -> None:
    """The weak level's check behind os.kill: a process itself and a forked grandchild are
    its descendants; its parent, a sibling started elsewhere, PID 1, process groups (0 and
    negative numbers), a non-number and a pid no process has are not."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # a child that forks a sleeping grandchild of this process, says its pid
        os.close(read_end)
        grandchild = os.fork()
        if grandchild == 0:
            os.close(write_end)
            time.sleep(30)
            os._exit(0)
        os.write(write_end, str(grandchild).encode())
        os.close(write_end)
        os.waitpid(grandchild, 0)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as said:
        grandchild = int(said.read())
    other = subprocess.Popen(["sleep", "30"])  # started by this process, not by `middle`
    try:
        assert launcher.is_descendant(middle, middle)
        assert launcher.is_descendant(grandchild, middle)
        assert launcher.is_descendant(grandchild, os.getpid())
        assert not launcher.is_descendant(other.pid, middle)  # a sibling, not a descendant
        assert not launcher.is_descendant(os.getpid(), middle)  # the parent
        assert not launcher.is_descendant(1, middle)
        for pid in (0, -middle, -1, "1", None):
            assert not launcher.is_descendant(pid, middle)
        unused = max(int(x) for x in os.listdir("/proc") if x.isdigit()) + 100_000
        assert not launcher.is_descendant(unused, middle)
    finally:
        other.kill()
        other.wait()
        os.kill(grandchild, signal.SIGKILL)
        os.waitpid(middle, 0)


def test_the_weak_level_signals_no_process_but_the_programs_own(
    make_sandbox: MakeSandbox,
) -> None:
    """At the audit-hook level the program shares the host's processes (and, as root, may
    signal any): os.kill reaches only its own processes, and the seccomp filter refuses
    process descriptors, whose signals no audit event shows (a judge killed that way made
    the program's failure a machinery error, and the host's processes were its to kill)."""
    _needs_seccomp()
    weak = make_sandbox("audit-hook", LIMITS)
    suite, example = _he(0)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = SIGNALLER.replace("VICTIM", str(victim.pid)) + WRONG
        program, tests, _ = suite.program_and_tests(example, f"```python\n{code}```")
        result = weak.run_tests(program, tests)  # raises if the judge was killed
        time.sleep(0.2)
        assert victim.poll() is None, "the program killed a host process"
    finally:
        victim.kill()
        victim.wait()
    assert result.status == "failed", result
    assert result.stdout_tail.splitlines() == [
        "kill host refused PermissionError",
        "pidfd host refused PermissionError",
        "pidfd judge refused PermissionError",
    ]


# signals through a descriptor's owner: with O_ASYNC, a write to a pipe signals whoever was
# named by fcntl F_SETOWN (the signal chosen by F_SETSIG) or ioctl FIOSETOWN; no audit event
# shows it, and a root owner may signal any process. Then other processes' limits (prlimit).
OWNER_SIGNALLER = r"""
import fcntl, os, resource, signal, struct

def _owned(pid, number, how):
    read_end, write_end = os.pipe()
    try:
        if how == "fcntl":
            fcntl.fcntl(read_end, fcntl.F_SETOWN, pid)
        else:
            fcntl.ioctl(read_end, 0x8901, struct.pack("i", pid))  # FIOSETOWN
        fcntl.fcntl(read_end, 10, number)  # F_SETSIG
        fcntl.fcntl(read_end, fcntl.F_SETFL, fcntl.fcntl(read_end, fcntl.F_GETFL) | os.O_ASYNC)
        os.write(write_end, b"x")
    finally:
        os.close(read_end)
        os.close(write_end)

for _name, _send in (
    ("F_SETOWN judge", lambda: _owned(os.getppid(), signal.SIGKILL, "fcntl")),
    ("F_SETOWN host", lambda: _owned(VICTIM, signal.SIGKILL, "fcntl")),
    ("F_SETOWN pid 1", lambda: _owned(INIT, signal.SIGINT, "fcntl")),
    ("FIOSETOWN judge", lambda: _owned(os.getppid(), signal.SIGKILL, "ioctl")),
    ("prlimit judge", lambda: resource.prlimit(os.getppid(), resource.RLIMIT_AS, (1 << 20,) * 2)),
    ("prlimit host", lambda: resource.prlimit(VICTIM, resource.RLIMIT_CPU, (0, 0))),
):
    try:
        _send()
        print(_name, "SENT", flush=True)
    except OSError as error:
        print(_name, "refused", type(error).__name__, flush=True)
"""


def test_no_level_lets_a_descriptors_owner_signal_the_judge_or_the_host(
    any_level: Sandbox,
) -> None:
    """A program that names its judge, PID 1 or a host process as the owner of a pipe (and
    sets another's limits) is refused at every level: the host process lives, and the run is
    the program's failure, never a machinery error (a judge killed or interrupted that way
    turned a wrong answer into an excluded error)."""
    suite, example = _he(0)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = OWNER_SIGNALLER.replace("VICTIM", str(victim.pid)) + WRONG
        # PID 1 of the sandbox's namespace; at the audit-hook level the host's init, which a
        # test must not risk interrupting: the judge stands in for it there
        init = "os.getppid()" if any_level.level == "audit-hook" else "1"
        code = code.replace("INIT", init)
        program, tests, _ = suite.program_and_tests(example, f"```python\n{code}```")
        result = any_level.run_tests(program, tests)  # raises if the judge was killed
        time.sleep(0.2)
        assert victim.poll() is None, "the program killed a host process"
        assert resource_limit(victim.pid) == "unchanged"
    finally:
        victim.kill()
        victim.wait()
    assert result.status == "failed" and result.tests["calls"] == 7, result
    names = ["F_SETOWN judge", "F_SETOWN host", "F_SETOWN pid 1", "FIOSETOWN judge"]
    names += ["prlimit judge", "prlimit host"]
    assert result.stdout_tail.splitlines() == [f"{n} refused PermissionError" for n in names]


def resource_limit(pid: int) -> str:
    """Whether ``pid``'s CPU limit is still unlimited (as ``sleep`` starts here)."""
    line = [x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if "cpu time" in x]
    return "unchanged" if line[0].split()[3] == "unlimited" else line[0]


# the judge's caught signals (SigCgt), read through a descriptor of /proc (its parent's)
CAUGHT = r"""
import os
_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
_fd = os.open(f"{os.getppid()}/status", os.O_RDONLY, dir_fd=_proc)
_status = os.read(_fd, 1 << 16).decode()
print(*[line.split()[1] for line in _status.splitlines() if line.startswith("SigCgt:")])
"""


def test_the_judge_catches_no_signal(any_level: Sandbox) -> None:
    """PID 1 of a PID namespace receives from inside only the signals it catches: the judge
    catches none (Python's SIGINT handler reset), so no way of signalling it from the
    program's side can end or interrupt it."""
    suite, example = _he(0)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{CAUGHT}{WRONG}```")
    result = any_level.run_tests(program, tests)
    assert result.status == "failed", result
    assert int(result.stdout_tail.split()[0], 16) == 0, result.stdout_tail


def test_a_launcher_folder_removed_mid_session_is_made_again(full: Sandbox) -> None:
    suite, example = _he(0)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{RIGHT}```")
    assert full.run_tests(program, tests).passed
    shutil.rmtree(root_layout(full.python).code)  # a cleaner of /tmp, mid-session
    assert full.run_tests(program, tests).passed


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        found += [int(child) for child in children]
        todo += [int(child) for child in children]
    return found


def test_a_judge_dead_before_it_reports_is_a_sandbox_failure(
    full: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process under the launcher is killed mid-run (as an OOM killer or an operator
    might): correct code gets no score of 0, the run raises, and it was tried twice."""
    started: list[int] = []

    def dying(process: subprocess.Popen[bytes], timeout: float) -> bool:
        started.append(process.pid)
        time.sleep(0.5)
        for pid in _descendants(process.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return processes.wait_unreaped(process, timeout)

    monkeypatch.setattr(host, "wait_unreaped", dying)
    suite, example = _he(0)
    slow = "import time\ntime.sleep(3)\n" + RIGHT
    program, tests, _ = suite.program_and_tests(example, f"```python\n{slow}```")
    with pytest.raises(SandboxFailure, match="judge ended before it reported"):
        full.run_tests(program, tests)
    assert len(started) == 2


def test_a_failed_set_up_is_a_sandbox_failure_and_an_error_row(
    full: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure = Sandbox._config

    def broken(self: Sandbox, *args: Any, **kwargs: Any) -> dict[str, Any]:
        config = configure(self, *args, **kwargs)
        config["hidden"] = [*config["hidden"], "/work"]  # "visible": the launcher refuses
        return config

    monkeypatch.setattr(Sandbox, "_config", broken)
    monkeypatch.setattr(coding, "default_sandbox", lambda: full)
    monkeypatch.setattr(policy, "_state", {"allowed": True, "warned": True})
    suite, example = _he(0)
    with pytest.raises(SandboxFailure, match=r"was not set up: .*hidden host paths: /work"):
        suite.score(example, f"```python\n{RIGHT}```")


# -- whole-program limits ------------------------------------------------------------------

# writes 16 MiB files (the per-file limit) until the disk says no, up to 256 MiB, from four
# processes at once: what one process cannot do alone
DISK_FILL = r"""
import os

def _fill(tag):
    written = 0
    for n in range(4):
        try:
            with open(f"fill-{tag}-{n}", "wb") as handle:
                for _ in range(16):
                    handle.write(b"x" * (1 << 20))
                    handle.flush()
                    written += 1 << 20
        except OSError:
            break
    return written

children = []
for tag in range(4):
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _fill(tag) >= 0 else 1)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
total = sum(os.path.getsize(name) for name in os.listdir(".") if name.startswith("fill-"))
print("WROTE", total, flush=True)
"""


def test_a_disk_fill_stops_at_the_work_limit_and_leaves_nothing(
    full: Sandbox, scratch: Path
) -> None:
    suite, example = _he(0)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{DISK_FILL + WRONG}```")
    limits = SandboxLimits(cpu_seconds=10, wall_seconds=30, work_bytes=32 << 20)
    result = full.run_tests(program, tests, limits=limits)
    assert result.status == "failed", result
    wrote = int(result.stdout_tail.split("WROTE ")[1].split()[0])
    assert 16 << 20 <= wrote <= 32 << 20, wrote
    left = [p.name for p in scratch.iterdir() if not p.name.startswith("modelbench-sandbox-code")]
    assert left == []


# four processes of 300 MiB each: every one within the per-process limit, together over it;
# the answer is defined only when all four held their memory
MEMORY_HOG = r"""
import os, time

def _hold():
    block = bytearray(300 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return block

children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        _hold()
        time.sleep(1)
        os._exit(0)
    children.append(pid)
held = _hold()
if all(os.waitpid(pid, 0)[1] == 0 for pid in children):
    def has_close_elements(numbers, threshold):
        return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
"""


def test_memory_is_limited_for_the_whole_program(full: Sandbox, scratch: Path) -> None:
    if cgroups.cgroup_base("memory") is None:
        pytest.skip("this host gives us no memory cgroup (the limit is per process)")
    suite, example = _he(0)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{MEMORY_HOG}```")
    result = full.run_tests(program, tests)  # 512 MiB for the whole program
    assert result.status == "crashed" and "for the whole program exceeded" in result.reason
    assert result.isolation["cgroup"] == ["pids", "memory"]
    assert full.describe()["limits"]["memory_scope"] == "whole program (cgroup)"
    left = [p.name for p in scratch.iterdir() if not p.name.startswith("modelbench-sandbox-code")]
    assert left == []


class _Unwatched(cgroups.ProgramCgroup):
    """A "cgroup" whose process list is a plain file: writing to it succeeds, but no process
    is ever in it (what a write that seemed to hold looks like)."""

    def destroy(self, timeout: float = 5.0) -> None:
        del timeout  # nothing to kill or remove


@pytest.mark.parametrize("level", FULL_LEVELS)
def test_limits_are_whole_program_only_when_the_run_was_seen_inside_its_cgroup(
    level: str, make_sandbox: MakeSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The join is checked in /proc/self/cgroup, not taken from the write: a run that is not
    inside its cgroup is said to be limited per process, in the run and in the summary."""
    made: list[Path] = []

    def unwatched(name: str, max_pids: int, memory_bytes: int) -> cgroups.ProgramCgroup:
        folder = tmp_path / name
        folder.mkdir(mode=0o755)
        (folder / "cgroup.procs").touch(mode=0o666)
        made.append(folder)
        return _Unwatched((folder,), ("pids", "memory"))

    monkeypatch.setattr(host.ProgramCgroup, "create", staticmethod(unwatched))
    sandbox = make_sandbox(level, LIMITS)
    result = sandbox.run("print('ok')")
    assert result.passed, result
    assert (made[-1] / "cgroup.procs").read_text().strip().isdigit()  # the write held
    assert result.isolation["cgroup"] == [] and "cgroup" in result.isolation["cgroup_error"]
    limits = sandbox.describe()["limits"]
    assert limits["memory_scope"].startswith("per process"), limits
    assert limits["processes_scope"].startswith("per process"), limits


def _cgroup_v2_folder() -> Path | None:
    """This process's cgroup in a cgroup v2 hierarchy (the unified one, or the only one)."""
    mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
    v2 = [fields[1] for fields in mounts if fields[2] == "cgroup2"]
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = [line[3:] for line in lines if line.startswith("0::")]
    return Path(v2[0] + own[0]) if v2 and own else None


def test_as_root_bubblewrap_joins_a_cgroup_v2_cgroup(
    make_sandbox: MakeSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On cgroup v2 a process may only be moved by one who may write the process list of
    the cgroup it comes from: as root, the host writes the pid of the shell that starts
    bubblewrap (the sandbox user) into the run's ``cgroup.procs`` before letting it go on,
    and the run is seen inside."""
    if os.geteuid() != 0:
        pytest.skip("as root only (otherwise bubblewrap runs as the caller)")
    own = _cgroup_v2_folder()
    parent = own / f"modelbench-test-{os.getpid()}" if own else None
    try:
        assert parent is not None
        parent.mkdir()
    except (AssertionError, OSError) as error:
        pytest.skip(f"no cgroup v2 hierarchy to make a cgroup in here: {error!r}")

    def on_v2(name: str, max_pids: int, memory_bytes: int) -> cgroups.ProgramCgroup:
        (parent / name).mkdir()
        return cgroups.ProgramCgroup((parent / name,), ("pids",))

    monkeypatch.setattr(host.ProgramCgroup, "create", staticmethod(on_v2))
    try:
        result = make_sandbox("bwrap", LIMITS).run("print('ok')")
    finally:
        parent.rmdir()
    assert result.passed, result
    assert result.isolation["cgroup"] == ["pids"], result.isolation


# -- seccomp ---------------------------------------------------------------------------------

SYSCALLS = r"""
import socket
print(*[line.split()[1] for line in open("/proc/self/status") if line.startswith("Seccomp:")])
for name in ("AF_VSOCK", "AF_PACKET"):
    try:
        socket.socket(getattr(socket, name), socket.SOCK_STREAM if name == "AF_VSOCK" else 3)
        print(name, "opened")
    except OSError as error:
        print(name, "refused", error.errno)
"""
# what subprocess.Popen does after its audit event: a fork and an exec the audit hook never sees
FORK_EXEC = r"""
import _posixsubprocess, os
r, w = os.pipe()
pid = _posixsubprocess.fork_exec(
    [b"/bin/sh", b"-c", b"echo FORKED"], [b"/bin/sh"], True, (w,), None, None,
    -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, None, -1, None, False,
)
os.close(w)
said = b""
while chunk := os.read(r, 200):  # the child writes its error in several pieces
    said += chunk
print("CHILD SAID", said, flush=True)
os.waitpid(pid, 0)
"""


def _needs_seccomp() -> None:
    if seccomp.program_filter(spawn=True) is None:
        if in_ci():
            pytest.fail("CI runs with libseccomp (pyseccomp): the filter must be there")
        pytest.skip("libseccomp is not available here: programs run without the filter")


def test_refused_system_calls_fail_with_eperm(any_level: Sandbox) -> None:
    _needs_seccomp()
    result = any_level.run(SYSCALLS)
    assert result.status == "passed", result.stderr_tail
    lines = result.stdout_tail.splitlines()
    assert lines[0] == "2"  # a seccomp filter holds
    assert lines[1:] == ["AF_VSOCK refused 1", "AF_PACKET refused 1"]
    assert result.isolation["seccomp"] is True
    assert any_level.describe()["limits"]["seccomp"] is True


def test_the_weak_level_fork_exec_starts_nothing(make_sandbox: MakeSandbox) -> None:
    _needs_seccomp()
    weak = make_sandbox("audit-hook", LIMITS)
    result = weak.run(FORK_EXEC)
    assert "FORKED" not in result.stdout_tail, result.stdout_tail
    assert "CHILD SAID b'OSError:1:" in result.stdout_tail  # EPERM from execve


def test_without_seccomp_the_weak_level_refuses_posixsubprocess(
    make_sandbox: MakeSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Sandbox, "_seccomp", staticmethod(lambda: None))
    weak = make_sandbox("audit-hook", LIMITS)
    result = weak.run(FORK_EXEC)
    assert result.status == "failed" and "starting programs is not allowed" in result.reason
    assert "FORKED" not in result.stdout_tail and result.isolation["seccomp"] is False


# the program filter loaded into a host process (the sandbox's own interpreter has no ctypes,
# so pure Python cannot make these calls there): each refused call fails as the filter says
FILTERED_SYSCALLS = r"""
import ctypes, sys
from pytest_modelbench.sandbox import launcher, namespaces, seccomp
libc = namespaces.libc()
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert launcher.load_filter(seccomp.program_filter(spawn=True))
raw = ctypes.CDLL(None, use_errno=True)
numbers = {"io_uring_setup": 425, "userfaultfd": 323, "bpf": 321, "perf_event_open": 298,
           "keyctl": 250, "ptrace": 101, "unshare": 272, "setns": 308, "mount": 165,
           "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "clone3": 435}
for name, number in numbers.items():
    result = raw.syscall(number, 0, 0, 0, 0, 0)
    print(name, result, ctypes.get_errno())
# clone with a namespace flag (CLONE_NEWUSER | SIGCHLD) is refused before any child exists
print("clone_newuser", raw.syscall(56, 0x10000000 | 17, 0, 0, 0, 0), ctypes.get_errno())
# a descriptor's owner, who is signalled when it is ready (O_ASYNC), and others' limits
import os
read_end, _ = os.pipe()
parent, owner, limit = os.getppid(), ctypes.c_int(os.getppid()), (ctypes.c_uint64 * 2)(64, 64)
for name, number, args in (
    ("F_SETOWN", 72, (read_end, 8, parent)),
    ("F_SETOWN_high", 72, (read_end, (1 << 32) | 8, parent)),  # the kernel reads 32 bits
    ("F_SETSIG", 72, (read_end, 10, 9)),
    ("F_SETOWN_EX", 72, (read_end, 15, ctypes.c_void_p(ctypes.addressof(owner)))),
    ("FIOSETOWN", 16, (read_end, 0x8901, ctypes.c_void_p(ctypes.addressof(owner)))),
    ("SIOCSPGRP", 16, (read_end, 0x8902, ctypes.c_void_p(ctypes.addressof(owner)))),
    ("prlimit64_other", 302, (parent, 7, ctypes.c_void_p(ctypes.addressof(limit)), 0)),
):
    print(name, raw.syscall(number, *args), ctypes.get_errno())
# what programs do need still works: the descriptor's flags, their own limits, others' read
assert raw.syscall(72, read_end, 3, 0) >= 0  # F_GETFL
assert raw.syscall(302, 0, 7, ctypes.c_void_p(ctypes.addressof(limit)), 0) == 0
assert raw.syscall(302, parent, 7, 0, ctypes.c_void_p(ctypes.addressof(limit))) == 0
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 system call numbers")
def test_seccomp_refuses_the_kernels_attack_surface() -> None:
    """io_uring, userfaultfd, bpf, perf events, keyrings, ptrace, mounts, process descriptors,
    a descriptor's signalled owner (fcntl F_SETOWN/F_SETSIG/F_SETOWN_EX, ioctl FIOSETOWN/
    SIOCSPGRP), another process's limits and new namespaces (unshare, setns, clone with
    CLONE_NEW*) fail with EPERM; clone3 answers ENOSYS, so libc falls back to clone, whose
    namespace flags are refused."""
    _needs_seccomp()
    done = subprocess.run(
        [sys.executable, "-c", FILTERED_SYSCALLS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    calls = {
        name: (int(r), int(e)) for name, r, e in (x.split() for x in done.stdout.split("\n") if x)
    }
    assert calls.pop("clone3") == (-1, 38)  # ENOSYS
    assert calls == dict.fromkeys(calls, (-1, 1)) and len(calls) == 20, calls  # EPERM
