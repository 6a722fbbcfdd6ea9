"""The judge's wire format: newline-delimited JSON messages and a strict encoding of values.

Values of a few builtin and ``collections`` types are encoded as data (by
``type(x) is T``; a subclass of one of them travels as its base type's value,
so its own ``__eq__`` stays behind; an iterator travels as its items and
arrives as a list iterator); anything else becomes an opaque handle. Decoding
builds fresh objects of those types from the data, so nothing the program
defined reaches the side that decodes. Standard library only: the launcher
imports it in every sandboxed run.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
from collections.abc import Callable
from typing import Any

MAX_MESSAGE = 32 << 20  # bytes in one message; a longer reply is a protocol violation
MAX_ITEMS = 1 << 20  # items taken from an iterator; a longer one stays behind a handle

Opaque = Callable[[Any], Any]  # the encoding of a value that is not plain data
Resolve = Callable[[int], Any]  # the object behind a handle

# defaultdict factories that travel (by name): the judge rebuilds them from its own builtins
FACTORIES: dict[str, Callable[[], Any] | None] = {
    "None": None,
    **{kind.__name__: kind for kind in (int, float, str, list, tuple, set, frozenset, dict)},
}
# a subclass of one of these travels as the base type's value (never with its own methods)
BASES: tuple[type[Any], ...] = (
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    tuple,
    list,
    dict,
    set,
    frozenset,
)


def _items(value: Any, opaque: Opaque) -> list[Any]:
    return [encode(item, opaque) for item in value]


def _pairs_of(value: Any, opaque: Opaque) -> list[Any]:
    return [[encode(k, opaque), encode(v, opaque)] for k, v in value.items()]


def _factory_name(value: collections.defaultdict[Any, Any]) -> str:
    """The factory's name if it travels, else "None" (a plain mapping on arrival)."""
    factory = value.default_factory
    name = getattr(factory, "__name__", "None")
    return name if name in FACTORIES and FACTORIES[name] is factory else "None"


def _iterated(value: Any, opaque: Opaque) -> list[Any]:
    items = list(itertools.islice(value, MAX_ITEMS + 1))
    if len(items) > MAX_ITEMS:
        raise TypeError(f"an iterator longer than {MAX_ITEMS} items does not travel")
    return _items(items, opaque)


_EMPTY: dict[Any, Any] = {}
_KEYS: type[Any] = type(_EMPTY.keys())
_VALUES: type[Any] = type(_EMPTY.values())
_ITEMS: type[Any] = type(_EMPTY.items())


ENCODERS: dict[type, Callable[[Any, Opaque], list[Any]]] = {
    int: lambda v, _: ["i", format(v, "x")],  # hex: no limit on digits, unlike decimal
    float: lambda v, _: ["f", v.hex()],
    complex: lambda v, _: ["c", v.real.hex(), v.imag.hex()],
    bytes: lambda v, _: ["b", v.hex()],
    bytearray: lambda v, _: ["B", v.hex()],
    list: lambda v, o: ["l", _items(v, o)],
    tuple: lambda v, o: ["t", _items(v, o)],
    set: lambda v, o: ["S", _items(v, o)],
    frozenset: lambda v, o: ["F", _items(v, o)],
    collections.deque: lambda v, o: ["Q", _items(v, o)],
    dict: lambda v, o: ["d", _pairs_of(v, o)],
    collections.Counter: lambda v, o: ["C", _pairs_of(v, o)],
    collections.OrderedDict: lambda v, o: ["O", _pairs_of(v, o)],
    collections.defaultdict: lambda v, o: ["D", _factory_name(v), _pairs_of(v, o)],
    _KEYS: lambda v, o: ["K", _items(v, o)],
    _VALUES: lambda v, o: ["V", _items(v, o)],
    _ITEMS: lambda v, o: ["E", [[encode(k, o), encode(x, o)] for k, x in v]],
    range: lambda v, _: ["r", format(v.start, "x"), format(v.stop, "x"), format(v.step, "x")],
}
BUILDERS: dict[str, Callable[[list[Any]], Any]] = {
    "l": list,
    "t": tuple,
    "S": set,
    "F": frozenset,
    "Q": collections.deque,
    "d": dict,
    "C": lambda pairs: collections.Counter(dict(pairs)),
    "O": collections.OrderedDict,
    "K": lambda keys: dict.fromkeys(keys).keys(),
    "V": lambda values: dict(enumerate(values)).values(),
    "E": lambda pairs: dict(pairs).items(),
    "I": iter,
}
PAIRED = {"d", "C", "O", "E"}  # tags whose items are [key, value] pairs


