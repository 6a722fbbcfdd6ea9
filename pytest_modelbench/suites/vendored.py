"""Vendored benchmark data: lazy, cached, checksum-verified loading from the installed package.

Files live in ``suites/data/<suite>/`` (built by ``scripts/vendor_data.py``)
and are listed with their SHA-256 in ``suites/data/SHA256SUMS``. Reading a
file verifies it against that manifest, so a damaged install fails loudly
instead of scoring against corrupted gold answers. A record is parsed when it is
first used (:class:`Records`): an item of 2000 MMLU questions parses those, not 14,042.
"""

from __future__ import annotations

import gc
import gzip
import hashlib
import json
import re
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from functools import cache, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

MANIFEST = "SHA256SUMS"
Record = Mapping[str, Any]
_lock = threading.Lock()
_frozen_heap = False  # set once gc.freeze() ran in this process (see _freeze_start_up)


class DataIntegrityError(RuntimeError):
    """A vendored data file is missing or does not match its recorded checksum."""


def data_root() -> Traversable:
    """The ``suites/data`` folder inside the installed package."""
    return resources.files("pytest_modelbench.suites").joinpath("data")


@lru_cache(maxsize=1)
def manifest() -> dict[str, str]:
    """``relative path -> sha256`` from ``SHA256SUMS``."""
    try:
        text = data_root().joinpath(MANIFEST).read_text(encoding="utf-8")
    except OSError as error:
        raise DataIntegrityError(
            f"pytest_modelbench/suites/data/{MANIFEST} is missing ({error}); "
            "reinstall pytest-modelbench or run scripts/vendor_data.py"
        ) from error
    sums = {}
    for line in text.splitlines():
        digest, _, path = line.partition("  ")
        if digest and path:
            sums[path.strip()] = digest.strip()
    return sums


def _resource(path: str) -> Traversable:
    node = data_root()
    for part in path.split("/"):
        node = node.joinpath(part)
    return node


@cache
def read_verified(path: str) -> bytes:
    """The bytes of ``data/<path>``, after checking them against the manifest."""
    expected = manifest().get(path)
    if expected is None:
        raise DataIntegrityError(f"suites/data/{path} is not listed in {MANIFEST}")
    try:
        data = _resource(path).read_bytes()
    except OSError as error:
        raise DataIntegrityError(f"suites/data/{path} cannot be read: {error}") from error
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise DataIntegrityError(
            f"suites/data/{path}: sha256 {actual} does not match {MANIFEST} ({expected}); "
            "the installed data is damaged: reinstall pytest-modelbench"
        )
    return data


@cache
def _load(path: str) -> Records:
    # split as bytes, each line decoded when it is read: MMLU's text is 16 MB of UCS-2 once
    # decoded whole, and decoding then splitting it took 25 ms of the item's start-up, this 6
    # (b"\n" is only ever a newline in UTF-8, so the lines are the same)
    lines = gzip.decompress(read_verified(path)).split(b"\n")
    return Records([line for line in lines if line])


_decoder = json.JSONDecoder()


def _parse(line: bytes) -> Record:
    # decoded here, strictly, rather than by json.loads (whose bytes decoding lets surrogates pass)
    record: Record = _frozen(json.loads(line.decode("utf-8")))
    return record


class Records(Sequence[Record]):
    """The records of one vendored file (its UTF-8 lines), each parsed on first access and kept
    (its lists as tuples, see :func:`_frozen`); :meth:`column` reads one top-level field of
    every record without parsing the rest, so a suite selects and stratifies before it parses."""

    def __init__(self, lines: Sequence[bytes]) -> None:
        self._lines = lines
        self._parsed: list[Record | None] = [None] * len(lines)
        self._columns: dict[str, tuple[Any, ...]] = {}

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        record = self._parsed[index]  # IndexError past the end, as a tuple's
        if record is None:
            # two threads may parse the same line at once: equal values, either is kept
            record = self._parsed[index] = _parse(self._lines[index])
        return record

    def __iter__(self) -> Iterator[Record]:
        return (self[i] for i in range(len(self)))

    def column(self, key: str) -> tuple[Any, ...]:
        """``record.get(key)`` of every record, in file order (computed once per key)."""
        found = self._columns.get(key)
        if found is None:
            found = self._columns[key] = self._read_column(key)
        return found

    def _read_column(self, key: str) -> tuple[Any, ...]:
        """One pass of :func:`_tail_pattern` over the lines, :meth:`_field` where it fails."""
        marker = json.dumps(key) + ":"
        tail = _tail_pattern(key)
        if tail is None:
            return tuple(self._field(i, key, marker) for i in range(len(self)))
        known: dict[bytes, Any] = dict(_LITERALS)  # each distinct value decoded once
        values = []
        for index, found in enumerate(map(tail.fullmatch, self._lines)):
            if found is None:
                values.append(self._field(index, key, marker))
                continue
            raw = found[1]
            value = known.get(raw, _UNREAD)
            if value is _UNREAD:  # a string without escapes: its bytes between the quotes
                value = known[raw] = raw[1:-1].decode("utf-8")
            values.append(value)
        return tuple(values)

    def _field(self, index: int, key: str, marker: str) -> Any:
        """One line's top-level ``key``, read from the end of the line where it can be (see
        :func:`_top_level`), else from the whole record."""
        parsed = self._parsed[index]
        if parsed is not None:
            return parsed.get(key)
        # json.dumps writes a key's ASCII letters as they are (and escapes the others)
        if marker[:-1].encode("ascii") not in self._lines[index]:
            return None
        value = _top_level(self._lines[index].decode("utf-8"), marker)
        return self[index].get(key) if value is _UNREAD else _frozen(value)


