"""Any reply is journalled and scored: text from a network may hold lone surrogates, NUL,
bytes that are not UTF-8, tens of megabytes or deeply nested JSON; none of it may end an item
without a score (a journal write that raised ended it "interrupted", on every re-run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_modelbench.store.files import atomic_write_json, read_json
from pytest_modelbench.store.journal import TOO_DEEP, Journal
from tests.conftest import Project, configure
from tests.core.test_client_transport import answer, http, run

# every code point, with the lone surrogates (category Cs) drawn often: left to the first
# strategy, fewer than 1 string in 200 holds one (here most strings do)
ANY_TEXT = st.lists(
    st.characters(codec=None, categories=None) | st.characters(categories=["Cs"])
).map("".join)


def as_json_reads(text: str) -> str:
    """``text`` as any JSON reader reads it back: a high surrogate followed by a low one is
    the character the pair spells (JSON cannot tell the two apart); lone ones stay."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(ANY_TEXT, min_size=1, max_size=4))
def test_every_string_is_written_and_read_back(tmp_path_factory: Any, texts: list[str]) -> None:
    journal = Journal(tmp_path_factory.mktemp("j") / "results.jsonl")
    journal.finished_keys()  # as an item starts: the journal holds the rows it writes
    journal.open()
    for n, text in enumerate(texts):
        journal.append({"example_id": f"e{n}", "completion": text, f"key {text}": n})
    journal.close()
    rows = Journal(journal.path).read()
    read = [as_json_reads(text) for text in texts]
    assert [rows[(f"e{n}", 0)]["completion"] for n in range(len(texts))] == read
    keys = [rows[(f"e{n}", 0)][f"key {text}"] for n, text in enumerate(read)]
    assert keys == list(range(len(texts)))
    assert journal.path.read_bytes().decode("utf-8")  # the file itself is valid UTF-8
    # the held rows (no file read) are the same rows the file gives
    assert [row["completion"] for row in journal.latest()] == read


@settings(max_examples=100, deadline=None)
@given(text=ANY_TEXT)
def test_every_string_survives_a_json_record(tmp_path_factory: Any, text: str) -> None:
    path = tmp_path_factory.mktemp("r") / "summary.json"
    atomic_write_json(path, {"sample": text})
    assert read_json(path) == {"sample": as_json_reads(text)}


def test_deeply_nested_values_are_stored_down_to_a_note(tmp_path: Path) -> None:
    deep: Any = "bottom"
    for _ in range(5000):
        deep = [deep]
    journal = Journal(tmp_path / "results.jsonl")
    journal.open()
    journal.append({"example_id": "e", "detail": {"parsed": deep}, "score": 0.0})
    journal.close()
    (row,) = Journal(journal.path).read().values()
    assert row["score"] == 0.0
    inner = row["detail"]["parsed"]
    depth = 0
    while isinstance(inner, list):
        inner, depth = inner[0], depth + 1
    assert inner == TOO_DEEP and 90 < depth < 110


def test_a_body_that_is_not_utf8_is_read_with_replacement_characters() -> None:
    body = answer("PLACE 4").replace(b"PLACE", b"caf\xe9\xff")
    (completion,), server = run(lambda _seen: http(body), "q")
    assert completion.text == "caf\ufffd\ufffd 4"
    assert len(server.requests) == 1  # read, not retried as malformed


def test_a_fifty_megabyte_reply_is_read(tmp_path: Path) -> None:
    text = "x" * (50 << 20)
    (completion,), _ = run(lambda _seen: http(answer(text)), "q")
    journal = Journal(tmp_path / "results.jsonl")
    journal.open()
    journal.append({"example_id": "e", "completion": completion.text})
    journal.close()
    assert Journal(journal.path).read()[("e", 0)]["completion"] == text


def test_replies_with_lone_surrogates_and_nul_are_scored(project: Project, sim: Any) -> None:
    project.qa("qa", 6)
    lookup = {
        prompt: (f"\ud800\x00 {right}", f"{wrong} \udfff")
        for prompt, (right, wrong) in project.lookup("qa").items()
    }
    server = sim(accuracy=0.5, lookup=lookup, seed=3)
    configure(project, server.base_url, n=6)
    result = project.pytester.runpytest("benchmarks/", "--model", "alpha", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    assert "interrupted" not in result.stdout.str()
    (run_dir,) = project.run_dirs()
    (journal,) = run_dir.rglob("results.jsonl")
    rows = list(Journal(journal).read().values())
    assert len(rows) == 6 and all(row["error"] is None for row in rows)
    assert all("\ud800\x00" in row["completion"] or "\udfff" in row["completion"] for row in rows)
    (summary,) = run_dir.rglob("summary.json")
    data = json.loads(summary.read_text(encoding="utf-8"))
    assert data["n_scored"] == 6 and data["errors"] == 0
    assert "not written" not in result.stdout.str()  # the report and results.parquet too