def encode(value: Any, opaque: Opaque) -> Any:
    """``value`` as JSON-ready data; ``opaque`` encodes whatever is not plain data."""
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    encoder = ENCODERS.get(kind)
    if encoder is not None:
        return encoder(value, opaque)
    return _encode_other(value, opaque)


def _encode_other(value: Any, opaque: Opaque) -> Any:
    """A subclass of a plain type as its base type's value, an iterator (generator, map,
    zip...) as its items, a numpy scalar as Python's."""
    for base in BASES:
        if isinstance(value, base):
            return encode(base(value), opaque)
    if hasattr(type(value), "__next__") and iter(value) is value:
        return ["I", _iterated(value, opaque)]
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return encode(value.item(), opaque)
    return opaque(value)


def handle(number: int) -> list[Any]:
    """The encoding of the object behind handle ``number``."""
    return ["h", number]


def decode(data: Any, resolve: Resolve) -> Any:
    """Fresh builtin objects from ``data``; ``ValueError`` (or ``TypeError`` for an
    unhashable key) on anything that :func:`encode` cannot have produced."""
    if data is None or data is True or data is False or type(data) is str:
        return data
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError(f"not an encoded value: {_preview(data)}")
    tag, args = data[0], data[1:]
    if tag in BUILDERS and len(args) == 1 and type(args[0]) is list:
        items = _pairs(args[0], resolve) if tag in PAIRED else _decoded(args[0], resolve)
        return BUILDERS[tag](items)
    if tag == "D" and len(args) == 2 and args[0] in FACTORIES and type(args[1]) is list:
        return collections.defaultdict(FACTORIES[args[0]], _pairs(args[1], resolve))
    if tag == "h" and len(args) == 1 and type(args[0]) is int and args[0] >= 0:
        return resolve(args[0])
    if not args or not all(type(arg) is str for arg in args):
        raise ValueError(f"not an encoded value: {_preview(data)}")
    return _scalar(tag, args)


def _decoded(items: list[Any], resolve: Resolve) -> list[Any]:
    return [decode(item, resolve) for item in items]


def _pairs(items: list[Any], resolve: Resolve) -> list[tuple[Any, Any]]:
    if not all(type(item) is list and len(item) == 2 for item in items):
        raise ValueError(f"not encoded pairs: {_preview(items)}")
    return [(decode(key, resolve), decode(value, resolve)) for key, value in items]


def _scalar(tag: str, args: list[Any]) -> Any:
    if tag == "i" and len(args) == 1:
        return int(args[0], 16)
    if tag == "f" and len(args) == 1:
        return float.fromhex(args[0])
    if tag == "c" and len(args) == 2:
        return complex(float.fromhex(args[0]), float.fromhex(args[1]))
    if tag == "b" and len(args) == 1:
        return bytes.fromhex(args[0])
    if tag == "B" and len(args) == 1:
        return bytearray.fromhex(args[0])
    if tag == "r" and len(args) == 3:
        return range(*(int(arg, 16) for arg in args))
    raise ValueError(f"not an encoded value: {_preview([tag, *args])}")


def _preview(data: Any) -> str:
    return repr(data)[:80]


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON constant {name} is not part of the wire format")


class Channel:
    """One JSON message per line over a pair of file descriptors (a socket may be both)."""

    def __init__(self, read_fd: int, write_fd: int, limit: int = MAX_MESSAGE) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.limit = limit
        self._buffer = bytearray()
        self._scanned = 0

    def send(self, message: Any) -> None:
        text = json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n"
        data = memoryview(text.encode())
        while data:
            data = data[os.write(self.write_fd, data) :]

    def receive(self) -> Any:
        """The next message; None at end of input. ``ValueError`` for an over-long or
        malformed line (numbers other than integers and NaN/Infinity are malformed)."""
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                self._scanned = 0
                return json.loads(line, parse_float=_no_float, parse_constant=_no_constant)
            self._scanned = len(self._buffer)
            if self._scanned > self.limit:
                raise ValueError(f"message longer than {self.limit} bytes")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk


def _no_float(text: str) -> Any:
    raise ValueError(f"bare number {text[:20]} is not part of the wire format")
