"""Vendored records parsed on use: the same records, columns and examples as parsing every line
of the file first, and the start-up heap frozen once per process."""

from __future__ import annotations

import gc
import gzip
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_modelbench.suites import BUILTIN_SUITES, base, vendored
from pytest_modelbench.suites.selection import select_examples
from pytest_modelbench.suites.vendored import Record, Records

DATA_FILES = sorted(path for path in vendored.manifest() if path.endswith(".jsonl.gz"))


def _text_lines(path: str) -> list[str]:
    """The file decoded whole, then split, as the loader once read it."""
    text = gzip.decompress(vendored.read_verified(path)).decode("utf-8")
    return [line for line in text.split("\n") if line]


def _lines(path: str) -> list[bytes]:
    return [line.encode("utf-8") for line in _text_lines(path)]


def _eager(path: str) -> tuple[Record, ...]:
    """Every line parsed, as the loader read the files before records were parsed on use."""
    return tuple(vendored._frozen(json.loads(line)) for line in _text_lines(path))


@pytest.mark.parametrize("path", DATA_FILES)
def test_the_loader_splits_the_bytes_into_the_lines_of_the_text(path: str) -> None:
    loaded = vendored._load(path)
    assert list(loaded._lines) == _lines(path)


@pytest.mark.parametrize("path", DATA_FILES)
def test_a_line_the_column_pattern_matches_is_read_as_top_level_reads_it(path: str) -> None:
    eager = _eager(path)
    lines = _lines(path)
    for key in sorted({key for record in eager for key in record}):
        pattern = vendored._tail_pattern(key)
        assert pattern is not None, key  # every key of the vendored files is a plain word
        marker = json.dumps(key) + ":"
        for line in lines:
            found = pattern.fullmatch(line)
            if found is not None:
                fast = json.loads(found[1])
                assert vendored._top_level(line.decode("utf-8"), marker) == fast, (key, line)


def test_mmlu_and_medmcqa_subjects_are_all_read_by_the_pattern() -> None:
    """The fast path is the one taken for the suites' subject column (else it buys nothing)."""
    pattern = vendored._tail_pattern("subject")
    assert pattern is not None
    for path in ("mmlu/test.jsonl.gz", "medmcqa/validation.jsonl.gz"):
        assert all(pattern.fullmatch(line) for line in _lines(path)), path


@pytest.mark.parametrize("path", DATA_FILES)
def test_records_and_columns_equal_the_whole_file_parsed(path: str) -> None:
    eager = _eager(path)
    keys = [*sorted({key for record in eager for key in record}), "no_such_key"]
    unparsed = Records(_lines(path))
    for key in keys:  # read from the lines: no record parsed yet
        assert unparsed.column(key) == tuple(record.get(key) for record in eager), key
    assert list(unparsed) == list(eager)
    assert unparsed[3:7] == list(eager[3:7]) and unparsed[-1] == eager[-1]
    parsed = Records(_lines(path))
    assert list(parsed) == list(eager)
    for key in keys:  # read from the parsed records
        assert parsed.column(key) == tuple(record.get(key) for record in eager), key
    with pytest.raises(IndexError):
        parsed[len(eager)]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"a":"x","subject":"s"}', "s"),
        ('{"subject":"s","topic":"t"}', "s"),  # not the last key
        ('{"subject":"s","topic":{"subject":"t"}}', "s"),  # a nested key of the same name after it
        ('{"meta":{"subject":"t"}}', None),  # only a nested one
        ('{"meta":{"subject":"t"},"z":1}', None),
        ('{"q":"said \\"subject\\":\\"x\\"","subject":"s"}', "s"),  # the marker inside a string
        ('{"q":"\\"subject\\":\\"x\\""}', None),
        ('{"subject":["a","b"]}', ("a", "b")),  # lists become tuples, as in the records
        ('{"subject":{"k":[1,2]}}', {"k": (1, 2)}),
        ('{"subject":null,"z":"}"}', None),
        ('{"subject": "spaced", "z": 1}', "spaced"),  # not json.dumps' compact form: parsed whole
        ('{"x_subject":"no","subject":"yes"}', "yes"),
        ('{"x_subject":"no"}', None),
    ],
)
def test_a_column_reads_only_the_top_level_key(line: str, expected: Any) -> None:
    assert json.loads(line).get("subject") == json.loads(json.dumps(expected))
    assert Records([line.encode("utf-8")]).column("subject") == (expected,)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"subject":"a","x":"b","subject":"c"}', "c"),  # a repeated key: the last, as json's
        ('{"subject":"a","subject":null}', None),
        ('{"subject":"a","subject":1}', 1),  # the last is a number: parsed whole
        ('{"subject":"é","topic":null,"ok":true}', "é"),
        ('{"subject":"a\\"b"}', 'a"b'),  # an escape: parsed whole
        ('{"subject":"a","n":1.5}', "a"),  # a number after it
        ('{"subject":false}', False),
        ('{"subject":"a","x":["subject"]}', "a"),
        ('{"x":{"a":1},"subject":"s"}', "s"),
        ('{"x":"{\\"subject\\":\\"t\\"}"}', None),
        ('{"sub":"a","x":"subject","subject":"b"}', "b"),
        ('{"x":"\\"subject\\":\\"t\\""}', None),  # the marker, escaped, in a string
        ('{"subject":"s"} ', "s"),  # trailing space: parsed whole
    ],
)
def test_a_column_read_by_the_pattern_is_the_parsed_value(line: str, expected: Any) -> None:
    assert json.loads(line).get("subject") == expected
    assert Records([line.encode("utf-8")]).column("subject") == (expected,)


