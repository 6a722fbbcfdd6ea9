"""The judge: runs a benchmark's tests against a program whose code it never executes.

Why the verdict cannot be forged: the judge is a separate process that runs the
tests itself and receives from the program's process only plain values in a
strict encoding, rebuilt as fresh builtin objects, so no object, patched
builtin, exit or output of the program takes part in a comparison or in the
count of finished tests. The program's process is forked before the judge reads
the tests, keeps no descriptor but its pipes to the judge and has no
capabilities, while the judge and the launcher are non-dumpable (no ptrace, no
``/proc/PID/mem`` or ``/proc/PID/fd``), so the tests, the judge's memory and its
socket to the host are out of the program's reach.

Why the calls tell the program nothing: a failed ``assert`` in the tests is recorded
and the tests go on (:func:`guard_asserts`, applied by the host), and every case runs, so the program is called the same way
whether its answers are right or wrong (only an exception outside an ``assert``,
such as one from using a malformed answer, ends a case early). With no state
surviving between runs, it cannot learn the expected values from one rollout to
the next.

Standard library only: the launcher imports it in every judged run.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import linecache
import os
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from pytest_modelbench.sandbox import wire

NOT_REBUILT = (StopIteration, StopAsyncIteration)  # would end the tests' loops instead of failing
NAMESPACE = "__tests__"
ASSERT_FAILED = "__modelbench_assert_failed__"  # records a failed assert (in the tests' namespace)
ASSERT_ERROR = "__modelbench_assert_error__"
MAX_PRINTED = 3  # tracebacks of failed asserts kept for the host (the first names the reason)
MAX_OUTPUT = 8000  # characters of those tracebacks in the verdict


class Broken(BaseException):
    """The program's process ended or broke the protocol, so the tests cannot finish.

    Not an ``Exception``: the tests' own ``except Exception`` must not swallow it
    (and :attr:`Program.broken` fails the run even if a bare ``except`` does).
    """


class ProgramError(Exception):
    """An exception the program raised, of a type the judge does not rebuild."""


class Remote:
    """An object living in the program's process: it can be called and passed back,
    and equals only itself (no behaviour of the program's own is reachable)."""

    __slots__ = ("_program", "number")

    def __init__(self, program: Program, number: int) -> None:
        self._program = program
        self.number = number

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._program.call(self.number, args, kwargs)

    def __repr__(self) -> str:
        return f"<object {self.number} of the program>"


def _pair(raised: Any) -> tuple[str, str]:
    if not (type(raised) is list and len(raised) == 2 and all(type(x) is str for x in raised)):
        raise ValueError(f"not an exception: {raised!r:.80}")
    return raised[0], raised[1]


def _rebuild(raised: Any) -> Exception:
    """The exception the program reported, as a builtin type where it is one."""
    name, text = _pair(raised)
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, NOT_REBUILT):
        with contextlib.suppress(Exception):  # types whose constructor wants more than a message
            return kind(text)
    return ProgramError(f"{name}: {text}")


