"""Vendored records parsed on use: the same records, columns and examples as parsing every line
of the file first, and the start-up heap frozen once per process."""

from __future__ import annotations

import gc
import gzip
import json
from typing import Any

import pytest

from pytest_modelbench.suites import BUILTIN_SUITES, base, vendored
from pytest_modelbench.suites.selection import select_examples
from pytest_modelbench.suites.vendored import Record, Records

DATA_FILES = sorted(path for path in vendored.manifest() if path.endswith(".jsonl.gz"))


def _lines(path: str) -> list[str]:
    text = gzip.decompress(vendored.read_verified(path)).decode("utf-8")
    return [line for line in text.split("\n") if line]


def _eager(path: str) -> tuple[Record, ...]:
    """Every line parsed, as the loader read the files before records were parsed on use."""
    return tuple(vendored._frozen(json.loads(line)) for line in _lines(path))


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
    assert Records([line]).column("subject") == (expected,)


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
    monkeypatch.setattr(vendored.gc, "collect", lambda: calls.append("collect") or 0)
    monkeypatch.setattr(vendored.gc, "freeze", lambda: calls.append("freeze"))
    vendored.load_jsonl("gsm8k/fewshot.jsonl.gz")
    vendored.load_jsonl("math500/fewshot.jsonl.gz")
    assert calls == ["collect", "freeze"]
    assert gc.isenabled()  # collections go on for what is made later