_STRING = rb'"[^"\\\x00-\x1f]*"'  # a JSON string without escapes (json rejects raw controls)
_SCALAR = rb"(?:" + _STRING + rb"|null|true|false)"
_LITERALS: dict[bytes, Any] = {b"null": None, b"true": True, b"false": False}


@lru_cache(maxsize=8)
def _tail_pattern(key: str) -> re.Pattern[bytes] | None:
    """A whole line ending in ``"key":scalar``, then only ``,"name":scalar`` pairs and ``}``
    (group 1: that scalar), for a key of ASCII letters, digits and ``_``; else ``None``.

    Where it matches, :func:`_top_level` reads the same scalar, so one C-level pass per line
    replaces its parsing (MMLU's 14,042 subjects: about 8 ms instead of 21, see
    :meth:`Records._read_column`). Its marker is the last ``"key":`` of the line, the one
    ``rfind`` finds: after it, every quote opens or closes a name or an escape-free string,
    and only a name is followed by ``:``, so a later ``"key":`` would be a later name, whose
    pair matches too and which greedy ``.*`` would have taken. Escapes, numbers, nested
    values and spaces fail the match and are read :func:`_top_level`'s way."""
    if not re.fullmatch(r"\w+", key, re.ASCII):
        return None
    marker = re.escape(json.dumps(key).encode("ascii") + b":")
    pair = rb"," + _STRING + rb":" + _SCALAR
    # the marker right after .*, its "," or "{" looked behind: re backs .* up to each quote in
    # one step then, instead of trying the pattern at every byte (MMLU: 8 ms instead of 12)
    opened = rb"(?<=[,{]" + marker + rb")"
    scalar = rb"(" + _SCALAR + rb")"
    return re.compile(rb".*" + marker + opened + scalar + rb"(?:" + pair + rb")*\}", re.DOTALL)


_UNREAD = object()


def _top_level(line: str, marker: str) -> Any:
    """The value after the last ``marker`` (``"key":``) of a one-line JSON object when that
    key is provably one of the object's own, else :data:`_UNREAD`.

    A quote right after ``,`` or ``{`` cannot be inside a string (a string's quotes are
    escaped), so the marker there opens a key. The key is the outer object's when the
    values after it (its own, then each later ``,"name":value``) end exactly at the line's
    last ``}``: then that brace closes the object holding the key."""
    at = line.rfind(marker)
    if at < 1 or line[at - 1] not in ",{" or not line.endswith("}"):
        return _UNREAD
    try:
        value, end = _decoder.raw_decode(line, at + len(marker))
        while line.startswith(",", end):
            name, end = _decoder.raw_decode(line, end + 1)
            if not isinstance(name, str) or not line.startswith(":", end):
                return _UNREAD
            _, end = _decoder.raw_decode(line, end + 1)
    except json.JSONDecodeError:
        return _UNREAD
    return value if end == len(line) - 1 else _UNREAD


def _frozen(value: Any) -> Any:
    """``value`` with its lists as tuples. A tuple of strings (MMLU's options), then the record
    holding it, is dropped from the garbage collector's lists by its first full pass: MMLU's
    14,042 records otherwise add 28,000 objects to every later one (two in pytest's
    ``unconfigure``, two or three at interpreter exit)."""
    if isinstance(value, dict):
        return {
            key: _frozen(item) if isinstance(item, (dict, list)) else item
            for key, item in value.items()
        }
    if isinstance(value, list):
        return tuple(_frozen(item) if isinstance(item, (dict, list)) else item for item in value)
    return value


def load_jsonl(path: str) -> Records:
    """Records of a vendored ``.jsonl.gz`` file (read once per process, each record parsed on
    first use; do not mutate)."""
    with _lock:  # suites may be built from several runner threads at once
        records = _load(path)
        _freeze_start_up()
        return records


def _freeze_start_up() -> None:
    """Once per process, after the first bundled file is read: collect the young generations,
    then move every object alive (the modules imported so far, the session's plugins, the
    records, all kept until the process ends) to the collector's permanent generation with
    :func:`gc.freeze`.

    Later full collections then walk what the item itself makes, not the ~58,000 objects of
    the start-up: two or three of them per session at 30-50 ms each, and the collections of
    interpreter exit, about 0.15 s more. What it costs: a reference cycle among those objects
    that is dropped later, or was already dead in the oldest generation, is not reclaimed,
    and at exit no finalizer of such a cycle runs (CPython does not promise those); objects
    freed by reference counting are unaffected."""
    global _frozen_heap
    if _frozen_heap:
        return
    _frozen_heap = True
    # Not a full collection: it walked the whole start-up heap (27-40 ms of the item's
    # start-up; generations 0 and 1 take 1-2 ms) to free the cycles already dead in the oldest
    # generation, the same kind of loss as the cycles that die after the freeze. In an mmlu
    # session those were 40 objects, 5 KB (importlib.metadata's caches, no finalizers), and
    # the session's later full collections took as long as after a full one.
    gc.collect(1)
    gc.freeze()


def checksum(*paths: str) -> str:
    """One SHA-256 over the manifest digests of ``paths`` (cheap: no file is read)."""
    sums = manifest()
    missing = [path for path in paths if path not in sums]
    if missing:
        raise DataIntegrityError(f"not listed in {MANIFEST}: {', '.join(missing)}")
    joined = "".join(f"{sums[path]}  {path}\n" for path in sorted(paths))
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()