class Program:
    """The judge's end of the pipes to the program's process; checks and decodes every reply."""

    def __init__(self, channel: wire.Channel) -> None:
        self.channel = channel
        self.calls = 0
        self.broken: str | None = None
        self._remotes: dict[int, Remote] = {}

    def start(self) -> None:
        """Let the program run its top level; :class:`Broken` if it does not finish it."""
        reply = self._request({"op": "start"}, "loaded", "raised")
        if "raised" in reply:
            name, text = self._checked(_pair, reply["raised"])
            self._fail(f"the program raised {name}: {text} before its tests ran")
        if reply["loaded"] is not True:
            self._fail("the program sent a malformed reply")

    def describe(self, names: list[str]) -> dict[str, Any]:
        """The encoded values of those ``names`` the program defines."""
        found = self._request({"op": "describe", "names": names}, "names")["names"]
        if type(found) is not dict or not set(found) <= set(names):
            self._fail("the program sent a malformed reply")
        return found

    def call(self, number: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        message = {
            "op": "call",
            "target": number,
            "args": [wire.encode(arg, _handle_of) for arg in args],
            "kwargs": [[key, wire.encode(value, _handle_of)] for key, value in kwargs.items()],
        }
        reply = self._request(message, "value", "raised")
        if "raised" in reply:
            raise self._checked(_rebuild, reply["raised"])
        return self.value(reply["value"])

    def value(self, data: Any) -> Any:
        """Fresh builtin objects (and :class:`Remote` handles) from encoded ``data``."""
        return self._checked(lambda d: wire.decode(d, self.remote), data)

    def remote(self, number: int) -> Remote:
        if number not in self._remotes:
            self._remotes[number] = Remote(self, number)
        return self._remotes[number]

    def _checked(self, parse: Callable[[Any], Any], data: Any) -> Any:
        try:
            return parse(data)
        except (ValueError, TypeError, RecursionError, OverflowError) as error:
            self._fail(f"the program sent a malformed value ({error})")

    def _request(self, message: Any, *keys: str) -> dict[str, Any]:
        if self.broken is not None:
            raise Broken(self.broken)
        try:
            self.channel.send(message)
            reply = self.channel.receive()
        except OSError:
            reply = None
        except (ValueError, RecursionError) as error:
            self._fail(f"the program broke the protocol ({error})")
        if reply is None:
            self._fail("the program's process ended before its tests finished")
        if type(reply) is not dict or len(reply) != 1 or next(iter(reply)) not in keys:
            self._fail(f"the program sent an unexpected reply: {reply!r:.80}")
        return reply

    def hang_up(self) -> None:
        """Close the program's input: its process sees the end and exits (idempotent)."""
        if self.channel.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.channel.write_fd)
            self.channel.write_fd = -1

    def _fail(self, reason: str) -> NoReturn:
        self.broken = self.broken or reason
        raise Broken(self.broken)


def _handle_of(value: Any) -> Any:
    if type(value) is Remote:
        return wire.handle(value.number)
    raise TypeError(
        f"the tests passed a {type(value).__name__} to the program: only plain data "
        "and the program's own objects can cross"
    )


