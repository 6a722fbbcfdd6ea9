"""What a judged program can learn, what it is charged with, and what it can use.

* The judge tells the program nothing: its output (the failed asserts, with the tests' source
  and expected values) goes to the host in the verdict, never to the program's stdout or
  stderr, which the program may reopen through ``/proc/self/fd`` while it runs.
* Errors are charged to whoever caused them: whatever the program leaves behind (a very deep
  directory chain, files it made unremovable) fails the program, never the host's clean-up;
  a failure of the sandbox's own machinery (its launcher's folder removed, the judge dead
  before it reports, a set-up that fails) is a :class:`SandboxFailure`, never a wrong answer.

Each hostile case runs at both full levels (``bwrap`` and ``namespaces``), as users get them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_modelbench.sandbox import FULL_LEVELS, Sandbox, SandboxLimits
from pytest_modelbench.suites.coding import HumanEval
from pytest_modelbench.suites.contract import Example

LIMITS = SandboxLimits(cpu_seconds=10, wall_seconds=20, memory_bytes=512 << 20)


@pytest.fixture(params=FULL_LEVELS, scope="module")
def full(request: pytest.FixtureRequest, make_sandbox: Callable[..., Sandbox]) -> Sandbox:
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


def test_the_program_cannot_read_the_judges_output_while_it_runs(full: Sandbox) -> None:
    suite, example = _he(0)
    program, tests, _ = suite.program_and_tests(example, f"```python\n{REREAD}```")
    result = full.run_tests(program, tests)
    assert result.status == "failed" and result.tests["calls"] == 7, result
    assert "LEAKED" not in result.stdout_tail, result.stdout_tail
    assert "AssertionError" not in result.stderr_tail + result.stdout_tail
    # the host still has the judge's account of what failed
    assert "candidate(" in result.judge_tail and "AssertionError" in result.judge_tail