NOISE = ['"subject":', '"s":', '"s"', '"x":', '"a"', "{", "}", ",", ":", '"', "\\", '\\"', "a"]
NOISE += ["null", "1", " ", "\t", "é", "[", "]"]
SCALAR_TEXT = ['"a"', '""', '"é"', '"s"', '"subject"', "null", "true", "false", "1"]
SCALAR_TEXT += ['"\\""', '"\\\\"', '"\\u00e9"', '"a\tb"']  # escapes, a raw tab
NAMES = ['"subject"', '"s"', '"x"', '"sub"']
PAIRS = st.tuples(st.sampled_from(NAMES), st.sampled_from(SCALAR_TEXT)).map(
    lambda p: f",{p[0]}:{p[1]}"
)
ENDINGS = st.tuples(
    st.sampled_from([",", "{"]),
    st.sampled_from(['"subject":', '"s":']),
    st.sampled_from(SCALAR_TEXT),
    st.lists(PAIRS, max_size=3).map("".join),
    st.sampled_from(["}", "}", "}", " }", "}}", ""]),
).map("".join)
LINES = st.tuples(st.lists(st.sampled_from(NOISE), max_size=8).map("".join), ENDINGS).map("".join)


@given(LINES, st.sampled_from(["subject", "s"]))
def test_the_pattern_matches_only_where_top_level_reads_the_same(line: str, key: str) -> None:
    """Any text, JSON or not: where the pattern matches, :func:`_top_level` reads the value
    that the column holds (which is then not parsed, and may not be JSON)."""
    pattern = vendored._tail_pattern(key)
    assert pattern is not None
    if pattern.fullmatch(line.encode("utf-8")):
        at_end = vendored._top_level(line, json.dumps(key) + ":")
        assert at_end is not vendored._UNREAD
        assert Records([line.encode("utf-8")]).column(key) == (at_end,)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=4)
OBJECTS = st.dictionaries(st.sampled_from(["subject", "s", "topic", "x", "a b"]), VALUES)


@given(OBJECTS, st.booleans(), st.booleans())
def test_a_column_of_any_object_is_its_top_level_value(
    record: dict[str, Any], compact: bool, ascii_only: bool
) -> None:
    separators = (",", ":") if compact else (", ", ": ")
    line = json.dumps(record, separators=separators, ensure_ascii=ascii_only)
    records = Records([line.encode("utf-8")])
    for key in ["subject", "s", "topic", "x", "a b", "missing"]:
        assert records.column(key) == (vendored._frozen(record.get(key)),), (key, line)


@pytest.mark.parametrize("name", ["mmlu", "mmlu-medical", "medmcqa", "medqa"])
@pytest.mark.parametrize(
    "args",
    [
        {},
        {"num_fewshot": 3},
        {"shuffle_answers": True, "shuffle_seed": 7},
        {"subjects": ["anatomy", "virology"]},
        {"subjects": ["Anatomy", "Surgery"]},
    ],
)
def test_examples_are_those_of_records_parsed_first(
    name: str, args: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = BUILTIN_SUITES[name]()
    try:
        on_use = list(select_examples(suite.examples(args, 3), 700))
    except ValueError:  # subjects another suite does not have: refused the same way below
        on_use = None

    def parsed_first(path: str) -> Records:
        records = Records(_lines(path))
        list(records)  # every record parsed before any column is read
        return records

    monkeypatch.setattr(base, "load_jsonl", parsed_first)
    fresh = BUILTIN_SUITES[name]()
    if on_use is None:
        with pytest.raises(ValueError):
            fresh.examples(args, 3)
        return
    assert list(select_examples(fresh.examples(args, 3), 700)) == on_use
    assert fresh.selected(fresh.parse_args(args)) == suite.selected(suite.parse_args(args))


def test_the_start_up_heap_is_frozen_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(vendored, "_frozen_heap", False)
    monkeypatch.setattr(vendored.gc, "collect", lambda gen=2: calls.append(f"collect {gen}") or 0)
    monkeypatch.setattr(vendored.gc, "freeze", lambda: calls.append("freeze"))
    vendored.load_jsonl("gsm8k/fewshot.jsonl.gz")
    vendored.load_jsonl("math500/fewshot.jsonl.gz")
    assert calls == ["collect 1", "freeze"]  # the young generations only (see _freeze_start_up)
    assert gc.isenabled()  # collections go on for what is made later
