"""The judge's wire format and the semantics tests see across its boundary.

The wire format is a parser of untrusted input, so it is tested directly: what
``encode`` produces comes back as equal values of exactly the same type, a
subclass arrives as its base type, and anything ``encode`` cannot have produced
is rejected. The rest runs small programs through :meth:`Sandbox.run_tests`.
"""

from __future__ import annotations

import json
import os
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from typing import Any

import pytest

from pytest_modelbench.sandbox import HiddenTests, Sandbox, wire


def _no_handles(value: Any) -> Any:
    raise AssertionError(f"{value!r} should have been encoded as data")


def _round_trip(value: Any) -> Any:
    data = json.loads(json.dumps(wire.encode(value, _no_handles)))
    return wire.decode(data, lambda number: ("handle", number))


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -5,
        pytest.param(10**5000, id="int beyond the decimal digit limit"),
        1.5,
        float("inf"),
        1 + 2j,
        "é \ud800",
        b"\x00\xff",
        bytearray(b"x"),
        [1, (2, frozenset({3}))],
        {"a": [1.0], (1, 2): None},
        Counter("abracadabra"),
        OrderedDict(b=1, a=2),
        defaultdict(list, a=[1]),
        deque([1, 2]),
        range(3, -10, -2),
        {1: "a"}.keys(),
        {1: "a"}.items(),
    ],
)
def test_values_come_back_equal_and_of_the_same_type(value: Any) -> None:
    back = _round_trip(value)
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, defaultdict):
        assert back.default_factory is list


def test_iterators_and_values_views_arrive_with_their_items() -> None:
    """Generators, maps and ``dict.values()`` compare by identity, so they are checked by content."""
    arrived = _round_trip(x * x for x in range(3))
    assert type(arrived) is type(iter([])) and list(arrived) == [0, 1, 4]
    assert list(_round_trip(map(str, [1, 2]))) == ["1", "2"]
    values = _round_trip({"a": 1, "b": [2]}.values())
    assert type(values) is type({}.values()) and list(values) == [1, [2]]
    counts = _round_trip(defaultdict(lambda: 0, a=1))  # a factory that does not travel
    assert counts == {"a": 1} and counts.default_factory is None


def test_a_subclass_arrives_as_its_base_type_without_its_methods() -> None:
    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    back = _round_trip([Liar(3)])
    assert back == [3] and type(back[0]) is int
    assert back[0] != 4


def test_other_objects_become_handles() -> None:
    handles: list[object] = []

    def register(value: object) -> Any:
        handles.append(value)
        return wire.handle(len(handles) - 1)

    thing = object()
    data = wire.encode({"x": thing}, register)
    assert handles == [thing]
    assert wire.decode(data, lambda number: ("handle", number)) == {"x": ("handle", 0)}


@pytest.mark.parametrize(
    "data",
    [
        1,
        1.5,
        {"a": 1},
        [],
        ["zz", "1"],
        ["i"],
        ["i", 5],
        ["i", "zz"],
        ["f", "1.5", "2"],
        ["l", "x"],
        ["d", [[1]]],
        ["h", -1],
        ["h", "1"],
        ["S", [["l", []]]],  # an unhashable member
        ["D", "os.system", []],  # only builtin factories travel
        ["m", "math"],  # modules are never values
    ],
)
def test_anything_encode_cannot_produce_is_rejected(data: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        wire.decode(data, lambda number: number)


@pytest.mark.parametrize(
    "line",
    [b'{"value": 1.5}\n', b'{"value": NaN}\n', b'{"value": Infinity}\n', b"x" * 200 + b"\n"],
)
def test_the_channel_rejects_bare_floats_constants_and_long_lines(line: bytes) -> None:
    read, write = os.pipe()
    try:
        os.write(write, line)
        with pytest.raises(ValueError):
            wire.Channel(read, write, limit=100).receive()
    finally:
        os.close(read)
        os.close(write)


@pytest.fixture(params=["bwrap", "namespaces", "audit-hook"], scope="module")
def judged(request: pytest.FixtureRequest, make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    return make_sandbox(request.param)


PROGRAM = """
class Box:
    def __init__(self, value):
        self.value = value

def unbox(box, scale=1):
    return box.value * scale

def parse(text):
    return int(text)

def stop():
    raise StopIteration

def squares(n):
    return (i * i for i in range(n))
"""


@pytest.mark.parametrize(
    ("case", "passes"),
    [
        ("assert unbox(Box(3), scale=2) == 6", True),  # the program's objects travel back
        ("assert Box(3) != Box(3)", True),  # and equal only themselves
        (
            "try:\n    parse('x')\nexcept ValueError as error:\n    assert 'x' in str(error)",
            True,
        ),  # builtin exceptions are rebuilt for the tests to catch
        ("assert list(map(lambda _: stop(), [1])) == []", False),  # StopIteration is not
        ("assert parse('7') == 7.0 and type(parse('7')) is int", True),
        ("assert sorted(squares(3)) == [0, 1, 4]", True),  # an iterator arrives as its items
        ("assert squares(3) == [0, 1, 4]", False),  # and is no list, as in Python
        ("unbox(lambda: 1)", False),  # only data and the program's objects cross
        ("Box(1).value", False),  # the program's objects have no attributes here
    ],
)
def test_what_tests_see_across_the_boundary(judged: Sandbox, case: str, passes: bool) -> None:
    result = judged.run_tests(PROGRAM, HiddenTests(cases=(case,)))
    assert result.passed is passes, (result.reason, result.stderr_tail)


def test_tests_that_swallow_the_programs_exit_still_fail(judged: Sandbox) -> None:
    program = "import os\ndef f():\n    os._exit(0)\n"
    case = "try:\n    f()\nexcept BaseException:\n    pass"
    result = judged.run_tests(program, HiddenTests(cases=(case,)))
    assert result.status == "failed"
    assert "ended before its tests finished" in result.reason


def test_every_case_must_complete(judged: Sandbox) -> None:
    program = "def f(x):\n    return x\n"
    result = judged.run_tests(program, HiddenTests(cases=("assert f(1) == 1", "assert f(2) == 3")))
    assert result.status == "failed"
    assert result.reason == "AssertionError (test 2 of 2)"
    assert dict(result.tests) == {"total": 2, "passed": 1, "calls": 2}
    with pytest.raises(ValueError, match="at least one case"):
        judged.run_tests(program, HiddenTests(cases=()))


def test_names_the_tests_use_from_builtins_and_the_prelude_stay_trusted(judged: Sandbox) -> None:
    """A program's own ``abs`` or helper never replaces the one the tests rely on; a name in
    ``bind`` is taken from the program even where it shadows a builtin or the prelude."""
    program = (
        "def abs(x):\n    return 0\ndef helper():\n    return 1\ndef sum(a, b):\n    return a - b\n"
    )
    tests = HiddenTests(
        cases=("assert abs(-2) == 2 and helper() == 2 and sum(5, 3) == 2",),
        prelude="def helper():\n    return 2\n",
        bind=("sum",),
    )
    result = judged.run_tests(program, tests)
    assert result.passed, (result.reason, result.stderr_tail)
