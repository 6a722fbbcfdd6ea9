"""The program's side of the sandbox: run it as ``__main__``; under the judge, answer calls.

Everything here runs in the untrusted process. Once the program's first
instruction has run it may have replaced any of this code, so nothing this
side sends is trusted: :mod:`pytest_modelbench.sandbox.judge` checks and
decodes every reply. Standard library only.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
import traceback
import types
from typing import Any, NoReturn

from pytest_modelbench.sandbox import wire

MAX_TEXT = 500  # characters of an exception message sent to the judge
MAX_PRINTED = 5  # tracebacks printed for calls that raised (tests may expect many to raise)


def exec_program(path: str) -> dict[str, Any]:
    """Execute the program as ``__main__``, as ``python program.py`` would; its globals."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
    exec(compile(source, path, "exec"), module.__dict__)
    return module.__dict__


def print_error(error: BaseException, path: str) -> None:
    """Print the program's exception like Python does, from its first frame in the program."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != path:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)
    sys.stderr.flush()


def run_program(path: str) -> None:
    """Execute the program; on its own exception print it and ``sys.exit(1)``."""
    try:
        exec_program(path)
    except SystemExit:
        raise
    except BaseException as error:  # the program's own failure: print it like Python does
        print_error(error, path)
        sys.exit(1)


def exit_code(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code & 0xFF
    print(error.code, file=sys.stderr)
    return 1


def finish(code: int) -> NoReturn:
    """Flush the program's output and end the process (no atexit hooks, no cleanup)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a broken stream must not change the exit code
            stream.flush()
    os._exit(code)


class Session:
    """The program's side of a judged run: its objects the judge may call or pass back,
    by number (kept alive), and how many calls raised."""

    def __init__(self) -> None:
        self.objects: list[Any] = []
        self.numbers: dict[int, int] = {}  # id(object) -> number
        self.raised = 0  # calls that raised so far

    def register(self, value: Any) -> Any:
        number = self.numbers.get(id(value))
        if number is None:
            number = self.numbers[id(value)] = len(self.objects)
            self.objects.append(value)
        return wire.handle(number)

    def resolve(self, number: int) -> Any:
        return self.objects[number]

    def encode(self, value: Any) -> Any:
        try:
            return wire.encode(value, self.register)
        except Exception:  # a container that contains itself, a subclass that will not convert
            return self.register(value)


def _error(error: BaseException) -> list[str]:
    try:
        text = str(error)
    except Exception:
        text = ""
    return [type(error).__name__, text[:MAX_TEXT]]


def _describe(value: Any, session: Session) -> Any:
    if isinstance(value, types.ModuleType):
        return ["m", value.__name__]
    return session.encode(value)


def answer(message: Any, namespace: dict[str, Any], session: Session, path: str) -> Any:
    """The reply to one request of the judge."""
    op = message.get("op") if isinstance(message, dict) else None
    if op == "describe":
        names = [name for name in message["names"] if name in namespace]
        return {"names": {name: _describe(namespace[name], session) for name in names}}
    if op != "call":
        return {"raised": ["ValueError", f"unknown request {op!r}"]}
    try:
        function = session.resolve(message["target"])
        args = [wire.decode(arg, session.resolve) for arg in message["args"]]
        kwargs = {key: wire.decode(value, session.resolve) for key, value in message["kwargs"]}
        result = function(*args, **kwargs)
    except Exception as error:
        session.raised += 1
        if session.raised <= MAX_PRINTED:
            print_error(error, path)
        return {"raised": _error(error)}
    return {"value": session.encode(result)}


def serve(channel: wire.Channel, path: str) -> NoReturn:
    """Wait for the judge's go, run the program, then answer until the judge hangs up."""
    if channel.receive() != {"op": "start"}:
        finish(0)
    try:
        namespace = exec_program(path)
    except SystemExit as error:
        finish(exit_code(error))
    except BaseException as error:  # the program's own failure: print it and tell the judge
        print_error(error, path)
        channel.send({"raised": _error(error)})
        finish(1)
    channel.send({"loaded": True})
    session = Session()
    try:
        while (message := channel.receive()) is not None:
            channel.send(answer(message, namespace, session, path))
    except SystemExit as error:
        finish(exit_code(error))
    except BaseException:  # a broken pipe, an interrupt: the judge sees the end of input
        finish(1)
    finish(0)