def _code_names(code: types.CodeType) -> Iterator[str]:
    """Every global (and attribute) name ``code`` and the code nested in it use."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def guard_asserts(source: str) -> str:
    """``source`` with each ``assert test, msg`` as ``try: assert test, msg`` / ``except
    Exception as e: record(e)``, so a failed assert is counted and the tests go on.

    Run on the host (:meth:`HiddenTests.request <pytest_modelbench.sandbox.HiddenTests.request>`):
    the judge compiles the result as it is, without importing ``ast`` on every run."""
    import ast  # function-level: the host's side only (the judge never needs it)

    class GoOn(ast.NodeTransformer):
        def visit_Assert(self, node: ast.Assert) -> ast.Try:
            record = ast.Call(
                func=ast.Name(ASSERT_FAILED, ast.Load()),
                args=[ast.Name(ASSERT_ERROR, ast.Load())],
                keywords=[],
            )
            handler = ast.ExceptHandler(
                type=ast.Name("Exception", ast.Load()), name=ASSERT_ERROR, body=[ast.Expr(record)]
            )
            guarded = ast.Try(body=[node], handlers=[handler], orelse=[], finalbody=[])
            return ast.copy_location(guarded, node)

    tree = ast.fix_missing_locations(GoOn().visit(ast.parse(source)))
    return ast.unparse(tree) + "\n"


def _compile(source: str, filename: str) -> types.CodeType:
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec", dont_inherit=True)


class Failures:
    """The failed asserts and cases of one run: how many, and the first few errors, kept as
    they are (formatted only once the program's process is gone: :meth:`describe`), so that
    a failed assert costs the judge no more time than a passed one while the program runs."""

    def __init__(self) -> None:
        self.count = 0
        self.errors: list[BaseException] = []

    def record(self, error: BaseException) -> None:
        self.count += 1
        if len(self.errors) < MAX_PRINTED:
            self.errors.append(error)

    def describe(self) -> tuple[str | None, str]:
        """The first failure's last line, and the tracebacks of the first few (the tests' own
        frames only), for the host: never written anywhere the program can read."""
        first: str | None = None
        output = []
        for error in self.errors:
            lines = _format_failure(error)
            output.append("".join(lines))
            if first is None:
                first = lines[-1].strip()
        return first, "".join(output)[-MAX_OUTPUT:]


def _parse(request: Any) -> tuple[str, list[str], list[str]]:
    """The prelude, cases and bound names of a request from the host."""
    if not isinstance(request, dict):
        raise ValueError(f"not a request: {request!r:.80}")
    prelude, cases, bind = request.get("prelude"), request.get("cases"), request.get("bind")
    if not (
        isinstance(prelude, str)
        and isinstance(cases, list)
        and isinstance(bind, list)
        and all(isinstance(item, str) for item in [*cases, *bind])
    ):
        raise ValueError("a request has a prelude (str), cases and bind (lists of str)")
    return prelude, cases, bind


def _bind(program: Program, namespace: dict[str, Any], wanted: list[str]) -> None:
    """Put the program's definitions of ``wanted`` names into the tests' namespace.

    A module is never taken from the program: a standard-library module the
    program imported under its own name is imported here, by the judge."""
    for name, data in program.describe(wanted).items():
        if type(data) is list and len(data) == 2 and data[0] == "m":
            if data[1] == name and name in sys.stdlib_module_names:
                namespace[name] = importlib.import_module(name)
            continue
        namespace[name] = program.value(data)


def _prepare(
    prelude: types.CodeType,
    cases: list[types.CodeType],
    bind: list[str],
    program: Program,
    failures: Failures,
) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": NAMESPACE, "__builtins__": builtins}
    namespace[ASSERT_FAILED] = failures.record
    exec(prelude, namespace)
    for name in bind:
        namespace.pop(name, None)
    namespace[ASSERT_FAILED] = failures.record  # the judge's own, whatever bind says
    used = {name for code in [prelude, *cases] for name in _code_names(code)}
    wanted = (used - set(namespace) - set(dir(builtins)) - {ASSERT_ERROR}) | set(bind)
    program.start()
    _bind(program, namespace, sorted(wanted))
    return namespace


def _format_failure(error: BaseException) -> list[str]:
    """The tests' traceback (their own frames only), line by line."""
    summary = traceback.TracebackException.from_exception(error)
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in summary.stack if frame.filename.startswith("<")]
    )
    return list(summary.format())


def run(request: Any, program: Program) -> dict[str, Any]:
    """Run every requested case against the program, each to its end (a failed assert is
    recorded, not the end of the case); the verdict record for the host."""
    prelude, cases, bind = _parse(request)
    failures = Failures()
    done, index, first_failed = 0, 0, None
    try:
        codes = [_compile(case, f"<test {i + 1}>") for i, case in enumerate(cases)]
        namespace = _prepare(_compile(prelude, "<prelude>"), codes, bind, program, failures)
        for index, code in enumerate(codes):
            before = failures.count
            try:
                exec(code, namespace)
            except Broken:
                raise
            except BaseException as error:  # whatever the tests raised fails them, as in Python
                failures.record(error)
            if failures.count == before:
                done += 1
            elif first_failed is None:
                first_failed = index
    except Broken:  # the program ended or broke the protocol: program.broken says how
        first_failed = index if first_failed is None else first_failed
    except BaseException as error:  # the tests could not be compiled or prepared
        failures.record(error)
    program.hang_up()  # the program's process ends before anything below is worked out
    first, output = failures.describe()
    failure = program.broken or first  # program.broken even if the tests swallowed it
    if failure is not None and first_failed is not None and len(cases) > 1:
        failure += f" (test {first_failed + 1} of {len(cases)})"
    return {
        "total": len(cases),
        "passed": done,
        "failure": failure,
        "calls": program.calls,
        "failed_asserts": failures.count,
        "output": output,
    }
